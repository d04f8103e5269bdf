// Package vantest is the contract every van.Transport keeps, as tests: Run
// checks a transport through the interface alone (frames, order, priority,
// Sink, Done, Stats, back-pressure, shaping, graceful Close, errors), so
// that the real vans (epoll, netconn) and the in-memory one (van/memvan)
// are held to the same behaviour. Tests that need sockets (garbage on the
// wire, stalled peers, file descriptors) stay in package van.
package vantest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/van"
	"github.com/fptps/fpt/van/internal/wiretest"
)

// Listen starts a transport on cfg; cfg.ListenAddr is "127.0.0.1:0".
// Transports one Listen started reach each other by Addr.
type Listen func(cfg van.Config) (van.Transport, error)

// Run runs the contract as subtests of t; network is called once per
// subtest for a fresh set of transports.
func Run(t *testing.T, network func() Listen) {
	tests := []struct {
		name string
		f    func(t *testing.T, l Listen)
	}{
		{"RoundTrip", testRoundTrip},
		{"PriorityOrderAtReceiver", testPriorityOrderAtReceiver},
		{"Mesh", testMesh},
		{"Sink", testSink},
		{"GracefulClose", testGracefulClose},
		{"ByeBehindAFailedWrite", testByeBehindAFailedWrite},
		{"Abort", testAbort},
		{"SendErrors", testSendErrors},
		{"BackPressure", testBackPressure},
		{"ShapingSwitch", testShapingSwitch},
		{"Auth", testAuth},
		{"HelloBeforeID", testHelloBeforeID},
		{"Channels", testChannels},
		{"ChannelsGracefulClose", testChannelsGracefulClose},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.f(t, network()) })
	}
}

// Frame is a frame a Collector received, its payload copied.
type Frame struct {
	Header  frame.Header
	Payload []byte
	InPlace bool // the handler was told Payload is its Sink's buffer
}

// Lost is a PeerLost call a Collector received.
type Lost struct {
	Peer node.ID
	Err  error
}

// Collector is a van.Handler that records what arrives, for tests.
type Collector struct {
	mu      sync.Mutex
	frames  []Frame
	lost    []Lost
	handled chan struct{}
	// sinkBufs are the buffers sinkCollector handed out.
	sinkBufs [][]byte
	inSink   int // frames whose payload was the sink's latest buffer
}

// NewCollector returns an empty Collector.
func NewCollector() *Collector { return &Collector{handled: make(chan struct{}, 1)} }

// HandleFrame implements van.Handler.
func (c *Collector) HandleFrame(h *frame.Header, p []byte, inPlace bool) {
	c.mu.Lock()
	if n := len(c.sinkBufs); n > 0 && len(p) > 0 && &c.sinkBufs[n-1][0] == &p[0] {
		c.inSink++
	}
	c.frames = append(c.frames, Frame{*h, append([]byte(nil), p...), inPlace})
	c.mu.Unlock()
	c.poke()
}

// PeerLost implements van.Handler.
func (c *Collector) PeerLost(peer node.ID, err error) {
	c.mu.Lock()
	c.lost = append(c.lost, Lost{peer, err})
	c.mu.Unlock()
	c.poke()
}

func (c *Collector) poke() {
	select {
	case c.handled <- struct{}{}:
	default:
	}
}

// waitFor polls cond, under the collector's lock, until it holds.
func (c *Collector) waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(30 * time.Second)
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

// WaitFrames waits until n frames have arrived and returns all so far.
func (c *Collector) WaitFrames(t testing.TB, n int) []Frame {
	t.Helper()
	c.waitFor(t, fmt.Sprintf("%d frames", n), func() bool { return len(c.frames) >= n })
	return c.Frames()
}

// Frames is the frames that arrived so far.
func (c *Collector) Frames() []Frame {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Frame(nil), c.frames...)
}

// WaitLost waits until n PeerLost calls have arrived and returns all so far.
func (c *Collector) WaitLost(t testing.TB, n int) []Lost {
	t.Helper()
	c.waitFor(t, fmt.Sprintf("%d lost peers", n), func() bool { return len(c.lost) >= n })
	return c.LostPeers()
}

// LostPeers is the PeerLost calls so far.
func (c *Collector) LostPeers() []Lost {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Lost(nil), c.lost...)
}

