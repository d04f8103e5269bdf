package worker

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/localagg"
	"github.com/fptps/fpt/node"
)

// shellGroup is a group's workers' sides, run in one process over a real
// segment (in a test directory) and real notice sockets.
type shellGroup struct {
	l    []*localAgg
	mu   sync.Mutex
	sent []frame.Header // frames any of them sent over the van
	// added are the host sums each worker's aggregator was given, and
	// whether each came in a buffer the aggregator handed out (no copy).
	added   [][]frame.Header
	data    [][][]byte
	adopted [][]bool
	handed  map[*byte]bool // the aggregators' buffers handed out
	fails   []error
}

// shellAgg is worker i's aggregator in a shellGroup: it records what
// it is given.
type shellAgg struct {
	g *shellGroup
	i int
}

func (a shellAgg) AddLocal(h *frame.Header, data []byte) error {
	return a.HandlePush(h, data, false)
}

func (a shellAgg) PayloadBuffer(h *frame.Header) []byte {
	b := make([]byte, h.Length)
	a.g.mu.Lock()
	defer a.g.mu.Unlock()
	a.g.handed[&b[0]] = true
	return b
}

func (a shellAgg) HandlePush(h *frame.Header, payload []byte, inPlace bool) error {
	a.g.mu.Lock()
	defer a.g.mu.Unlock()
	a.g.added[a.i] = append(a.g.added[a.i], *h)
	a.g.data[a.i] = append(a.g.data[a.i], bytes.Clone(payload))
	a.g.adopted[a.i] = append(a.g.adopted[a.i], inPlace && a.g.handed[&payload[0]])
	return nil
}

// newShellGroup starts the sides of a group of n workers (ranks 0 to
// n-1, the first leading) whose partitions are at most partBytes.
func newShellGroup(t *testing.T, n int, partBytes uint64) *shellGroup {
	t.Helper()
	g := &shellGroup{added: make([][]frame.Header, n), data: make([][][]byte, n), adopted: make([][]bool, n), handed: map[*byte]bool{}}
	var workers []node.ID
	for i := range n {
		workers = append(workers, node.WorkerID(i))
	}
	dir, job := t.TempDir(), uint64(time.Now().UnixNano())
	name := localagg.Name(job, "a")
	layout := localagg.GroupLayout(n, partBytes)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := &config.Config{WorkerLoss: config.WorkerLossContinue}
	for i := range n {
		l := &localAgg{log: log, self: workers[i], group: localagg.Group{Host: "a", Workers: workers}, idx: i,
			survives: cfg.Survives, dropped: map[node.ID]bool{}, until: math.MaxUint64, elastic: true}
		l.initConds()
		l.fail = func(err error) {
			g.mu.Lock()
			defer g.mu.Unlock()
			g.fails = append(g.fails, err)
		}
		l.send = func(m *frame.Message) error {
			g.mu.Lock()
			g.sent = append(g.sent, m.Header)
			g.mu.Unlock()
			if m.Done != nil {
				m.Done(nil)
			}
			return nil
		}
		l.agg = shellAgg{g: g, i: i}
		for _, w := range workers {
			l.addrs = append(l.addrs, &net.UnixAddr{Name: fmt.Sprintf("@%s-%d-%s", name, os.Getpid(), w), Net: "unixgram"})
		}
		var err error
		if l.conn, err = net.ListenUnixgram("unixgram", l.addrs[i]); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			if l.seg, _, err = localagg.Create(dir, name, job, 0, layout); err != nil {
				t.Fatal(err)
			}
			core := declaredCore(t, workers)
			l.core, l.first, l.sums, l.readers = core, map[localagg.Slot]frame.Header{}, map[localagg.Slot][]byte{}, map[int]readers{}
		} else if l.seg, err = localagg.Open(dir, name, job, 0, layout); err != nil {
			t.Fatal(err)
		}
		for c := range localChunks {
			l.free = append(l.free, c)
		}
		l.socks.Add(2)
		go l.writer()
		go l.loop()
		g.l = append(g.l, l)
	}
	t.Cleanup(func() {
		for i := len(g.l) - 1; i >= 0; i-- {
			g.l[i].close()
		}
	})
	return g
}

// push is worker i's push of partition part of key 7, iteration 3, for
// aggregator to: values float32 i+1.
func (g *shellGroup) push(t *testing.T, i, part int, to node.ID) {
	t.Helper()
	data := make([]byte, 64)
	for j := 0; j < len(data); j += 4 {
		copy(data[j:], float32Bytes(float32(i+1)))
	}
	h := frame.Header{Type: frame.Push, DType: frame.Float32, Sender: uint32(g.l[i].self), Recipient: uint32(to),
		Key: 7, Iteration: 3, Partition: uint32(part), Offset: uint64(part * len(data)), Total: uint64(4 * len(data)), Length: uint64(len(data))}
	rest, err := g.l[i].intercept([]frame.Message{{Header: h, Payload: data}})
	if err != nil || len(rest) != 0 {
		t.Fatalf("worker %d's push: left %d frames, %v", i, len(rest), err)
	}
}

// settle waits, for 30 s at most, until done holds or a side failed,
// which fails the test. It returns with g.mu held. done takes the locks
// it needs: a leader holds its side's lock while it takes g.mu (its
// aggregator's PayloadBuffer).
func (g *shellGroup) settle(t *testing.T, done func() bool) {
	t.Helper()
	failed := func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(g.fails) > 0
	}
	for deadline := time.Now().Add(30 * time.Second); !failed() && !done() && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	g.mu.Lock()
	if len(g.fails) > 0 {
		g.mu.Unlock()
		t.Fatalf("failed: %v", g.fails)
	}
}

func float32Bytes(f float32) []byte {
	return binary.LittleEndian.AppendUint32(nil, math.Float32bits(f))
}

