package localagg

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/reduce"
	"golang.org/x/sys/unix"
)

// DefaultDir is where segments live: Linux's shared-memory file system.
const DefaultDir = "/dev/shm"

// Prefix begins every segment's name, so that Sweep finds them.
const Prefix = "fpt-lagg-"

const (
	magic     = "FPTLAGG1"
	headerLen = 64
	// align keeps every area on a cache line, and the reduce kernels'
	// typed views aligned.
	align = 64
)

// Layout is what a segment holds: for each of Slots slots (partitions in
// flight), one contribution area per member and one host-sum area, which
// the result overwrites; SlotBytes each. Flags, per slot: the sequence
// number of the last result published, and per member those of its last
// contribution written and of the last result it read.
type Layout struct {
	Members   int
	Slots     int
	SlotBytes int
}

func (l Layout) valid() bool {
	return l.Members > 0 && l.Slots > 0 && l.SlotBytes > 0 && l.SlotBytes%align == 0 &&
		uint64(l.Members+1)*uint64(l.Slots)*uint64(l.SlotBytes) < 1<<44
}

func (l Layout) flagsPerSlot() int { return 1 + 2*l.Members }
func (l Layout) flagsLen() int     { return roundUp(4 * l.flagsPerSlot() * l.Slots) }
func (l Layout) size() int {
	return headerLen + l.flagsLen() + (l.Members+1)*l.Slots*l.SlotBytes
}

func roundUp(n int) int { return (n + align - 1) / align * align }

// Segment is a local group's shared memory, mapped into this process.
type Segment struct {
	path   string
	layout Layout
	mem    []byte
	owner  bool // made it: Close removes it
}

// Name is the segment name of host's group in job (the scheduler's
// stamp): one per job and host, so two jobs on one host never share one.
func Name(job uint64, host string) string {
	var b strings.Builder
	for _, r := range host {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return Prefix + strconv.FormatUint(job, 16) + "-" + b.String()
}

// Chunks is how many partitions each member of a group may have in the
// segment at once, and how many results the leader may have there: the
// slots of a group's layout.
const Chunks = 16

// GroupLayout is the layout of a group of members whose partitions are
// at most partitionBytes.
func GroupLayout(members int, partitionBytes uint64) Layout {
	return Layout{Members: members, Slots: Chunks, SlotBytes: int((partitionBytes + align - 1) / align * align)}
}

// Check reports whether dir can hold a segment of layout l: it makes one
// under a name of its own (this process's pid and a random number: the
// workers of one process, in tests, check at once), reserving its memory,
// and removes it. A worker whose check fails sums alone, over the network
// (NoSharedMemory), rather than failing the job at its group's start.
func Check(dir string, l Layout) error {
	seg, _, err := Create(dir, Prefix+"check-"+strconv.Itoa(os.Getpid())+"-"+strconv.FormatUint(rand.Uint64(), 16), 0, 0, l)
	if err != nil {
		return err
	}
	return seg.Close()
}

// ErrInUse is Create's error for a segment a live process made: another
// job (or this one, started twice) is using it.
var ErrInUse = errors.New("shared-memory segment in use")

// Create makes the segment name in dir for the group's leader, reserving
// its memory (a full or missing dir is an error here, not a SIGBUS on
// first touch). A segment of that name left by a process that is gone (a
// killed job) is removed first, and stale says so, for the caller to log.
// The caller falls back to the network path on an error.
func Create(dir, name string, job, digest uint64, l Layout) (seg *Segment, stale bool, err error) {
	if !l.valid() {
		return nil, false, fmt.Errorf("localagg: segment layout %+v: want members, slots and a slot size that is a multiple of %d", l, align)
	}
	path := filepath.Join(dir, name)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		pid, alive := creator(path)
		if alive {
			return nil, false, fmt.Errorf("localagg: %s: %w by pid %d", path, ErrInUse, pid)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, false, fmt.Errorf("localagg: remove stale segment: %w", err)
		}
		stale = true
		f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	}
	if err != nil {
		return nil, stale, fmt.Errorf("localagg: create segment: %w", err)
	}
	defer f.Close()
	fail := func(what string, err error) (*Segment, bool, error) {
		os.Remove(path)
		return nil, stale, fmt.Errorf("localagg: %s %s (%d bytes): %w", what, path, l.size(), err)
	}
	if err := syscall.Fallocate(int(f.Fd()), 0, 0, int64(l.size())); err != nil {
		return fail("reserve", err)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, l.size(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail("map", err)
	}
	h := mem[:headerLen]
	binary.LittleEndian.PutUint32(h[8:], uint32(os.Getpid()))
	binary.LittleEndian.PutUint64(h[16:], job)
	binary.LittleEndian.PutUint64(h[24:], digest)
	binary.LittleEndian.PutUint32(h[32:], uint32(l.Members))
	binary.LittleEndian.PutUint32(h[36:], uint32(l.Slots))
	binary.LittleEndian.PutUint64(h[40:], uint64(l.SlotBytes))
	// The magic last: a member that opens the segment before sees none.
	copy(h, magic)
	return &Segment{path: path, layout: l, mem: mem, owner: true}, stale, nil
}

// Open maps the segment name in dir for a member. A segment of another
// layout or digest (members that disagree on the declared tensors) is an
// error: no sum is made from it.
func Open(dir, name string, job, digest uint64, l Layout) (*Segment, error) {
	path := filepath.Join(dir, name)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("localagg: open segment: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("localagg: open segment: %w", err)
	}
	if !l.valid() || st.Size() != int64(l.size()) {
		return nil, fmt.Errorf("localagg: segment %s has %d bytes, layout %+v wants %d", path, st.Size(), l, l.size())
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, l.size(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("localagg: map %s: %w", path, err)
	}
	h := mem[:headerLen]
	switch {
	case string(h[:8]) != magic:
		err = errors.New("not initialised")
	case binary.LittleEndian.Uint64(h[16:]) != job:
		err = fmt.Errorf("of job %x, not %x", binary.LittleEndian.Uint64(h[16:]), job)
	case binary.LittleEndian.Uint64(h[24:]) != digest:
		err = fmt.Errorf("declared tensors %x, this worker's %x: %w", binary.LittleEndian.Uint64(h[24:]), digest, ErrDisagree)
	case int(binary.LittleEndian.Uint32(h[32:])) != l.Members || int(binary.LittleEndian.Uint32(h[36:])) != l.Slots ||
		int(binary.LittleEndian.Uint64(h[40:])) != l.SlotBytes:
		err = errors.New("of another layout")
	}
	if err != nil {
		unix.Munmap(mem)
		return nil, fmt.Errorf("localagg: segment %s: %w", path, err)
	}
	return &Segment{path: path, layout: l, mem: mem}, nil
}

// creator reads the pid in a segment's header and whether that process
// lives. A header too short to name one counts as live (its creator may
// be writing it): refusing is safe, removing a live one is not.
func creator(path string) (pid int, alive bool) {
	b, err := os.ReadFile(path)
	if err != nil || len(b) < headerLen {
		return 0, err == nil
	}
	pid = int(binary.LittleEndian.Uint32(b[8:]))
	return pid, pid > 0 && processAlive(pid)
}

func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// Sweep removes the segments in dir whose creators are gone (jobs killed
// before they could remove theirs) and returns their names.
func Sweep(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("localagg: sweep %s: %w", dir, err)
	}
	var gone []string
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), Prefix) {
			continue
		}
		p := filepath.Join(dir, e.Name())
		if pid, alive := creator(p); !alive && pid > 0 {
			if err := os.Remove(p); err == nil {
				gone = append(gone, e.Name())
			}
		}
	}
	return gone, nil
}

