package memvan_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/van"
	"github.com/fptps/fpt/van/memvan"
)

// The contract tests below are the transport-agnostic ones of
// van/van_test.go, run on the in-memory van: it must behave as the real
// ones do where a caller can tell.

type rx struct {
	h frame.Header
	p []byte
}

type lost struct {
	peer node.ID
	err  error
}

// collector records what arrives; with sink set it is a van.Sink too.
type collector struct {
	mu      sync.Mutex
	frames  []rx
	lost    []lost
	handled chan struct{}
	// sinkBufs are the buffers sinkCollector handed out.
	sinkBufs [][]byte
	inSink   int // frames whose payload was the sink's buffer
}

func newCollector() *collector { return &collector{handled: make(chan struct{}, 1)} }

func (c *collector) HandleFrame(h *frame.Header, p []byte) {
	c.mu.Lock()
	if n := len(c.sinkBufs); n > 0 && len(p) > 0 && &c.sinkBufs[n-1][0] == &p[0] {
		c.inSink++
	}
	c.frames = append(c.frames, rx{*h, append([]byte(nil), p...)})
	c.mu.Unlock()
	c.poke()
}

func (c *collector) PeerLost(peer node.ID, err error) {
	c.mu.Lock()
	c.lost = append(c.lost, lost{peer, err})
	c.mu.Unlock()
	c.poke()
}

func (c *collector) poke() {
	select {
	case c.handled <- struct{}{}:
	default:
	}
}

func (c *collector) waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		c.mu.Lock()
		ok := cond()
		c.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-c.handled:
		case <-time.After(10 * time.Millisecond):
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func (c *collector) waitFrames(t testing.TB, n int) []rx {
	t.Helper()
	c.waitFor(t, fmt.Sprintf("%d frames", n), func() bool { return len(c.frames) >= n })
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]rx(nil), c.frames...)
}

func (c *collector) lostEvents() []lost {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]lost(nil), c.lost...)
}

// sinkCollector is a collector that is also a van.Sink.
type sinkCollector struct{ *collector }

func (s sinkCollector) PayloadBuffer(h *frame.Header) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h.Length == 0 {
		return nil
	}
	b := make([]byte, h.Length)
	s.sinkBufs = append(s.sinkBufs, b)
	return b
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newVan(t testing.TB, net *memvan.Network, self node.ID, mod func(*van.Config)) (*memvan.Van, *collector) {
	t.Helper()
	col := newCollector()
	cfg := van.Config{Self: self, ListenAddr: "127.0.0.1:0", Handler: col, Logger: quiet(), IOTimeout: 5 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	v, err := net.Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Close() })
	return v, col
}

func connect(t testing.TB, a van.Transport, aID node.ID, b van.Transport, bID node.ID) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.Dial(ctx, bID, b.Addr()); err != nil {
		t.Fatal(err)
	}
	if err := a.AwaitPeers(ctx, []node.ID{bID}); err != nil {
		t.Fatal(err)
	}
	if err := b.AwaitPeers(ctx, []node.ID{aID}); err != nil {
		t.Fatal(err)
	}
}

func fill(p []byte, seed uint64) {
	x := seed*0x9e3779b97f4a7c15 + 1
	for i := range p {
		x = x*6364136223846793005 + 1442695040888963407
		p[i] = byte(x >> 56)
	}
}

func check(p []byte, seed uint64) int {
	x := seed*0x9e3779b97f4a7c15 + 1
	for i := range p {
		x = x*6364136223846793005 + 1442695040888963407
		if p[i] != byte(x>>56) {
			return i
		}
	}
	return -1
}

func pushHeader(from, to node.ID, key uint64, n int) frame.Header {
	return frame.Header{Type: frame.Push, DType: frame.Float32, Sender: uint32(from), Recipient: uint32(to), Key: key, Total: uint64(n), Length: uint64(n)}
}

