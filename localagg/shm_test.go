package localagg

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/node"
	"golang.org/x/sys/unix"
)

// A test binary run with memberEnv set is a member process of a group
// (the real-process tests below).
const memberEnv = "LOCALAGG_TEST_MEMBER"

func TestMain(m *testing.M) {
	if v := os.Getenv(memberEnv); v != "" {
		if err := memberMain(v); err != nil {
			fmt.Fprintln(os.Stderr, "member:", err)
			os.Exit(3)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// The sums the real-process tests make: parts partitions of elems float32
// per iteration, depth iterations in the segment at once.
const (
	parts = 3
	elems = 1024
	depth = 2
	job   = 0x5eed
	dig   = 42
)

func testLayout(members int) Layout {
	return Layout{Members: members, Slots: parts * depth, SlotBytes: 4 * elems}
}

// value is what worker w contributes to element e of partition p in
// iteration it: small integers, so that every sum is exact.
func value(w, it, p, e int) float32 { return float32((w+1)*(it+1) + (p*31+e)%7) }

// want is element e's sum over every worker of the job.
func want(workers []int, it, p, e int) float32 {
	var s float32
	for _, w := range workers {
		s += value(w, it, p, e)
	}
	return s
}

func where(it, p int) (slot int, seq uint32) { return (it%depth)*parts + p, uint32(it/depth + 1) }

// member is one worker's side of the protocol over a segment: write each
// contribution once its slot's previous result was read, read each result
// in order and check it.
type member struct {
	seg          *Segment
	idx, worker  int
	all          []int // the job's workers, for the expected sums
	iters        int
	next, readTo int // contributions written, results read (k = it*parts+p)
}

// step makes what progress it can without waiting; done once every result
// was read.
func (m *member) step() (done bool, err error) {
	total := m.iters * parts
	for m.readTo < m.next {
		it, p := m.readTo/parts, m.readTo%parts
		i, seq := where(it, p)
		if !m.seg.Published(i, seq) {
			break
		}
		sum := m.seg.HostSum(i)
		for e := 0; e < elems; e++ {
			got := math.Float32frombits(binary.LittleEndian.Uint32(sum[4*e:]))
			if w := want(m.all, it, p, e); got != w {
				return false, fmt.Errorf("worker %d: iteration %d part %d element %d: sum %v, want %v", m.worker, it, p, e, got, w)
			}
		}
		m.seg.Read(m.idx, i, seq)
		m.readTo++
	}
	for m.next < total && m.next-m.readTo < parts*depth {
		it, p := m.next/parts, m.next%parts
		i, seq := where(it, p)
		c := m.seg.Contribution(m.idx, i)
		for e := 0; e < elems; e++ {
			binary.LittleEndian.PutUint32(c[4*e:], math.Float32bits(value(m.worker, it, p, e)))
		}
		m.seg.Written(m.idx, i, seq)
		m.next++
	}
	return m.readTo == total, nil
}

// memberMain runs a member process: "dir name index members worker iters
// workers,...".
func memberMain(arg string) error {
	f := strings.Fields(arg)
	if len(f) != 7 {
		return fmt.Errorf("bad %s %q", memberEnv, arg)
	}
	n := func(s string) int { v, _ := strconv.Atoi(s); return v }
	var all []int
	for _, w := range strings.Split(f[6], ",") {
		all = append(all, n(w))
	}
	seg, err := Open(f[0], f[1], job, dig, testLayout(n(f[3])))
	if err != nil {
		return err
	}
	defer seg.Close()
	m := &member{seg: seg, idx: n(f[2]), worker: n(f[4]), all: all, iters: n(f[5])}
	deadline := time.Now().Add(30 * time.Second) // a hang guard, not a speed check
	for time.Now().Before(deadline) {
		done, err := m.step()
		if err != nil || done {
			return err
		}
		time.Sleep(20 * time.Microsecond)
	}
	return errors.New("timed out")
}

// network stands for the partitions' aggregators: it adds the hosts' sums
// and answers each host once every worker of the job is counted.
type network struct {
	mu      sync.Mutex
	workers int
	sums    map[Slot][]float32
	counts  map[Slot]int
	sends   int // host sums received: the wire's pushes
}

func (n *network) push(s Slot, b []byte, count int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.sends++
	acc := n.sums[s]
	if acc == nil {
		acc = make([]float32, elems)
		n.sums[s] = acc
	}
	for e := range acc {
		acc[e] += math.Float32frombits(binary.LittleEndian.Uint32(b[4*e:]))
	}
	n.counts[s] += count
}

func (n *network) result(s Slot, into []byte) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.counts[s] != n.workers {
		return false
	}
	for e, v := range n.sums[s] {
		binary.LittleEndian.PutUint32(into[4*e:], math.Float32bits(v))
	}
	return true
}

// runGroup leads one host's group: workers[0] in this process, the others
// as member processes; it returns once every member read every result.
func runGroup(t *testing.T, dir string, workers, all []int, iters int, net *network) error {
	host := fmt.Sprintf("host%d", workers[0])
	name := Name(job, host)
	ids := make([]node.ID, len(workers))
	for i, w := range workers {
		ids[i] = node.WorkerID(w)
	}
	core, err := NewCore(ids, depth, LossFail)
	if err != nil {
		return err
	}
	seg, _, err := Create(dir, name, job, dig, testLayout(len(workers)))
	if err != nil {
		return err
	}
	defer seg.Close()
	var procs []*exec.Cmd
	var allS []string
	for _, w := range all {
		allS = append(allS, strconv.Itoa(w))
	}
	for i := 1; i < len(workers); i++ {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %s %d %d %d %d %s", memberEnv, dir, name, i, len(workers), workers[i], iters, strings.Join(allS, ",")))
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			return err
		}
		procs = append(procs, cmd)
	}
	for _, id := range ids {
		if err := core.Declared(id, dig); err != nil {
			return err
		}
	}
	self := &member{seg: seg, idx: 0, worker: workers[0], all: all, iters: iters}
	total := iters * parts
	arrived := make([]int, len(workers))
	read := make([]int, len(workers))
	var sent []Slot
	apply := func(eff Effects) error {
		for _, s := range eff.Sums {
			i, _ := where(int(s.Slot.Iter), s.Slot.Part)
			if err := seg.Sum(frame.Float32, indexOf(ids, s.From), i, 4*elems, s.First); err != nil {
				return err
			}
		}
		for _, s := range eff.Sends {
			i, _ := where(int(s.Slot.Iter), s.Slot.Part)
			net.push(s.Slot, seg.HostSum(i), s.Count)
			sent = append(sent, s.Slot)
		}
		return nil
	}
	deadline := time.Now().Add(30 * time.Second) // a hang guard, not a speed check
	for {
		if time.Now().After(deadline) {
			return errors.New("timed out")
		}
		if _, err := self.step(); err != nil {
			return err
		}
		for m := range workers {
			for arrived[m] < total {
				it, p := arrived[m]/parts, arrived[m]%parts
				i, seq := where(it, p)
				if !seg.IsWritten(m, i, seq) {
					break
				}
				eff, err := core.Arrived(ids[m], Slot{Key: 1, Part: p, Iter: uint64(it)})
				if errors.Is(err, ErrWindow) {
					break
				}
				if err != nil {
					return err
				}
				if err := apply(eff); err != nil {
					return err
				}
				arrived[m]++
			}
		}
		for len(sent) > 0 {
			s := sent[0]
			i, seq := where(int(s.Iter), s.Part)
			if !net.result(s, seg.HostSum(i)) {
				break
			}
			eff, err := core.ResultIn(s)
			if err != nil {
				return err
			}
			for range eff.Publish {
				seg.Publish(i, seq)
			}
			sent = sent[1:]
		}
		finished := true
		for m := range workers {
			for read[m] < total {
				it, p := read[m]/parts, read[m]%parts
				i, seq := where(it, p)
				if !seg.HasRead(m, i, seq) {
					break
				}
				if _, err := core.Read(ids[m], Slot{Key: 1, Part: p, Iter: uint64(it)}); err != nil {
					return err
				}
				read[m]++
			}
			finished = finished && read[m] == total
		}
		if finished {
			break
		}
		time.Sleep(20 * time.Microsecond)
	}
	for _, p := range procs {
		if err := p.Wait(); err != nil {
			return fmt.Errorf("member: %w", err)
		}
	}
	if core.Held() != 0 {
		return fmt.Errorf("%d slots held after the last read", core.Held())
	}
	return nil
}

func indexOf(ids []node.ID, id node.ID) int {
	for i, x := range ids {
		if x == id {
			return i
		}
	}
	return -1
}

// TestRealProcesses: groups of member processes sum through their
// segments, each host sends one sum per partition, and every worker reads
// the exact sum of the job's contributions; nothing is left in the
// directory after.
func TestRealProcesses(t *testing.T) {
	tests := []struct {
		name  string
		hosts [][]int // workers per host
	}{
		{"one worker", [][]int{{0}}},
		{"two workers", [][]int{{0, 1}}},
		{"three workers", [][]int{{0, 1, 2}}},
		{"uneven 3,1", [][]int{{0, 1, 2}, {3}}},
		{"uneven 2,3", [][]int{{0, 4}, {1, 2, 3}}},
	}
	const iters = 12
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			var all []int
			for _, h := range tt.hosts {
				all = append(all, h...)
			}
			net := &network{workers: len(all), sums: map[Slot][]float32{}, counts: map[Slot]int{}}
			errs := make(chan error, len(tt.hosts))
			for _, h := range tt.hosts {
				go func() { errs <- runGroup(t, dir, h, all, iters, net) }()
			}
			for range tt.hosts {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			if want := len(tt.hosts) * iters * parts; net.sends != want {
				t.Errorf("%d sums crossed the network, want one per host and partition: %d", net.sends, want)
			}
			if left, _ := os.ReadDir(dir); len(left) != 0 {
				t.Errorf("left behind: %v", left)
			}
		})
	}
}

