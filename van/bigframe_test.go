//go:build !race

package van_test

import (
	"runtime/debug"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/van"
	"github.com/fptps/fpt/van/internal/wiretest"
	"github.com/fptps/fpt/van/vantest"
)

// TestFrameOver2GiB sends one frame whose payload is 2 GiB + 8 bytes: one
// write and one read of that size are capped by Linux at about 2 GiB, and
// 32-bit lengths break there. Not built with -race (the detector would
// shadow 4 GiB more memory and take minutes).
func TestFrameOver2GiB(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 2 GiB; skipped with -short")
	}
	const size = 2<<30 + 8
	samples := []int{0, 1, 1 << 20, 1<<31 - 1, 1 << 31, 1<<31 + 1, size - 1}
	forKinds(t, func(t *testing.T, kind string) {
		// The stall bound is a liveness bound here: beside the tests
		// package's 2 GiB jobs, page reclaim can hold a side of this
		// one for tens of seconds on CI's 2 cores.
		big := func(c *van.Config) { c.MaxPayload = 3 << 30; c.IOTimeout = 2 * time.Minute }
		// The kind before's payload and receive buffers (6 GiB) go back
		// to the system before this one allocates its own.
		t.Cleanup(debug.FreeOSMemory)
		a, _ := newVan(t, kind, 8, big)
		got := &sampler{at: samples, frames: make(chan sample, 1)}
		b, _ := newVan(t, kind, 9, func(c *van.Config) { big(c); c.Handler = got })
		vantest.Connect(t, a, 8, b, 9)
		payload := make([]byte, size)
		for k, i := range samples {
			payload[i] = byte(k*37 + 1)
		}
		done := make(chan error, 1)
		start := time.Now()
		if err := a.Send(&frame.Message{Header: wiretest.PushHeader(8, 9, 1, size), Payload: payload, Done: func(err error) { done <- err }}); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		var f sample
		select {
		case f = <-got.frames:
		case <-time.After(5 * time.Minute):
			// A liveness bound, not a speed one: on CI's 2 cores, beside
			// the tests package, netconn once took over 2 minutes.
			t.Fatal("timed out after 5m0s waiting for the frame")
		}
		t.Logf("%s: 2 GiB + 8 in %v", kind, time.Since(start))
		if f.n != size {
			t.Fatalf("received %d bytes, want %d", f.n, size)
		}
		for k := range samples {
			if want := byte(k*37 + 1); f.bytes[k] != want {
				t.Fatalf("byte %d = %d, want %d", samples[k], f.bytes[k], want)
			}
		}
		a.Close()
		b.Close()
		if n := got.count.Load(); n != 1 {
			t.Fatalf("%d frames handled, want 1", n)
		}
	})
}

// sampler is a van.Handler that keeps, of each frame, its size and the
// bytes at offsets at: a copy of 2 GiB would only cost time and memory.
type sampler struct {
	at     []int
	count  atomic.Int32
	frames chan sample
}

type sample struct {
	n     int
	bytes []byte
}

func (s *sampler) HandleFrame(h *frame.Header, p []byte, _ bool) {
	s.count.Add(1)
	f := sample{n: len(p)}
	for _, i := range s.at {
		if i < len(p) {
			f.bytes = append(f.bytes, p[i])
		}
	}
	select {
	case s.frames <- f:
	default:
	}
}

func (s *sampler) PeerLost(node.ID, error) {}
