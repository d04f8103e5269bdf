package worker

import (
	"bytes"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fptps/fpt/frame"
)

// stackAgg is a shellAgg that records, for each host sum it is given,
// whether the goroutine giving it was the notice loop or a push's call
// (intercept) rather than one started for it.
type stackAgg struct {
	shellAgg
	mu     *sync.Mutex
	direct *[]bool
}

func (a stackAgg) AddLocal(h *frame.Header, data []byte) error {
	a.record()
	return a.shellAgg.AddLocal(h, data)
}

func (a stackAgg) HandlePush(h *frame.Header, payload []byte, inPlace bool) error {
	a.record()
	return a.shellAgg.HandlePush(h, payload, inPlace)
}

func (a stackAgg) record() {
	pcs := make([]uintptr, 64)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs)])
	direct := false
	for {
		f, more := frames.Next()
		if strings.HasSuffix(f.Function, "(*localAgg).loop") || strings.HasSuffix(f.Function, "(*localAgg).intercept") {
			direct = true
		}
		if !more {
			break
		}
	}
	a.mu.Lock()
	*a.direct = append(*a.direct, direct)
	a.mu.Unlock()
}

// TestLocalHostSumAddedWhereCompleted: a host sum goes to its aggregator
// on the goroutine that completed it, the notice loop or the call whose
// push was the last, never on one started for it: on a busy host each
// such goroutine cost a thread's wake-up, a quarter of a small step's.
// The leader's own partitions (its aggregator's) and a member's (handed
// over through the segment) alike, whichever worker pushes last.
func TestLocalHostSumAddedWhereCompleted(t *testing.T) {
	for _, tt := range []struct {
		name  string
		order []int // the workers' pushes, in order
		owner int   // the worker aggregating the partition
	}{
		{name: "leader's, leader last", order: []int{2, 1, 0}, owner: 0},
		{name: "leader's, members last", order: []int{0, 1, 2}, owner: 0},
		{name: "member's, leader last", order: []int{2, 1, 0}, owner: 1},
		{name: "member's, members last", order: []int{0, 2, 1}, owner: 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			const n = 3
			g := newShellGroup(t, n, 64)
			var mu sync.Mutex
			var direct []bool
			for i, l := range g.l {
				l.mu.Lock()
				l.agg = stackAgg{shellAgg: shellAgg{g: g, i: i}, mu: &mu, direct: &direct}
				l.mu.Unlock()
			}
			for _, i := range tt.order {
				g.push(t, i, 0, g.l[tt.owner].self)
			}
			g.settle(t, func() bool {
				g.mu.Lock()
				defer g.mu.Unlock()
				return len(g.added[tt.owner]) > 0
			})
			defer g.mu.Unlock()
			if want := bytes.Repeat(float32Bytes(1+2+3), 16); len(g.data[tt.owner]) != 1 || !bytes.Equal(g.data[tt.owner][0], want) {
				t.Fatalf("worker %d's aggregator was given %v, want one host sum %v", tt.owner, g.data[tt.owner], want)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(direct) != 1 || !direct[0] {
				t.Errorf("host sums given on the loop or the pushing call: %v, want [true] (not on a goroutine of their own)", direct)
			}
		})
	}
}

// deliveries are the results a member of a shellGroup was given, copied.
type deliveries struct {
	mu   sync.Mutex
	h    []frame.Header
	data [][]byte
}

// recordDeliveries has member l's results recorded. Set under l's lock,
// which its loop takes before a result's delivery.
func recordDeliveries(l *localAgg) *deliveries {
	d := &deliveries{}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.deliver = func(h *frame.Header, data []byte) {
		d.mu.Lock()
		defer d.mu.Unlock()
		d.h = append(d.h, *h)
		d.data = append(d.data, bytes.Clone(data))
	}
	return d
}

func (d *deliveries) len() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.h)
}