func TestSegmentRefuses(t *testing.T) {
	dir := t.TempDir()
	l := testLayout(2)
	seg, stale, err := Create(dir, Name(job, "h"), job, dig, l)
	if err != nil || stale {
		t.Fatalf("Create: %v (stale %v)", err, stale)
	}
	defer seg.Close()
	if _, _, err := Create(dir, Name(job, "h"), job, dig, l); !errors.Is(err, ErrInUse) {
		t.Errorf("second Create of a live segment: %v, want ErrInUse", err)
	}
	if _, err := Open(dir, Name(job, "h"), job, dig+1, l); !errors.Is(err, ErrDisagree) {
		t.Errorf("Open with other declarations: %v, want ErrDisagree", err)
	}
	if _, err := Open(dir, Name(job, "h"), job+1, dig, l); err == nil {
		t.Error("Open as another job: no error")
	}
	if _, err := Open(dir, Name(job, "h"), job, dig, testLayout(3)); err == nil {
		t.Error("Open with another layout: no error")
	}
	if _, _, err := Create(filepath.Join(dir, "missing"), "x", job, dig, l); err == nil {
		t.Error("Create in a missing directory: no error")
	}
	if _, _, err := Create(dir, "odd", job, dig, Layout{Members: 1, Slots: 1, SlotBytes: 100}); err == nil {
		t.Error("Create with an unaligned slot: no error")
	}
	if err := seg.Sum(frame.Float32, 0, 0, l.SlotBytes+4, false); err == nil {
		t.Error("Sum beyond the slot: no error")
	}
	if err := seg.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(seg.Path()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("segment left after Close: %v", err)
	}
}