// TestLocalHostSumToMember: the host sum of a partition a member of the
// group aggregates reaches that member's aggregator through the segment,
// exact, flagged and from the leader, and never crosses the van (loopback
// TCP); the leader's result chunk it used is free again after. A
// partition aggregated elsewhere still goes over the van.
func TestLocalHostSumToMember(t *testing.T) {
	const n = 3
	g := newShellGroup(t, n, 64)
	server := node.ServerID(0)
	// Partition 0 is member 2's to aggregate, 1 member 1's, 2 the server's.
	to := []node.ID{g.l[2].self, g.l[1].self, server}
	for part := range to {
		for i := n - 1; i >= 0; i-- {
			g.push(t, i, part, to[part])
		}
	}
	g.settle(t, func() bool {
		g.mu.Lock()
		sums := len(g.added[1]) == 1 && len(g.added[2]) == 1 && len(g.sent) == 1
		g.mu.Unlock()
		if !sums {
			return false
		}
		g.l[0].mu.Lock()
		defer g.l[0].mu.Unlock()
		return len(g.l[0].free) == localChunks
	})
	defer g.mu.Unlock()
	want := bytes.Repeat(float32Bytes(1+2+3), 16)
	for _, m := range []int{1, 2} {
		if len(g.added[m]) != 1 {
			t.Fatalf("member %d's aggregator was given %d host sums through the segment, want 1 (sent over the van: %v)", m, len(g.added[m]), g.sent)
		}
		h := g.added[m][0]
		if node.ID(h.Recipient) != g.l[m].self || node.ID(h.Sender) != g.l[0].self || h.Flags&frame.FlagHostSum == 0 || int(h.Partition) != 2-m {
			t.Errorf("member %d's host sum %s", m, &h)
		}
		if !bytes.Equal(g.data[m][0], want) {
			t.Errorf("member %d's host sum %v, want %v", m, g.data[m][0], want)
		}
	}
	if len(g.sent) != 1 || node.ID(g.sent[0].Recipient) != server || g.sent[0].Flags&frame.FlagHostSum == 0 {
		t.Errorf("sent over the van %v, want the server's host sum only", g.sent)
	}
	if len(g.added[0]) != 0 {
		t.Errorf("the leader's aggregator was given %v", g.added[0])
	}
	g.l[0].mu.Lock()
	defer g.l[0].mu.Unlock()
	if len(g.l[0].free) != localChunks {
		t.Errorf("the leader has %d result chunks free, want all %d", len(g.l[0].free), localChunks)
	}
}

// TestLocalHostSumToLeader: the host sum of a partition the leader
// aggregates itself reaches its own aggregator exact, in a buffer that
// aggregator handed out (summed there: no copy on the way in), and never
// crosses the van.
func TestLocalHostSumToLeader(t *testing.T) {
	const n = 3
	g := newShellGroup(t, n, 64)
	for i := n - 1; i >= 0; i-- {
		g.push(t, i, 0, g.l[0].self)
	}
	g.settle(t, func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(g.added[0]) > 0
	})
	defer g.mu.Unlock()
	if len(g.added[0]) != 1 {
		t.Fatalf("the leader's aggregator was given %d host sums, want 1", len(g.added[0]))
	}
	if h := g.added[0][0]; node.ID(h.Sender) != g.l[0].self || h.Flags&frame.FlagHostSum == 0 {
		t.Errorf("the leader's host sum %s", &h)
	}
	if want := bytes.Repeat(float32Bytes(1+2+3), 16); !bytes.Equal(g.data[0][0], want) {
		t.Errorf("the leader's host sum %v, want %v", g.data[0][0], want)
	}
	if !g.adopted[0][0] {
		t.Error("the leader's host sum came in a buffer of its own, which its aggregator copies, not in one the aggregator handed out")
	}
	if len(g.sent) != 0 || len(g.added[1])+len(g.added[2]) != 0 {
		t.Errorf("sent over the van %v, given to members %v %v; want nothing", g.sent, g.added[1], g.added[2])
	}
}

// TestLocalContributionsPacked: a member's call that contributes several
// partitions tells its leader in one datagram (each costs both sides a
// system call, and the leader a wake-up), and the leader sums each exactly.
func TestLocalContributionsPacked(t *testing.T) {
	const parts = 4
	g := newShellGroup(t, 2, 64)
	var sends []frame.Message
	for part := range parts {
		data := bytes.Repeat(float32Bytes(2), 16)
		h := frame.Header{Type: frame.Push, DType: frame.Float32, Sender: uint32(g.l[1].self), Recipient: uint32(g.l[0].self),
			Key: 7, Iteration: 3, Partition: uint32(part), Offset: uint64(part * len(data)), Total: uint64(parts * len(data)), Length: uint64(len(data))}
		sends = append(sends, frame.Message{Header: h, Payload: data})
	}
	if rest, err := g.l[1].intercept(sends); err != nil || len(rest) != 0 {
		t.Fatalf("the member's push: left %d frames, %v", len(rest), err)
	}
	for part := range parts {
		g.push(t, 0, part, g.l[0].self)
	}
	g.settle(t, func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(g.added[0]) == parts
	})
	want := bytes.Repeat(float32Bytes(1+2), 16)
	for k, got := range g.data[0] {
		if !bytes.Equal(got, want) {
			t.Errorf("host sum %s: %v, want %v", &g.added[0][k], got, want)
		}
	}
	g.mu.Unlock()
	g.l[1].mu.Lock()
	datagrams := g.l[1].datagrams
	g.l[1].mu.Unlock()
	if datagrams != 1 {
		t.Errorf("the member sent its %d contributions' notices in %d datagrams, want 1", parts, datagrams)
	}
}