// TestLocalResultWaitsForChunk: a result published while every result
// chunk is still being read does not wait for one (the notice loop, which
// frees them, publishes results itself): it is kept, and goes out, exact
// and in order, as the members' reads free chunks.
func TestLocalResultWaitsForChunk(t *testing.T) {
	g := newShellGroup(t, 2, 64)
	leader, member := g.l[0], g.l[1]
	got := recordDeliveries(member)
	// Every chunk held by a read the member has not made yet.
	leader.mu.Lock()
	for _, c := range leader.free {
		leader.readers[c] = readers{left: 1, init: true}
	}
	leader.free = nil
	leader.mu.Unlock()

	results := make([]frame.Header, 2)
	data := make([][]byte, 2)
	for i := range results {
		results[i] = frame.Header{Type: frame.Result, DType: frame.Float32, Flags: frame.FlagInit, Sender: uint32(leader.self),
			Key: 7, Partition: uint32(i), Iteration: 0, Offset: uint64(64 * i), Total: 128, Length: 64}
		data[i] = bytes.Repeat(float32Bytes(float32(10+i)), 16)
		published := make(chan error, 1)
		go func() { published <- leader.publish(&results[i], data[i]) }()
		select {
		case err := <-published:
			if err != nil {
				t.Fatalf("publish %d: %v", i, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("publish %d waited 10 s for a chunk with none free", i)
		}
	}
	// What the caller published from is its own again.
	for i := range data {
		clear(data[i])
	}
	if n := got.len(); n != 0 {
		t.Errorf("the member was given %d results before a chunk was read", n)
	}

	for _, c := range []int{5, 9} {
		h := results[0] // any valid header: the chunk is what a read frees
		if err := member.notify(0, noticeRead, c, &h); err != nil {
			t.Fatal(err)
		}
	}
	g.settle(t, func() bool {
		n := got.len()
		leader.mu.Lock()
		defer leader.mu.Unlock()
		return n == 2 && len(leader.free) == 2 // its reads of the two came back
	})
	defer g.mu.Unlock()
	got.mu.Lock()
	defer got.mu.Unlock()
	for i := range results {
		want := results[i]
		want.Recipient = uint32(member.self)
		if got.h[i] != want {
			t.Errorf("result %d: %s, want %s", i, &got.h[i], &want)
		}
		if w := bytes.Repeat(float32Bytes(float32(10+i)), 16); !bytes.Equal(got.data[i], w) {
			t.Errorf("result %d: %v, want %v", i, got.data[i], w)
		}
	}
	leader.mu.Lock()
	defer leader.mu.Unlock()
	if len(leader.waiting) != 0 || len(leader.readers) != localChunks-2 {
		t.Errorf("%d results waiting, %d chunks being read; want 0 and %d", len(leader.waiting), len(leader.readers), localChunks-2)
	}
}

// publishAgg is the leader's aggregator in a shellGroup that completes
// each host sum it is given at once and hands the sum to the group, as
// the real one does through the worker's own landing.
type publishAgg struct {
	shellAgg
	leader *localAgg
}

func (a publishAgg) HandlePush(h *frame.Header, payload []byte, inPlace bool) error {
	if err := a.shellAgg.HandlePush(h, payload, inPlace); err != nil {
		return err
	}
	r := *h
	r.Type, r.Flags = frame.Result, h.Flags&^frame.FlagHostSum
	return a.leader.publish(&r, payload)
}

// TestLocalSumCompletedOnLoopOneDatagram: a member's contribution that
// completes a sum on the leader's notice loop has the member told of the
// result and of its chunk freed in one datagram (one wake-up), and the
// member has the exact sum.
func TestLocalSumCompletedOnLoopOneDatagram(t *testing.T) {
	g := newShellGroup(t, 2, 64)
	leader, member := g.l[0], g.l[1]
	leader.mu.Lock()
	leader.agg = publishAgg{shellAgg: shellAgg{g: g, i: 0}, leader: leader}
	leader.mu.Unlock()
	got := recordDeliveries(member)

	g.push(t, 0, 0, leader.self) // the leader's first: the member's completes the sum
	g.push(t, 1, 0, leader.self)
	g.settle(t, func() bool {
		n := got.len()
		leader.mu.Lock()
		defer leader.mu.Unlock()
		member.mu.Lock()
		defer member.mu.Unlock()
		return n == 1 && len(leader.free) == localChunks && len(member.free) == localChunks
	})
	defer g.mu.Unlock()
	got.mu.Lock()
	if want := bytes.Repeat(float32Bytes(1+2), 16); !bytes.Equal(got.data[0], want) {
		t.Errorf("the member's sum %v, want %v", got.data[0], want)
	}
	got.mu.Unlock()
	leader.mu.Lock()
	defer leader.mu.Unlock()
	if leader.datagrams != 1 {
		t.Errorf("the leader sent %d datagrams for the result and the freed chunk, want 1", leader.datagrams)
	}
}