// Path is the segment's file.
func (s *Segment) Path() string { return s.path }

// Close unmaps the segment; the leader's Close removes it too, so a clean
// exit leaves nothing in dir.
func (s *Segment) Close() error {
	if s.mem == nil {
		return nil
	}
	err := unix.Munmap(s.mem)
	s.mem = nil
	if s.owner {
		if rerr := os.Remove(s.path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) && err == nil {
			err = rerr
		}
	}
	if err != nil {
		return fmt.Errorf("localagg: close %s: %w", s.path, err)
	}
	return nil
}

func (s *Segment) area(i int) []byte {
	off := headerLen + s.layout.flagsLen() + i*s.layout.SlotBytes
	return s.mem[off : off+s.layout.SlotBytes : off+s.layout.SlotBytes]
}

// Contribution is member index m's area of slot i (m from 0 to Members-1).
func (s *Segment) Contribution(m, i int) []byte { return s.area(i*(s.layout.Members+1) + 1 + m) }

// HostSum is slot i's host-sum area; the result overwrites it.
func (s *Segment) HostSum(i int) []byte { return s.area(i * (s.layout.Members + 1)) }

func (s *Segment) flag(j int) *uint32 {
	return (*uint32)(unsafe.Pointer(&s.mem[headerLen+4*j]))
}

// Written publishes member m's contribution to slot i under sequence
// number seq (non-zero; the shell numbers the slot's uses), once its bytes
// are in Contribution(m, i).
func (s *Segment) Written(m, i int, seq uint32) {
	atomic.StoreUint32(s.flag(i*s.layout.flagsPerSlot()+1+m), seq)
}

// IsWritten reports whether member m's contribution seq to slot i is in.
func (s *Segment) IsWritten(m, i int, seq uint32) bool {
	return atomic.LoadUint32(s.flag(i*s.layout.flagsPerSlot()+1+m)) == seq
}

// Publish marks slot i's result, in HostSum(i), as that of use seq.
func (s *Segment) Publish(i int, seq uint32) {
	atomic.StoreUint32(s.flag(i*s.layout.flagsPerSlot()), seq)
}

// Published reports whether slot i holds use seq's result.
func (s *Segment) Published(i int, seq uint32) bool {
	return atomic.LoadUint32(s.flag(i*s.layout.flagsPerSlot())) == seq
}

// Read marks that member m copied out slot i's result of use seq.
func (s *Segment) Read(m, i int, seq uint32) {
	atomic.StoreUint32(s.flag(i*s.layout.flagsPerSlot()+1+s.layout.Members+m), seq)
}

// HasRead reports whether member m copied out slot i's result of use seq.
func (s *Segment) HasRead(m, i int, seq uint32) bool {
	return atomic.LoadUint32(s.flag(i*s.layout.flagsPerSlot()+1+s.layout.Members+m)) == seq
}

// Sum carries out one of the Core's sums: member m's contribution to slot
// i, n bytes of dtype dt, copied into the host sum if first, else added
// with the reduce kernels.
func (s *Segment) Sum(dt frame.DType, m, i, n int, first bool) error {
	if n < 0 || n > s.layout.SlotBytes {
		return fmt.Errorf("localagg: %d bytes do not fit a %d-byte slot", n, s.layout.SlotBytes)
	}
	dst, src := s.HostSum(i)[:n], s.Contribution(m, i)[:n]
	if first {
		copy(dst, src)
		return nil
	}
	if err := reduce.Add(dt, dst, src); err != nil {
		return fmt.Errorf("localagg: %w", err)
	}
	return nil
}
