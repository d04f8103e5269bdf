package van_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/van"
	"github.com/fptps/fpt/van/internal/wiretest"
	"github.com/fptps/fpt/van/vantest"
)

func TestBadConnectionsDoNotHurt(t *testing.T) {
	forKinds(t, func(t *testing.T, kind string) {
		const self = 8
		v, col := newVan(t, kind, self, func(c *van.Config) { c.IOTimeout = 500 * time.Millisecond; c.MaxPayload = 1 << 20 })
		hello := wiretest.Encode(frame.Header{Type: frame.Hello, Sender: 9, Recipient: self}, nil)
		badMagic := append([]byte(nil), hello...)
		badMagic[0] = 'X'
		badSum := append([]byte(nil), hello...)
		badSum[69] ^= 0xff
		big := frame.Header{Type: frame.Hello, Sender: 9, Recipient: self, Length: 1 << 40}
		bigBytes := make([]byte, frame.HeaderSize)
		big.Encode(bigBytes)
		garbage := make([]byte, 4096)
		wiretest.Fill(garbage, 1)
		tests := []struct {
			name      string
			data      []byte
			halfClose bool // then send FIN
		}{
			{"garbage", garbage, false},
			{"http request", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n" + strings.Repeat("x", 100)), false},
			{"truncated header", hello[:30], true},
			{"oversized length", bigBytes, false},
			{"wrong magic", badMagic, false},
			{"bad checksum", badSum, false},
			{"data before hello", wiretest.Encode(wiretest.PushHeader(9, self, 1, 4), make([]byte, 4)), false},
			{"hello to another node", wiretest.Encode(frame.Header{Type: frame.Hello, Sender: 9, Recipient: 99}, nil), false},
			{"silence", nil, false},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				nc := rawPeer(t, v.Addr(), 0, 0)
				if len(tc.data) > 0 {
					if _, err := nc.Write(tc.data); err != nil {
						t.Fatal(err)
					}
				}
				if tc.halfClose {
					nc.CloseWrite()
				}
				waitClosed(t, nc)
			})
		}
		// The van still serves a real peer, and none of the above was a peer.
		p, _ := newVan(t, kind, 9, nil)
		vantest.Connect(t, p, 9, v, self)
		if err := p.Send(&frame.Message{Header: wiretest.PushHeader(9, self, 7, 8), Payload: make([]byte, 8)}); err != nil {
			t.Fatal(err)
		}
		if got := col.WaitFrames(t, 1); got[0].Header.Key != 7 {
			t.Fatalf("got %v", &got[0].Header)
		}
		if l := col.LostPeers(); len(l) != 0 {
			t.Fatalf("PeerLost for connections that never said hello: %v", l)
		}
	})
}

func TestPeerMisbehaves(t *testing.T) {
	const self, peer = 8, 9
	tests := []struct {
		name string
		act  func(t *testing.T, nc *net.TCPConn)
		want error // nil: any
	}{
		{"garbage after hello", func(t *testing.T, nc *net.TCPConn) {
			nc.Write(make([]byte, 100))
		}, frame.ErrMagic},
		{"frame from another node", func(t *testing.T, nc *net.TCPConn) {
			nc.Write(wiretest.Encode(wiretest.PushHeader(11, self, 1, 4), make([]byte, 4)))
		}, van.ErrProtocol},
		{"oversized length", func(t *testing.T, nc *net.TCPConn) {
			h := wiretest.PushHeader(peer, self, 1, 0)
			h.Length, h.Total = 1<<30, 1<<30
			b := make([]byte, frame.HeaderSize)
			h.Encode(b)
			nc.Write(b)
		}, frame.ErrTooLarge},
		{"killed mid-frame", func(t *testing.T, nc *net.TCPConn) {
			b := wiretest.Encode(wiretest.PushHeader(peer, self, 1, 4096), make([]byte, 4096))
			nc.Write(b[:1000])
			nc.Close()
		}, nil},
		{"killed between frames", func(t *testing.T, nc *net.TCPConn) {
			nc.Write(wiretest.Encode(wiretest.PushHeader(peer, self, 1, 4), make([]byte, 4)))
			nc.Close()
		}, nil},
		{"reset", func(t *testing.T, nc *net.TCPConn) {
			nc.SetLinger(0)
			nc.Close()
		}, nil},
	}
	forKinds(t, func(t *testing.T, kind string) {
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				v, col := newVan(t, kind, self, func(c *van.Config) { c.MaxPayload = 1 << 20 })
				nc := rawPeer(t, v.Addr(), peer, self)
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if err := v.AwaitPeers(ctx, []node.ID{peer}); err != nil {
					t.Fatal(err)
				}
				tc.act(t, nc)
				col.WaitLost(t, 1)
				time.Sleep(100 * time.Millisecond) // a second report would show by now
				l := col.LostPeers()
				if len(l) != 1 || l[0].Peer != peer || l[0].Err == nil {
					t.Fatalf("PeerLost calls %v, want one for node %d", l, peer)
				}
				if tc.want != nil && !errors.Is(l[0].Err, tc.want) {
					t.Fatalf("reason %v, want %v", l[0].Err, tc.want)
				}
				if err := v.Send(&frame.Message{Header: wiretest.PushHeader(self, peer, 1, 0)}); !errors.Is(err, van.ErrNoPeer) {
					t.Fatalf("Send to a lost peer: %v, want ErrNoPeer", err)
				}
			})
		}
	})
}