func eventually(t testing.TB, f func() error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestRoundTrip(t *testing.T) {
	net := memvan.NewNetwork()
	a, ca := newVan(t, net, 8, nil)
	b, cb := newVan(t, net, 9, nil)
	connect(t, a, 8, b, 9)
	sizes := []int{0, 4, 64 << 10, 4 << 20, 12, 0}
	var doneCalls atomic.Int32
	send := func(v van.Transport, from, to node.ID) {
		for i, n := range sizes {
			p := make([]byte, n)
			fill(p, uint64(from)<<32|uint64(i))
			m := &van.Message{Header: pushHeader(0, to, uint64(i), n), Payload: p, Done: func(err error) {
				if err != nil {
					t.Errorf("Done(%v)", err)
				}
				fill(p, 0) // the buffer is free again: the receiver must not see this
				doneCalls.Add(1)
			}}
			m.Header.Length = 12345 // the van sets it
			if err := v.Send(m); err != nil {
				t.Error(err)
				return
			}
		}
	}
	go send(a, 8, 9)
	send(b, 9, 8)
	for _, tc := range []struct {
		c    *collector
		from node.ID
	}{{cb, 8}, {ca, 9}} {
		got := tc.c.waitFrames(t, len(sizes))
		for i, f := range got {
			if node.ID(f.h.Sender) != tc.from || f.h.Key != uint64(i) || len(f.p) != sizes[i] || f.h.Length != uint64(sizes[i]) {
				t.Fatalf("frame %d from %d: %v with %d bytes, want key %d and %d bytes", i, tc.from, &f.h, len(f.p), i, sizes[i])
			}
			if at := check(f.p, uint64(tc.from)<<32|uint64(i)); at >= 0 {
				t.Fatalf("frame %d from %d: content differs at byte %d", i, tc.from, at)
			}
		}
	}
	eventually(t, func() error {
		if n := doneCalls.Load(); n != int32(2*len(sizes)) {
			return fmt.Errorf("%d Done calls, want %d", n, 2*len(sizes))
		}
		return nil
	})
	var total uint64
	for _, n := range sizes {
		total += uint64(frame.HeaderSize + n)
	}
	sa, sb := a.Stats(), b.Stats()
	if len(sa) != 1 || len(sb) != 1 {
		t.Fatalf("stats %v / %v", sa, sb)
	}
	sa[0].SentBusy, sa[0].ReceivedBusy, sb[0].SentBusy, sb[0].ReceivedBusy = 0, 0, 0, 0
	// One Hello from a to b on top of the data frames, as on TCP.
	want := van.PeerStats{Peer: 9, SentBytes: total + frame.HeaderSize, ReceivedBytes: total, SentFrames: uint64(len(sizes)) + 1, ReceivedFrames: uint64(len(sizes))}
	if sa[0] != want {
		t.Errorf("a's stats %+v, want %+v", sa[0], want)
	}
	want = van.PeerStats{Peer: 8, SentBytes: total, ReceivedBytes: total + frame.HeaderSize, SentFrames: uint64(len(sizes)), ReceivedFrames: uint64(len(sizes)) + 1}
	if sb[0] != want {
		t.Errorf("b's stats %+v, want %+v", sb[0], want)
	}
}

func TestPriorityOrderAtReceiver(t *testing.T) {
	net := memvan.NewNetwork()
	a, _ := newVan(t, net, 8, nil)
	b, cb := newVan(t, net, 9, nil)
	connect(t, a, 8, b, 9)
	a.SetWeight(9, 0) // queue everything before the sender may run
	r := rand.New(rand.NewPCG(1, 1))
	const n = 200
	for i := range n {
		m := &van.Message{Header: pushHeader(8, 9, uint64(i), 4), Payload: make([]byte, 4)}
		m.Header.Priority = int32(r.IntN(5))
		if err := a.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	if s := b.Stats(); len(s) > 0 && s[0].ReceivedFrames > 1 {
		t.Fatalf("frames of a paused flow arrived: %+v", s)
	}
	a.SetWeight(9, 1)
	got := cb.waitFrames(t, n)
	for i := 1; i < len(got); i++ {
		p, q := &got[i-1].h, &got[i].h
		if p.Priority < q.Priority || (p.Priority == q.Priority && p.Key > q.Key) {
			t.Fatalf("frame %d (prio %d key %d) after frame %d (prio %d key %d)", i, q.Priority, q.Key, i-1, p.Priority, p.Key)
		}
	}
}

// Every node sends to every other at once; each pair's frames arrive
// complete, in order, and the handler is never called concurrently.
func TestMesh(t *testing.T) {
	net := memvan.NewNetwork()
	const nodes, perPair = 5, 30
	vans := make([]*memvan.Van, nodes)
	cols := make([]*collector, nodes)
	ids := make([]node.ID, nodes)
	for i := range vans {
		ids[i] = node.ID(8 + i)
		vans[i], cols[i] = newVan(t, net, ids[i], nil)
	}
	ctx := context.Background()
	for i := range vans {
		for j := i + 1; j < nodes; j++ {
			if err := vans[i].Dial(ctx, ids[j], vans[j].Addr()); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := range vans {
		others := append(append([]node.ID(nil), ids[:i]...), ids[i+1:]...)
		if err := vans[i].AwaitPeers(ctx, others); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for i := range vans {
		for j := range vans {
			if i == j {
				continue
			}
			wg.Go(func() {
				for k := range uint64(perPair) {
					p := make([]byte, int(k*k*157%(64<<10))&^3)
					fill(p, uint64(ids[i])<<40|uint64(ids[j])<<20|k)
					if err := vans[i].Send(&van.Message{Header: pushHeader(ids[i], ids[j], k, len(p)), Payload: p}); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	for i, c := range cols {
		got := c.waitFrames(t, (nodes-1)*perPair)
		next := map[node.ID]uint64{}
		for _, f := range got {
			from := node.ID(f.h.Sender)
			if node.ID(f.h.Recipient) != ids[i] || f.h.Key != next[from] || check(f.p, uint64(from)<<40|uint64(ids[i])<<20|f.h.Key) >= 0 {
				t.Fatalf("node %d: frame %v out of order, misaddressed or corrupted (want key %d from %d)", ids[i], &f.h, next[from], from)
			}
			next[from]++
		}
	}
}

func TestSink(t *testing.T) {
	net := memvan.NewNetwork()
	a, _ := newVan(t, net, 8, nil)
	col := newCollector()
	b, err := net.Listen(van.Config{Self: 9, ListenAddr: "127.0.0.1:0", Handler: sinkCollector{col}, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	connect(t, a, 8, b, 9)
	for i, n := range []int{16, 0, 1 << 20} {
		p := make([]byte, n)
		fill(p, uint64(i))
		if err := a.Send(&van.Message{Header: pushHeader(8, 9, uint64(i), n), Payload: p}); err != nil {
			t.Fatal(err)
		}
	}
	got := col.waitFrames(t, 3)
	for i, f := range got {
		if check(f.p, uint64(i)) >= 0 {
			t.Errorf("frame %d corrupted", i)
		}
	}
	col.mu.Lock()
	defer col.mu.Unlock()
	if len(col.sinkBufs) != 2 || col.inSink != 2 {
		t.Errorf("%d sink buffers handed out, %d frames handled in them; want 2 and 2 (the empty payload takes none)", len(col.sinkBufs), col.inSink)
	}
}

func TestGracefulClose(t *testing.T) {
	net := memvan.NewNetwork()
	a, ca := newVan(t, net, 8, nil)
	b, cb := newVan(t, net, 9, nil)
	connect(t, a, 8, b, 9)
	a.SetWeight(9, 0) // frames accepted before Close are sent, even from a paused flow
	var done atomic.Int32
	for i := range 10 {
		if err := a.Send(&van.Message{Header: pushHeader(8, 9, uint64(i), 1<<16), Payload: make([]byte, 1<<16), Done: func(err error) {
			if err != nil {
				t.Errorf("Done(%v) on a graceful close", err)
			}
			done.Add(1)
		}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	if done.Load() != 10 {
		t.Fatalf("%d Done calls after Close, want 10", done.Load())
	}
	cb.waitFrames(t, 10)
	eventually(t, func() error {
		if err := b.Send(&van.Message{Header: pushHeader(9, 8, 1, 0)}); !errors.Is(err, van.ErrNoPeer) {
			return fmt.Errorf("Send to a node that left: %v", err)
		}
		return nil
	})
	if l := cb.lostEvents(); len(l) != 0 {
		t.Fatalf("PeerLost on a graceful close: %v", l)
	}
	if l := ca.lostEvents(); len(l) != 0 {
		t.Fatalf("PeerLost at the closing node: %v", l)
	}
	if err := a.Send(&van.Message{Header: pushHeader(8, 9, 1, 0)}); !errors.Is(err, van.ErrClosed) {
		t.Fatalf("Send after Close: %v, want ErrClosed", err)
	}
	if err := a.Forward(&van.Message{Header: pushHeader(8, 9, 1, 0)}); !errors.Is(err, van.ErrClosed) {
		t.Fatalf("Forward after Close: %v, want ErrClosed", err)
	}
	if err := a.Dial(context.Background(), 9, b.Addr()); !errors.Is(err, van.ErrClosed) {
		t.Fatalf("Dial after Close: %v, want ErrClosed", err)
	}
}

func TestSendErrors(t *testing.T) {
	net := memvan.NewNetwork()
	v, _ := newVan(t, net, 8, func(c *van.Config) { c.MaxPayload = 1 << 10 })
	if err := v.Send(&van.Message{Header: pushHeader(8, 42, 1, 0)}); !errors.Is(err, van.ErrNoPeer) {
		t.Fatalf("Send to an unknown node: %v", err)
	}
	if err := v.Forward(&van.Message{Header: pushHeader(8, 42, 1, 0)}); !errors.Is(err, van.ErrNoPeer) {
		t.Fatalf("Forward to an unknown node: %v", err)
	}
	if err := v.Send(&van.Message{Header: pushHeader(8, 42, 1, 2048), Payload: make([]byte, 2048)}); err == nil {
		t.Fatal("Send over MaxPayload accepted")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := v.AwaitPeers(ctx, []node.ID{42}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("AwaitPeers of a node that never comes: %v", err)
	}
	if err := v.Dial(context.Background(), 9, "127.0.0.1:1"); err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Fatalf("Dial of a port nobody listens on: %v", err)
	}
	if _, err := net.Listen(van.Config{Self: 9, ListenAddr: v.Addr(), Handler: newCollector()}); err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("listening on a port in use: %v", err)
	}
}

func TestBackPressure(t *testing.T) {
	net := memvan.NewNetwork()
	a, _ := newVan(t, net, 8, func(c *van.Config) { c.PoolBytes = 4096 })
	b, cb := newVan(t, net, 9, nil)
	connect(t, a, 8, b, 9)
	a.SetWeight(9, 0)
	msg := func(k uint64) *van.Message {
		return &van.Message{Header: pushHeader(8, 9, k, 4000), Payload: make([]byte, 4000)}
	}
	if err := a.Send(msg(1)); err != nil {
		t.Fatal(err)
	}
	sent := make(chan error, 1)
	go func() { sent <- a.Send(msg(2)) }()
	select {
	case err := <-sent:
		t.Fatalf("Send over the pool limit returned (%v) without blocking", err)
	case <-time.After(50 * time.Millisecond):
	}
	if err := a.Forward(msg(3)); err != nil { // never blocks
		t.Fatal(err)
	}
	a.SetWeight(9, 1)
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	cb.waitFrames(t, 3)
}

func TestShapingSwitch(t *testing.T) {
	net := memvan.NewNetwork()
	a, _ := newVan(t, net, 8, nil)
	b, cb := newVan(t, net, 9, nil)
	connect(t, a, 8, b, 9)
	a.SetWeight(9, 0)
	const n = 1000
	send := func(k uint64) {
		if err := a.Send(&van.Message{Header: pushHeader(8, 9, k, n), Payload: make([]byte, n)}); err != nil {
			t.Fatal(err)
		}
	}
	queued := func(want int64) {
		eventually(t, func() error {
			if got := a.QueuedBytes(); got != want {
				return fmt.Errorf("QueuedBytes %d, want %d", got, want)
			}
			return nil
		})
	}
	send(1)
	send(2)
	queued(2 * (frame.HeaderSize + n))
	a.SetShaping(false)
	cb.waitFrames(t, 2)
	queued(0)
	a.SetShaping(true)
	send(3)
	queued(frame.HeaderSize + n)
	a.SetWeight(9, 1)
	cb.waitFrames(t, 3)
	queued(0)
}

// Drop breaks every connection of a node: both ends see PeerLost once,
// frames queued for it fail, and nobody can dial it again.
func TestDrop(t *testing.T) {
	net := memvan.NewNetwork()
	a, ca := newVan(t, net, 8, nil)
	b, cb := newVan(t, net, 9, nil)
	c, cc := newVan(t, net, 10, nil)
	connect(t, a, 8, b, 9)
	connect(t, a, 8, c, 10)
	connect(t, b, 9, c, 10)
	a.SetWeight(9, 0) // keep a frame for b queued
	var doneErr atomic.Value
	if err := a.Send(&van.Message{Header: pushHeader(8, 9, 1, 8), Payload: make([]byte, 8), Done: func(err error) { doneErr.Store(fmt.Sprint(err)) }}); err != nil {
		t.Fatal(err)
	}
	net.Drop(9)
	ca.waitFor(t, "a's PeerLost", func() bool { return len(ca.lost) == 1 })
	cc.waitFor(t, "c's PeerLost", func() bool { return len(cc.lost) == 1 })
	cb.waitFor(t, "b's PeerLost", func() bool { return len(cb.lost) == 2 })
	for _, l := range append(ca.lostEvents(), cc.lostEvents()...) {
		if l.peer != 9 || !errors.Is(l.err, memvan.ErrDropped) {
			t.Errorf("PeerLost(%d, %v), want node 9, dropped", l.peer, l.err)
		}
	}
	eventually(t, func() error {
		if s, _ := doneErr.Load().(string); !strings.Contains(s, van.ErrNoPeer.Error()) {
			return fmt.Errorf("the queued frame's Done got %q, want ErrNoPeer", s)
		}
		return nil
	})
	if err := a.Dial(context.Background(), 9, b.Addr()); err == nil {
		t.Error("a dropped node accepted a Dial")
	}
	// a and c still talk.
	if err := c.Send(&van.Message{Header: pushHeader(10, 8, 5, 4), Payload: make([]byte, 4)}); err != nil {
		t.Fatal(err)
	}
	if got := ca.waitFrames(t, 1); got[0].h.Key != 5 {
		t.Fatalf("got %v", &got[0].h)
	}
}

// Hold keeps one direction's frames until Release, then delivers them in
// order; the other direction and other pairs are not held.
func TestHoldRelease(t *testing.T) {
	net := memvan.NewNetwork()
	a, ca := newVan(t, net, 8, nil)
	b, cb := newVan(t, net, 9, nil)
	connect(t, a, 8, b, 9)
	net.Hold(8, 9)
	for k := range uint64(5) {
		if err := a.Send(&van.Message{Header: pushHeader(8, 9, k, 4), Payload: make([]byte, 4)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Send(&van.Message{Header: pushHeader(9, 8, 99, 4), Payload: make([]byte, 4)}); err != nil {
		t.Fatal(err)
	}
	ca.waitFrames(t, 1) // the other direction flows
	eventually(t, func() error {
		if s := a.Stats(); s[0].SentFrames != 6 { // Hello and 5 frames written
			return fmt.Errorf("a wrote %d frames", s[0].SentFrames)
		}
		return nil
	})
	cb.mu.Lock()
	early := len(cb.frames)
	cb.mu.Unlock()
	if early != 0 {
		t.Fatalf("%d held frames arrived", early)
	}
	net.Release(8, 9)
	for i, f := range cb.waitFrames(t, 5) {
		if f.h.Key != uint64(i) {
			t.Fatalf("frame %d has key %d", i, f.h.Key)
		}
	}
}

// Close releases every goroutine.
func TestCloseReleasesGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	net := memvan.NewNetwork()
	var vans []*memvan.Van
	for i := range 3 {
		v, err := net.Listen(van.Config{Self: node.ID(8 + i), ListenAddr: "127.0.0.1:0", Handler: newCollector(), Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		vans = append(vans, v)
	}
	connect(t, vans[0], 8, vans[1], 9)
	connect(t, vans[1], 9, vans[2], 10)
	for _, v := range vans {
		v.Close()
	}
	eventually(t, func() error {
		if g := runtime.NumGoroutine(); g > before {
			return fmt.Errorf("%d goroutines after Close, %d before", g, before)
		}
		return nil
	})
}