// TestStaleSegment: a segment whose creator was killed is removed by the
// next Create (which says so) and by Sweep; a live one is not.
func TestStaleSegment(t *testing.T) {
	dir := t.TempDir()
	l := testLayout(1)
	// A killed job's segment: its creator's pid no longer runs.
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skip("no true:", err)
	}
	dead := cmd.Process.Pid
	forge := func(name string) {
		seg, _, err := Create(dir, name, job, dig, l)
		if err != nil {
			t.Fatal(err)
		}
		binary.LittleEndian.PutUint32(seg.mem[8:], uint32(dead))
		seg.owner = false // as if killed: Close does not remove it
		seg.Close()
	}
	forge(Name(job, "a"))
	forge(Name(job, "b"))
	live, _, err := Create(dir, Name(job, "live"), job, dig, l)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	seg, stale, err := Create(dir, Name(job, "a"), job, dig, l)
	if err != nil || !stale {
		t.Fatalf("Create over a stale segment: %v, stale %v; want it replaced", err, stale)
	}
	seg.Close()
	gone, err := Sweep(dir)
	if err != nil || len(gone) != 1 || gone[0] != Name(job, "b") {
		t.Fatalf("Sweep removed %v (%v), want only %s", gone, err, Name(job, "b"))
	}
	if _, err := os.Stat(live.Path()); err != nil {
		t.Errorf("Sweep removed a live segment: %v", err)
	}
}

// TestShmFull: a segment that does not fit its file system is an error
// at Create, not a SIGBUS later, and leaves no file. Needs root (a small
// tmpfs).
func TestShmFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a small tmpfs")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64k"); err != nil {
		t.Skip("mount tmpfs:", err)
	}
	defer unix.Unmount(dir, 0)
	_, _, err := Create(dir, Name(job, "h"), job, dig, Layout{Members: 4, Slots: 8, SlotBytes: 1 << 20})
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Create on a full file system: %v, want ENOSPC", err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
}

// TestCheck: a directory that cannot hold a group's segment (missing, not
// a directory, full) fails Check, which leaves nothing behind where it can.
func TestCheck(t *testing.T) {
	l := GroupLayout(2, 1<<16)
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		dir  string
		ok   bool
	}{
		{"a directory", dir, true},
		{"missing", filepath.Join(dir, "missing"), false},
		{"not a directory", file, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if err := Check(tt.dir, l); (err == nil) != tt.ok {
				t.Fatalf("Check(%s) = %v, want ok %v", tt.dir, err, tt.ok)
			}
		})
	}
	if left, _ := filepath.Glob(filepath.Join(dir, Prefix+"*")); len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
	if os.Geteuid() != 0 {
		return
	}
	full := t.TempDir()
	if err := unix.Mount("tmpfs", full, "tmpfs", 0, "size=64k"); err != nil {
		return
	}
	defer unix.Unmount(full, 0)
	if err := Check(full, l); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("Check on a full file system: %v, want ENOSPC", err)
	}
}