// sinkCollector is a Collector that is also a van.Sink.
type sinkCollector struct{ *Collector }

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

// Logger is the logger for vans in tests: it discards, unless FPT_TEST_LOG
// is set (then Debug and above go to stderr).
func Logger() *slog.Logger {
	if os.Getenv("FPT_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// NewVan starts a transport with l on a free loopback port, a Collector as
// its handler and an IOTimeout of 5 s; mod may adjust the config. The
// transport is closed when the test ends.
func NewVan(t testing.TB, l Listen, self node.ID, mod func(*van.Config)) (van.Transport, *Collector) {
	t.Helper()
	col := NewCollector()
	cfg := van.Config{Self: self, ListenAddr: "127.0.0.1:0", Handler: col, Logger: Logger(), IOTimeout: 5 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	v, err := l(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Close() })
	return v, col
}

// Connect has a dial b and waits until both see each other.
func Connect(t testing.TB, a van.Transport, aID node.ID, b van.Transport, bID node.ID) {
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

// Eventually polls f until it returns nil, failing the test with f's last
// error after 10 seconds.
func Eventually(t testing.TB, f func() error) {
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

func testRoundTrip(t *testing.T, l Listen) {
	start := time.Now()
	a, ca := NewVan(t, l, 8, nil)
	b, cb := NewVan(t, l, 9, nil)
	Connect(t, a, 8, b, 9)
	sizes := []int{0, 4, 64 << 10, 4 << 20, 12, 0}
	var doneCalls atomic.Int32
	send := func(v van.Transport, from, to node.ID) {
		for i, n := range sizes {
			p := make([]byte, n)
			wiretest.Fill(p, uint64(from)<<32|uint64(i))
			m := &frame.Message{Header: wiretest.PushHeader(0, to, uint64(i), n), Payload: p, Done: func(err error) {
				if err != nil {
					t.Errorf("Done(%v)", err)
				}
				wiretest.Fill(p, 0) // the buffer is free again: the receiver must not see this
				doneCalls.Add(1)
			}}
			m.Header.Length = 12345 // the van sets it
			if i%2 == 1 {
				// A gathered payload: the receiver sees the parts joined.
				m.Payload, m.More = p[:n/3], [][]byte{p[n/3 : n/2], nil, p[n/2:]}
			}
			if err := v.Send(m); err != nil {
				t.Error(err)
				return
			}
		}
	}
	// Both directions over the one connection, at the same time.
	go send(a, 8, 9)
	send(b, 9, 8)
	for _, tc := range []struct {
		c    *Collector
		from node.ID
	}{{cb, 8}, {ca, 9}} {
		got := tc.c.WaitFrames(t, len(sizes))
		for i, f := range got {
			if node.ID(f.Header.Sender) != tc.from || f.Header.Key != uint64(i) || len(f.Payload) != sizes[i] || f.Header.Length != uint64(sizes[i]) {
				t.Fatalf("frame %d from %d: %v with %d bytes, want key %d and %d bytes", i, tc.from, &f.Header, len(f.Payload), i, sizes[i])
			}
			if at := wiretest.Check(f.Payload, uint64(tc.from)<<32|uint64(i)); at >= 0 {
				t.Fatalf("frame %d from %d: content differs at byte %d", i, tc.from, at)
			}
		}
	}
	Eventually(t, func() error {
		if n := doneCalls.Load(); n != int32(2*len(sizes)) {
			return fmt.Errorf("%d Done calls, want %d", n, 2*len(sizes))
		}
		return nil
	})
	var total, payload uint64
	for _, n := range sizes {
		total += uint64(frame.HeaderSize + n)
		payload += uint64(n)
	}
	Eventually(t, func() error {
		sa, sb := a.Stats(), b.Stats()
		if len(sa) != 1 || len(sb) != 1 {
			return fmt.Errorf("stats %v / %v", sa, sb)
		}
		// Every frame took some sending and some receiving: every busy
		// time has been counted, and none can exceed the test's age.
		for _, st := range []van.PeerStats{sa[0], sb[0]} {
			for _, busy := range []time.Duration{st.SentBusy, st.ReceivedBusy} {
				if busy <= 0 || busy > time.Since(start) {
					return fmt.Errorf("busy time %v, want within (0, %v]: %+v", busy, time.Since(start), st)
				}
			}
		}
		sa[0].SentBusy, sa[0].ReceivedBusy, sb[0].SentBusy, sb[0].ReceivedBusy = 0, 0, 0, 0
		// Reads depend on how the bytes arrived; at most one per byte.
		for _, st := range []*van.PeerStats{&sa[0], &sb[0]} {
			if st.ReadCalls > st.ReceivedBytes {
				return fmt.Errorf("%d reads for %d bytes: %+v", st.ReadCalls, st.ReceivedBytes, *st)
			}
			st.ReadCalls = 0
			// Writes depend on how much the socket took at once (a 4 MiB
			// frame may take several); at most one per byte. That the
			// sender gathers frames is TestSenderGathersFrames'.
			if st.WriteCalls > st.SentBytes {
				return fmt.Errorf("%d writes for %d bytes: %+v", st.WriteCalls, st.SentBytes, *st)
			}
			st.WriteCalls = 0
		}
		// One connection, or none on a van without them.
		for _, st := range []*van.PeerStats{&sa[0], &sb[0]} {
			if st.Channels > 1 {
				return fmt.Errorf("%d channels by default: %+v", st.Channels, *st)
			}
			st.Channels = 0
		}
		// One Hello from a to b on top of the data frames, as on TCP.
		// The collector has no sink: every payload is copied.
		want := van.PeerStats{Peer: 9, SentBytes: total + frame.HeaderSize, ReceivedBytes: total, SentFrames: uint64(len(sizes)) + 1, ReceivedFrames: uint64(len(sizes)), ReceivedCopiedBytes: payload}
		if sa[0] != want {
			return fmt.Errorf("a's stats %+v, want %+v", sa[0], want)
		}
		want = van.PeerStats{Peer: 8, SentBytes: total, ReceivedBytes: total + frame.HeaderSize, SentFrames: uint64(len(sizes)), ReceivedFrames: uint64(len(sizes)) + 1, ReceivedCopiedBytes: payload}
		if sb[0] != want {
			return fmt.Errorf("b's stats %+v, want %+v", sb[0], want)
		}
		return nil
	})
}

func testPriorityOrderAtReceiver(t *testing.T, l Listen) {
	a, _ := NewVan(t, l, 8, nil)
	b, cb := NewVan(t, l, 9, nil)
	Connect(t, a, 8, b, 9)
	a.SetWeight(9, 0) // queue everything before the sender may run
	r := rand.New(rand.NewPCG(1, 1))
	const n = 200
	for i := range n {
		m := &frame.Message{Header: wiretest.PushHeader(8, 9, uint64(i), 4), Payload: make([]byte, 4)}
		m.Header.Priority = int32(r.IntN(5))
		if err := a.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(20 * time.Millisecond) // time for a sender that ignores the pause to show it
	if s := b.Stats(); len(s) > 0 && s[0].ReceivedFrames > 1 {
		t.Fatalf("frames of a paused flow arrived: %+v", s)
	}
	a.SetWeight(9, 1)
	got := cb.WaitFrames(t, n)
	for i := 1; i < len(got); i++ {
		p, q := &got[i-1].Header, &got[i].Header
		if p.Priority < q.Priority || (p.Priority == q.Priority && p.Key > q.Key) {
			t.Fatalf("frame %d (prio %d key %d) after frame %d (prio %d key %d)", i, q.Priority, q.Key, i-1, p.Priority, p.Key)
		}
	}
}

// Every node sends to every other at once; each pair's frames arrive
// complete, in order, and the handler is never called concurrently.
func testMesh(t *testing.T, l Listen) {
	const nodes, perPair = 6, 30
	vans := make([]van.Transport, nodes)
	cols := make([]*Collector, nodes)
	ids := make([]node.ID, nodes)
	for i := range vans {
		ids[i] = node.ID(8 + i)
		vans[i], cols[i] = NewVan(t, l, ids[i], nil)
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
					p := make([]byte, meshSize(k))
					wiretest.Fill(p, uint64(ids[i])<<40|uint64(ids[j])<<20|k)
					if err := vans[i].Send(&frame.Message{Header: wiretest.PushHeader(ids[i], ids[j], k, len(p)), Payload: p}); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	for i, c := range cols {
		got := c.WaitFrames(t, (nodes-1)*perPair)
		next := map[node.ID]uint64{}
		for _, f := range got {
			from := node.ID(f.Header.Sender)
			if node.ID(f.Header.Recipient) != ids[i] || f.Header.Key != next[from] || len(f.Payload) != meshSize(f.Header.Key) || wiretest.Check(f.Payload, uint64(from)<<40|uint64(ids[i])<<20|f.Header.Key) >= 0 {
				t.Fatalf("node %d: frame %v out of order, misaddressed or corrupted (want key %d from %d)", ids[i], &f.Header, next[from], from)
			}
			next[from]++
		}
	}
}

// meshSize varies frame sizes by key: small, odd and up to 96 KiB.
func meshSize(key uint64) int { return int(key*key*157%(96<<10)) &^ 3 }

func testSink(t *testing.T, l Listen) {
	a, _ := NewVan(t, l, 8, nil)
	col := NewCollector()
	b, err := l(van.Config{Self: 9, ListenAddr: "127.0.0.1:0", Handler: sinkCollector{col}, Logger: Logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	Connect(t, a, 8, b, 9)
	for i, n := range []int{16, 0, 1 << 20} {
		p := make([]byte, n)
		wiretest.Fill(p, uint64(i))
		if err := a.Send(&frame.Message{Header: wiretest.PushHeader(8, 9, uint64(i), n), Payload: p}); err != nil {
			t.Fatal(err)
		}
	}
	got := col.WaitFrames(t, 3)
	for i, f := range got {
		if wiretest.Check(f.Payload, uint64(i)) >= 0 {
			t.Errorf("frame %d corrupted", i)
		}
	}
	col.mu.Lock()
	defer col.mu.Unlock()
	if len(col.sinkBufs) != 2 || col.inSink != 2 {
		t.Errorf("%d sink buffers handed out, %d frames handled in them; want 2 and 2 (the empty payload takes none)", len(col.sinkBufs), col.inSink)
	}
	// The counters say where payloads went: every byte into the sink.
	st := b.Stats()
	if len(st) != 1 || st[0].ReceivedInPlaceBytes != 16+1<<20 || st[0].ReceivedCopiedBytes != 0 {
		t.Errorf("stats %+v; want %d payload bytes received in place, none copied", st, 16+1<<20)
	}
}

// pausedFlow connects van a (node 8) to van b (node 9), pauses a's flow
// to b and queues 10 frames of 64 KiB on it; each frame's Done is
// checked by check, and done counts the calls.
func pausedFlow(t *testing.T, l Listen, check func(err error)) (a, b van.Transport, ca, cb *Collector, done *atomic.Int32) {
	t.Helper()
	a, ca = NewVan(t, l, 8, nil)
	b, cb = NewVan(t, l, 9, nil)
	Connect(t, a, 8, b, 9)
	a.SetWeight(9, 0)
	done = new(atomic.Int32)
	for i := range 10 {
		if err := a.Send(&frame.Message{Header: wiretest.PushHeader(8, 9, uint64(i), 1<<16), Payload: make([]byte, 1<<16), Done: func(err error) {
			check(err)
			done.Add(1)
		}}); err != nil {
			t.Fatal(err)
		}
	}
	return a, b, ca, cb, done
}

func testGracefulClose(t *testing.T, l Listen) {
	// Frames accepted before Close are sent, even from a paused flow.
	a, b, ca, cb, done := pausedFlow(t, l, func(err error) {
		if err != nil {
			t.Errorf("Done(%v) on a graceful close", err)
		}
	})
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	if done.Load() != 10 {
		t.Fatalf("%d Done calls after Close, want 10", done.Load())
	}
	cb.WaitFrames(t, 10)
	leftSayingBye(t, b, ca, cb, "Close")
	if err := a.Send(&frame.Message{Header: wiretest.PushHeader(8, 9, 1, 0)}); !errors.Is(err, van.ErrClosed) {
		t.Fatalf("Send after Close: %v, want ErrClosed", err)
	}
	if err := a.Forward(&frame.Message{Header: wiretest.PushHeader(8, 9, 1, 0)}); !errors.Is(err, van.ErrClosed) {
		t.Fatalf("Forward after Close: %v, want ErrClosed", err)
	}
	if err := a.Dial(context.Background(), 9, b.Addr()); !errors.Is(err, van.ErrClosed) {
		t.Fatalf("Dial after Close: %v, want ErrClosed", err)
	}
}

// leftSayingBye checks that b (node 9) learns that node 8 left by how
// (Close or Abort), and that neither side reports it lost: it said Bye.
func leftSayingBye(t *testing.T, b van.Transport, ca, cb *Collector, how string) {
	t.Helper()
	Eventually(t, func() error {
		if err := b.Send(&frame.Message{Header: wiretest.PushHeader(9, 8, 1, 0)}); !errors.Is(err, van.ErrNoPeer) {
			return fmt.Errorf("Send to a node that left by %s: %v", how, err)
		}
		return nil
	})
	time.Sleep(100 * time.Millisecond) // time for a wrong PeerLost to show
	if l := cb.LostPeers(); len(l) != 0 {
		t.Fatalf("PeerLost though the node that left by %s said Bye: %v", how, l)
	}
	if l := ca.LostPeers(); len(l) != 0 {
		t.Fatalf("PeerLost at the node that left by %s: %v", how, l)
	}
}

// gatedHandler holds the reader of every frame but the first in
// HandleFrame until open is closed.
type gatedHandler struct {
	*Collector
	held atomic.Bool
	open chan struct{}
}

func (g *gatedHandler) HandleFrame(h *frame.Header, p []byte, inPlace bool) {
	if g.held.Swap(true) {
		<-g.open
	}
	g.Collector.HandleFrame(h, p, inPlace)
}

// testByeBehindAFailedWrite: node 9 writes to node 8 after 8 closed, so
// the write fails (the peer's socket is gone), while 8's Bye still waits
// unread behind a frame that 9's handler holds. The Bye, once read, says
// 8 left in order: no PeerLost.
func testByeBehindAFailedWrite(t *testing.T, l Listen) {
	gate := &gatedHandler{Collector: NewCollector(), open: make(chan struct{})}
	openGate := sync.OnceFunc(func() { close(gate.open) })
	defer openGate()
	a, ca := NewVan(t, l, 8, nil)
	b, _ := NewVan(t, l, 9, func(c *van.Config) { c.Handler = gate })
	Connect(t, a, 8, b, 9)
	for i := range 2 { // the first passes, the second holds 9's reader
		if err := a.Send(&frame.Message{Header: wiretest.PushHeader(8, 9, uint64(i), 0)}); err != nil {
			t.Fatal(err)
		}
	}
	gate.WaitFrames(t, 1)
	closed := make(chan error, 1)
	go func() { closed <- a.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close waited for the peer's handler")
	}
	// Write to the closed node until a write fails or the van knows it
	// left; the held reader cannot have read the Bye yet.
	failed := make(chan error, 1)
	Eventually(t, func() error {
		err := b.Send(&frame.Message{Header: wiretest.PushHeader(9, 8, 1, 1<<10), Payload: make([]byte, 1<<10), Done: func(err error) {
			if err != nil {
				select {
				case failed <- err:
				default:
				}
			}
		}})
		if err != nil {
			return nil
		}
		select {
		case err := <-failed:
			t.Logf("a write to the closed node failed: %v", err)
			return nil
		default:
			return errors.New("no write to the closed node failed")
		}
	})
	openGate()
	gate.WaitFrames(t, 2)
	leftSayingBye(t, b, ca, gate.Collector, "Close")
}

// testAbort: what Close would deliver (a paused flow's frames), Abort
// fails; it still says Bye, so the peer does not see the node lost.
func testAbort(t *testing.T, l Listen) {
	a, b, ca, cb, failed := pausedFlow(t, l, func(err error) {
		if !errors.Is(err, van.ErrClosed) {
			t.Errorf("Done(%v) on Abort, want ErrClosed", err)
		}
	})
	if err := a.Abort(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal("Close after Abort:", err)
	}
	if failed.Load() != 10 {
		t.Fatalf("%d Done calls after Abort, want 10", failed.Load())
	}
	leftSayingBye(t, b, ca, cb, "Abort")
	if f := cb.Frames(); len(f) != 0 {
		t.Fatalf("%d frames arrived from an aborted node's paused flow", len(f))
	}
	if err := a.Send(&frame.Message{Header: wiretest.PushHeader(8, 9, 1, 0)}); !errors.Is(err, van.ErrClosed) {
		t.Fatalf("Send after Abort: %v, want ErrClosed", err)
	}
}

func testSendErrors(t *testing.T, l Listen) {
	v, _ := NewVan(t, l, 8, func(c *van.Config) { c.MaxPayload = 1 << 10 })
	if err := v.Send(&frame.Message{Header: wiretest.PushHeader(8, 42, 1, 0)}); !errors.Is(err, van.ErrNoPeer) {
		t.Fatalf("Send to an unknown node: %v", err)
	}
	if err := v.Forward(&frame.Message{Header: wiretest.PushHeader(8, 42, 1, 0)}); !errors.Is(err, van.ErrNoPeer) {
		t.Fatalf("Forward to an unknown node: %v", err)
	}
	if err := v.Send(&frame.Message{Header: wiretest.PushHeader(8, 42, 1, 2048), Payload: make([]byte, 2048)}); err == nil {
		t.Fatal("Send over MaxPayload accepted")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := v.AwaitPeers(ctx, []node.ID{42}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("AwaitPeers of a node that never comes: %v", err)
	}
	// Dialling an address nobody listens on any more.
	gone, _ := NewVan(t, l, 9, nil)
	addr := gone.Addr()
	gone.Close()
	if err := v.Dial(context.Background(), 9, addr); err == nil || !strings.Contains(err.Error(), addr) {
		t.Fatalf("Dial of a closed port: %v", err)
	}
	if _, err := l(van.Config{Self: 9, ListenAddr: v.Addr(), Handler: NewCollector(), Logger: Logger()}); err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("listening on a port in use: %v", err)
	}
}

func testBackPressure(t *testing.T, l Listen) {
	a, _ := NewVan(t, l, 8, func(c *van.Config) { c.PoolBytes = 4096 })
	b, cb := NewVan(t, l, 9, nil)
	Connect(t, a, 8, b, 9)
	a.SetWeight(9, 0)
	msg := func(k uint64) *frame.Message {
		return &frame.Message{Header: wiretest.PushHeader(8, 9, k, 4000), Payload: make([]byte, 4000)}
	}
	if err := a.Send(msg(1)); err != nil {
		t.Fatal(err)
	}
	sent := make(chan error, 1)
	go func() { sent <- a.Send(msg(2)) }()
	select {
	case err := <-sent:
		t.Fatalf("Send over the pool limit returned (%v) without blocking", err)
	case <-time.After(100 * time.Millisecond):
	}
	// Forward never blocks, even over the limit.
	fwd := make(chan error, 1)
	go func() { fwd <- a.Forward(msg(3)) }()
	select {
	case err := <-fwd:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Forward blocked")
	}
	a.SetWeight(9, 1)
	select {
	case err := <-sent:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Send still blocked after the sender drained the pool")
	}
	cb.WaitFrames(t, 3)
}

// A paused flow holds its frames in the pool (counted by QueuedBytes)
// until shaping is switched off, and pauses again when it is switched back
// on.
func testShapingSwitch(t *testing.T, l Listen) {
	a, _ := NewVan(t, l, 8, nil)
	b, cb := NewVan(t, l, 9, nil)
	Connect(t, a, 8, b, 9)
	a.SetWeight(9, 0)
	const n = 1000
	send := func(k uint64) {
		if err := a.Send(&frame.Message{Header: wiretest.PushHeader(8, 9, k, n), Payload: make([]byte, n)}); err != nil {
			t.Fatal(err)
		}
	}
	queued := func(want int64) {
		Eventually(t, func() error {
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
	cb.WaitFrames(t, 2)
	queued(0)
	a.SetShaping(true)
	send(3)
	queued(frame.HeaderSize + n)
	time.Sleep(50 * time.Millisecond) // time for a frame of the paused flow to show
	if got := len(cb.Frames()); got != 2 {
		t.Fatalf("%d frames arrived with the flow paused again, want 2", got)
	}
	a.SetWeight(9, 1)
	cb.WaitFrames(t, 3)
	queued(0)
}

// channelsMod gives a van 4 channels per peer (Config.Channels).
func channelsMod(c *van.Config) { c.Channels = 4 }

// testChannels: with several channels per pair, every frame still arrives
// whole, once, and in the order the layers above rely on: one partition's
// frames in the order sent, and every frame that is not FPT tensor traffic
// in the order sent, in both directions at once, large frames among small.
func testChannels(t *testing.T, l Listen) {
	a, ca := NewVan(t, l, 8, channelsMod)
	b, cb := NewVan(t, l, 9, channelsMod)
	Connect(t, a, 8, b, 9)
	const keys, parts, iters = 3, 5, 4
	send := func(v van.Transport, from, to node.ID) int {
		n := 0
		for it := range uint64(iters) {
			for k := range uint64(keys) {
				for p := range uint32(parts) {
					size := 4 * int(1+(k*131+uint64(p)*977+it*31)%4096)
					if p == 2 && it == 1 {
						size = 1 << 20
					}
					h := wiretest.PushHeader(from, to, k, size)
					h.Partition, h.Iteration = p, it
					if k == 1 {
						h.Type = frame.Result
					}
					pl := make([]byte, size)
					wiretest.Fill(pl, channelSeed(&h))
					if err := v.Send(&frame.Message{Header: h, Payload: pl}); err != nil {
						t.Error(err)
						return n
					}
					n++
				}
				// Classic and App frames, whose order is one stream.
				h := frame.Header{Type: frame.App, Sender: uint32(from), Recipient: uint32(to), Iteration: it*keys + k}
				if err := v.Send(&frame.Message{Header: h, Payload: []byte{byte(k)}}); err != nil {
					t.Error(err)
					return n
				}
				h = frame.Header{Type: frame.KVAck, Sender: uint32(from), Recipient: uint32(to), Key: k + 100, Iteration: it*keys + k}
				if err := v.Send(&frame.Message{Header: h}); err != nil {
					t.Error(err)
					return n
				}
				n += 2
			}
		}
		return n
	}
	var wg sync.WaitGroup
	var nb int
	wg.Go(func() { nb = send(b, 9, 8) })
	na := send(a, 8, 9)
	wg.Wait()
	for _, tc := range []struct {
		c    *Collector
		n    int
		from node.ID
	}{{cb, na, 8}, {ca, nb, 9}} {
		got := tc.c.WaitFrames(t, tc.n)
		if len(got) != tc.n {
			t.Fatalf("%d frames from %d, want %d", len(got), tc.from, tc.n)
		}
		nextIter := map[[2]uint64]uint64{}
		var nextOther uint64
		var others int
		for _, f := range got {
			h := &f.Header
			switch h.Type {
			case frame.Push, frame.Result:
				kp := [2]uint64{h.Key, uint64(h.Partition)}
				if h.Iteration != nextIter[kp] {
					t.Fatalf("from %d: key %d partition %d: iteration %d arrived when %d was due", tc.from, h.Key, h.Partition, h.Iteration, nextIter[kp])
				}
				nextIter[kp]++
				if at := wiretest.Check(f.Payload, channelSeed(h)); at >= 0 {
					t.Fatalf("from %d: %v: content differs at byte %d", tc.from, h, at)
				}
			default:
				if h.Iteration != nextOther {
					t.Fatalf("from %d: %v arrived when iteration %d of the classic and App frames was due", tc.from, h, nextOther)
				}
				if others++; others%2 == 0 {
					nextOther++
				}
			}
		}
	}
}

func channelSeed(h *frame.Header) uint64 {
	return uint64(h.Sender)<<48 | h.Key<<32 | uint64(h.Partition)<<16 | h.Iteration
}

// testChannelsGracefulClose: a node that closes says Bye on every channel
// after its last frame there; the peer gets every frame and sees no loss.
func testChannelsGracefulClose(t *testing.T, l Listen) {
	a, ca := NewVan(t, l, 8, channelsMod)
	b, cb := NewVan(t, l, 9, channelsMod)
	Connect(t, a, 8, b, 9)
	const n = 64
	for i := range uint32(n) {
		h := wiretest.PushHeader(8, 9, uint64(i%3), 1<<14)
		h.Partition = i
		if err := a.Send(&frame.Message{Header: h, Payload: make([]byte, 1<<14)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	cb.WaitFrames(t, n)
	leftSayingBye(t, b, ca, cb, "Close")
}
