//go:build !race

package van

import (
	"testing"
	"time"

	"github.com/fptps/fpt/frame"
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
		big := func(c *Config) { c.MaxPayload = 3 << 30; c.IOTimeout = 30 * time.Second }
		a, _ := newVan(t, kind, 8, big)
		b, cb := newVan(t, kind, 9, big)
		var got struct {
			n      int
			sample []byte
		}
		cb.check = func(h *frame.Header, p []byte) {
			got.n = len(p)
			for _, i := range samples {
				got.sample = append(got.sample, p[i])
			}
		}
		connect(t, a, 8, b, 9)
		payload := make([]byte, size)
		for k, i := range samples {
			payload[i] = byte(k*37 + 1)
		}
		done := make(chan error, 1)
		start := time.Now()
		if err := a.Send(&Message{Header: pushHeader(8, 9, 1, size), Payload: payload, Done: func(err error) { done <- err }}); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		cb.waitFor(t, "the frame", 2*time.Minute, func() bool { return cb.n == 1 })
		t.Logf("%s: 2 GiB + 8 in %v", kind, time.Since(start))
		if got.n != size {
			t.Fatalf("received %d bytes, want %d", got.n, size)
		}
		for k := range samples {
			if want := byte(k*37 + 1); got.sample[k] != want {
				t.Fatalf("byte %d = %d, want %d", samples[k], got.sample[k], want)
			}
		}
		a.Close()
		b.Close()
	})
}