// stalledPeer returns a van with a short IOTimeout connected to a raw peer
// that never reads, with a small receive buffer so that writes stall soon.
func stalledPeer(t *testing.T, kind string, self, peer node.ID, ioTimeout time.Duration) (van.Transport, *vantest.Collector) {
	t.Helper()
	v, col := newVan(t, kind, self, func(c *van.Config) { c.IOTimeout = ioTimeout })
	nc := rawPeer(t, v.Addr(), peer, self)
	nc.SetReadBuffer(4 << 10)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := v.AwaitPeers(ctx, []node.ID{peer}); err != nil {
		t.Fatal(err)
	}
	return v, col
}

// TestStalledPeer: a peer that stops reading is lost after IOTimeout
// without progress, and the frames for it fail.
func TestStalledPeer(t *testing.T) {
	forKinds(t, func(t *testing.T, kind string) {
		const self, peer = 8, 9
		v, col := stalledPeer(t, kind, self, peer, 300*time.Millisecond)
		var ok, failed atomic.Int32
		payload := make([]byte, 16<<20)
		const n = 8
		for i := 0; i < n; i++ {
			err := v.Send(&frame.Message{Header: wiretest.PushHeader(self, peer, uint64(i), len(payload)), Payload: payload, Done: func(err error) {
				if err != nil {
					failed.Add(1)
				} else {
					ok.Add(1)
				}
			}})
			if err != nil && !errors.Is(err, van.ErrNoPeer) {
				t.Fatal(err)
			}
			if err != nil {
				failed.Add(1) // not queued, no Done
			}
		}
		col.WaitLost(t, 1)
		if l := col.LostPeers(); !errors.Is(l[0].Err, van.ErrStalled) {
			t.Fatalf("reason %v, want a stalled write", l[0].Err)
		}
		vantest.Eventually(t, func() error {
			if ok.Load()+failed.Load() != n || failed.Load() == 0 {
				return fmt.Errorf("%d Done(nil), %d failed; want %d in all, some failed", ok.Load(), failed.Load(), n)
			}
			return nil
		})
	})
}

// TestClosingOnAStalledPeer: a peer that does not read keeps the pool
// from draining. Close gives up after IOTimeout (300 ms here); Abort, a
// failed node's, does not wait for it at all (IOTimeout is an hour here,
// which Close would wait). Either way every queued frame's Done is
// called, some with a failure.
func TestClosingOnAStalledPeer(t *testing.T) {
	for _, tc := range []struct {
		name      string
		ioTimeout time.Duration
		close     func(van.Transport) error
		within    time.Duration // far above what it takes, far below what waiting would
	}{
		{"Close", 300 * time.Millisecond, van.Transport.Close, 5 * time.Second},
		{"Abort", time.Hour, van.Transport.Abort, 30 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			forKinds(t, func(t *testing.T, kind string) {
				const self, peer = 8, 9
				v, _ := stalledPeer(t, kind, self, peer, tc.ioTimeout)
				var calls, failed atomic.Int32
				payload := make([]byte, 4<<20)
				const n = 16
				for i := 0; i < n; i++ {
					if err := v.Send(&frame.Message{Header: wiretest.PushHeader(self, peer, uint64(i), len(payload)), Payload: payload, Done: func(err error) {
						calls.Add(1)
						if err != nil {
							failed.Add(1)
						}
					}}); err != nil {
						t.Fatal(err)
					}
				}
				closed := make(chan error, 1)
				go func() { closed <- tc.close(v) }()
				select {
				case err := <-closed:
					if err != nil {
						t.Fatal(err)
					}
				case <-time.After(tc.within):
					t.Fatalf("%s still waiting after %v for a peer that does not read", tc.name, tc.within)
				}
				if calls.Load() != n || failed.Load() == 0 {
					t.Fatalf("%d Done calls (%d failed), want %d with failures", calls.Load(), failed.Load(), n)
				}
			})
		})
	}
}

