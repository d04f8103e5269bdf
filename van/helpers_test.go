package van

import (
	"github.com/fptps/fpt/node"

	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/fptps/fpt/frame"
)

var kinds = []string{KindEpoll, KindNetConn}

// forKinds runs f as a subtest per kind of van.
func forKinds(t *testing.T, f func(t *testing.T, kind string)) {
	for _, k := range kinds {
		t.Run(k, func(t *testing.T) { f(t, k) })
	}
}

// testLogger discards, unless FPT_TEST_LOG is set (then Debug to stderr).
func testLogger() *slog.Logger {
	if os.Getenv("FPT_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// rx is a received frame, payload copied.
type rx struct {
	h frame.Header
	p []byte
}

type lost struct {
	peer node.ID
	err  error
}

// collector is a Handler that records what arrives. With check set it
// calls it instead of copying payloads.
type collector struct {
	mu     sync.Mutex
	frames []rx
	lost   []lost
	n      int
	check  func(h *frame.Header, p []byte)
	notify chan struct{}
}

func newCollector() *collector { return &collector{notify: make(chan struct{}, 1)} }

func (c *collector) HandleFrame(h *frame.Header, p []byte) {
	c.mu.Lock()
	if c.check != nil {
		c.check(h, p)
	} else {
		c.frames = append(c.frames, rx{*h, append([]byte(nil), p...)})
	}
	c.n++
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
	case c.notify <- struct{}{}:
	default:
	}
}

// waitFor polls cond (under the collector's lock) until it holds.
func (c *collector) waitFor(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		c.mu.Lock()
		ok := cond()
		c.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-c.notify:
		case <-time.After(20 * time.Millisecond):
		case <-deadline:
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
	}
}

func (c *collector) waitFrames(t testing.TB, n int) []rx {
	t.Helper()
	c.waitFor(t, fmt.Sprintf("%d frames", n), 30*time.Second, func() bool { return c.n >= n })
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]rx(nil), c.frames...)
}

func (c *collector) lostEvents() []lost {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]lost(nil), c.lost...)
}

// newVan starts a van on a free loopback port; mod may adjust the config.
func newVan(t testing.TB, kind string, self node.ID, mod func(*Config)) (Transport, *collector) {
	t.Helper()
	col := newCollector()
	cfg := Config{Self: self, ListenAddr: "127.0.0.1:0", Handler: col, Logger: testLogger(), IOTimeout: 5 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	v, err := New(kind, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Close() })
	return v, col
}

// connect has a dial b and waits until both see each other.
func connect(t testing.TB, a Transport, aID node.ID, b Transport, bID node.ID) {
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

// fill writes a pattern determined by seed; check verifies it.
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

// pushHeader is a valid header of a float32 tensor frame of n bytes.
func pushHeader(from, to node.ID, key uint64, n int) frame.Header {
	return frame.Header{Type: frame.Push, DType: frame.Float32, Sender: uint32(from), Recipient: uint32(to), Key: key, Total: uint64(n), Length: uint64(n)}
}

// encode returns a frame's bytes as they go on the wire.
func encode(h frame.Header, payload []byte) []byte {
	h.Length = uint64(len(payload))
	b := make([]byte, frame.HeaderSize+len(payload))
	h.Encode(b)
	copy(b[frame.HeaderSize:], payload)
	return b
}

// rawPeer connects a plain socket to addr and, if from != 0, says Hello.
func rawPeer(t testing.TB, addr string, from, to node.ID) *net.TCPConn {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	if from != 0 {
		if _, err := nc.Write(encode(frame.Header{Type: frame.Hello, Sender: uint32(from), Recipient: uint32(to)}, nil)); err != nil {
			t.Fatal(err)
		}
	}
	return nc.(*net.TCPConn)
}

// waitClosed reads from nc until the van closes it.
func waitClosed(t testing.TB, nc net.Conn) {
	t.Helper()
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := io.Copy(io.Discard, nc)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("the van did not close the connection")
	}
}

// eventually polls f until it returns nil or timeout passes.
func eventually(t testing.TB, timeout time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
