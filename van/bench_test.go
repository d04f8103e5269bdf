package van_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/van"
	"github.com/fptps/fpt/van/internal/wiretest"
	"github.com/fptps/fpt/van/vantest"
)

// countHandler counts frames and signals when a target is reached.
type countHandler struct {
	n      atomic.Int64
	target atomic.Int64
	done   chan struct{}
}

func (h *countHandler) HandleFrame(*frame.Header, []byte, bool) {
	if h.n.Add(1) == h.target.Load() {
		h.done <- struct{}{}
	}
}

func (h *countHandler) PeerLost(node.ID, error) {}

// BenchmarkVan: N sender vans push frames to one receiver van over
// loopback; a frame counts once the receiver's handler has it.
func BenchmarkVan(b *testing.B) {
	for _, kind := range kinds {
		for _, size := range []int{64 << 10, 4 << 20} {
			for _, peers := range []int{1, 4} {
				name := fmt.Sprintf("%s/%dKiB/peers=%d", kind, size>>10, peers)
				if size >= 1<<20 {
					name = fmt.Sprintf("%s/%dMiB/peers=%d", kind, size>>20, peers)
				}
				b.Run(name, func(b *testing.B) { benchVan(b, kind, size, peers) })
			}
		}
	}
}

func benchVan(b *testing.B, kind string, size, peers int) {
	h := &countHandler{done: make(chan struct{}, 1)}
	recv, err := van.New(kind, van.Config{Self: 8, ListenAddr: "127.0.0.1:0", Handler: h, Logger: vantest.Logger(), MaxPayload: 64 << 20})
	if err != nil {
		b.Fatal(err)
	}
	defer recv.Close()
	senders := make([]van.Transport, peers)
	for i := range senders {
		id := node.ID(9 + i)
		s, _ := newVan(b, kind, id, func(c *van.Config) { c.PoolBytes = 64 << 20; c.MaxPayload = 64 << 20 })
		defer s.Close()
		vantest.Connect(b, s, id, recv, 8)
		senders[i] = s
	}
	payload := make([]byte, size)
	b.SetBytes(int64(size))
	b.ResetTimer()
	h.n.Store(0)
	h.target.Store(int64(b.N))
	var wg sync.WaitGroup
	for i, s := range senders {
		id := node.ID(9 + i)
		wg.Go(func() {
			for k := i; k < b.N; k += peers {
				if err := s.Send(&frame.Message{Header: wiretest.PushHeader(id, 8, uint64(k), size), Payload: payload}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	select {
	case <-h.done:
	case <-time.After(time.Minute):
		b.Fatalf("received %d of %d frames", h.n.Load(), b.N)
	}
	b.StopTimer()
}

// BenchmarkRawTCP is the baseline: one loopback TCP stream, header and
// payload written per frame, read with io.ReadFull into a reused buffer.
func BenchmarkRawTCP(b *testing.B) {
	for _, size := range []int{64 << 10, 4 << 20} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			got := make(chan error, 1)
			go func() {
				c, err := l.Accept()
				if err != nil {
					got <- err
					return
				}
				defer c.Close()
				hdr := make([]byte, frame.HeaderSize)
				buf := make([]byte, size)
				for i := 0; i < b.N; i++ {
					if _, err := io.ReadFull(c, hdr); err != nil {
						got <- err
						return
					}
					if _, err := io.ReadFull(c, buf); err != nil {
						got <- err
						return
					}
				}
				got <- nil
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			c, err := (&net.Dialer{}).DialContext(ctx, "tcp", l.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			hdr := make([]byte, frame.HeaderSize)
			payload := make([]byte, size)
			b.SetBytes(int64(size))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				bufs := net.Buffers{hdr, payload}
				if _, err := bufs.WriteTo(c); err != nil {
					b.Fatal(err)
				}
			}
			if err := <-got; err != nil {
				b.Fatal(err)
			}
		})
	}
}