// TestNewErrors: what the contract (TestContract) cannot know of package
// van's constructor: its errors name it, and it knows its kinds.
func TestNewErrors(t *testing.T) {
	forKinds(t, func(t *testing.T, kind string) {
		v, _ := newVan(t, kind, 8, nil)
		_, err := van.New(kind, van.Config{Self: 9, ListenAddr: v.Addr(), Handler: vantest.NewCollector(), Logger: vantest.Logger()})
		if err == nil || !strings.Contains(err.Error(), "address already in use") || !strings.HasPrefix(err.Error(), "van: listen") {
			t.Fatalf("listening on a port in use: %v", err)
		}
		if _, err := van.New("carrier-pigeon", van.Config{Handler: vantest.NewCollector()}); err == nil {
			t.Fatal("unknown kind accepted")
		}
	})
}

// TestEpollGoroutinesConstant: the epoll van's goroutines do not grow with
// its peers.
func TestEpollGoroutinesConstant(t *testing.T) {
	const self = 8
	v, col := newVan(t, van.KindEpoll, self, nil)
	addPeers := func(from, to node.ID) {
		for id := from; id < to; id++ {
			nc := rawPeer(t, v.Addr(), id, self)
			if _, err := nc.Write(wiretest.Encode(wiretest.PushHeader(id, self, uint64(id), 4), make([]byte, 4))); err != nil {
				t.Fatal(err)
			}
		}
		col.WaitFrames(t, int(to-9))
	}
	addPeers(9, 10)
	one := settledGoroutines()
	addPeers(10, 17)
	if s := v.Stats(); len(s) != 8 {
		t.Fatalf("%d peers, want 8", len(s))
	}
	// A connection's transient goroutines may outlive a 10 ms settle on a
	// loaded machine; one per peer would stay.
	vantest.Eventually(t, func() error {
		if eight := runtime.NumGoroutine(); eight > one {
			return fmt.Errorf("%d goroutines with 8 peers, %d with 1", eight, one)
		}
		return nil
	})
}

// settledGoroutines is the goroutine count once transient ones are gone.
func settledGoroutines() int {
	n := runtime.NumGoroutine()
	for i := 0; i < 50; i++ {
		time.Sleep(10 * time.Millisecond)
		m := runtime.NumGoroutine()
		if m == n {
			return n
		}
		n = m
	}
	return n
}

func openFDs(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd:", err)
	}
	return len(es)
}

// TestCloseReleasesEverything: after Close, goroutines and fds return to
// what they were.
func TestCloseReleasesEverything(t *testing.T) {
	forKinds(t, func(t *testing.T, kind string) {
		// Warm up the runtime's own poller so its fds do not count.
		if l, err := net.Listen("tcp", "127.0.0.1:0"); err == nil {
			l.Close()
		}
		g0, fd0 := settledGoroutines(), openFDs(t)
		for round := 0; round < 2; round++ {
			a, _ := newVan(t, kind, 8, nil)
			b, cb := newVan(t, kind, 9, nil)
			c, cc := newVan(t, kind, 10, nil)
			vantest.Connect(t, a, 8, b, 9)
			vantest.Connect(t, a, 8, c, 10)
			vantest.Connect(t, b, 9, c, 10)
			raw := rawPeer(t, a.Addr(), 0, 0) // a connection that never says hello
			for _, to := range []node.ID{9, 10} {
				if err := a.Send(&frame.Message{Header: wiretest.PushHeader(8, to, 1, 1024), Payload: make([]byte, 1024)}); err != nil {
					t.Fatal(err)
				}
			}
			cb.WaitFrames(t, 1)
			cc.WaitFrames(t, 1)
			for _, v := range []van.Transport{a, b, c} {
				v.Close()
			}
			raw.Close()
		}
		vantest.Eventually(t, func() error {
			if g := runtime.NumGoroutine(); g != g0 {
				return fmt.Errorf("%d goroutines after Close, %d before", g, g0)
			}
			if n := openFDs(t); n != fd0 {
				return fmt.Errorf("%d fds open after Close, %d before", n, fd0)
			}
			return nil
		})
	})
}
