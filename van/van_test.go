package van

import (
	"github.com/fptps/fpt/node"

	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fptps/fpt/frame"
)

func TestRoundTrip(t *testing.T) {
	forKinds(t, func(t *testing.T, kind string) {
		start := time.Now()
		a, ca := newVan(t, kind, 8, nil)
		b, cb := newVan(t, kind, 9, nil)
		connect(t, a, 8, b, 9)
		sizes := []int{0, 4, 64 << 10, 4 << 20, 12, 0}
		var doneCalls atomic.Int32
		send := func(v Transport, from, to node.ID) {
			for i, n := range sizes {
				p := make([]byte, n)
				fill(p, uint64(from)<<32|uint64(i))
				m := &Message{Header: pushHeader(0, to, uint64(i), n), Payload: p, Done: func(err error) {
					if err != nil {
						t.Errorf("Done(%v)", err)
					}
					doneCalls.Add(1)
				}}
				m.Header.Length = 12345 // the van sets it
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
		eventually(t, 5*time.Second, func() error {
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
		eventually(t, 5*time.Second, func() error {
			sa, sb := a.Stats(), b.Stats()
			if len(sa) != 1 || len(sb) != 1 {
				return fmt.Errorf("stats %v / %v", sa, sb)
			}
			// Frames with a payload take two reads at least (the
			// header is read on its own) and a write each: every busy
			// time has been counted, and none can exceed the test's age.
			for _, st := range []PeerStats{sa[0], sb[0]} {
				for _, busy := range []time.Duration{st.SentBusy, st.ReceivedBusy} {
					if busy <= 0 || busy > time.Since(start) {
						return fmt.Errorf("busy time %v, want within (0, %v]: %+v", busy, time.Since(start), st)
					}
				}
			}
			sa[0].SentBusy, sa[0].ReceivedBusy, sb[0].SentBusy, sb[0].ReceivedBusy = 0, 0, 0, 0
			// One Hello from a to b on top of the data frames.
			// The collector has no Sink: every payload byte is copied.
			want := PeerStats{Peer: 9, SentBytes: total + frame.HeaderSize, ReceivedBytes: total, SentFrames: uint64(len(sizes)) + 1, ReceivedFrames: uint64(len(sizes)), ReceivedCopiedBytes: payload}
			if sa[0] != want {
				return fmt.Errorf("a's stats %+v, want %+v", sa[0], want)
			}
			want = PeerStats{Peer: 8, SentBytes: total, ReceivedBytes: total + frame.HeaderSize, SentFrames: uint64(len(sizes)), ReceivedFrames: uint64(len(sizes)) + 1, ReceivedCopiedBytes: payload}
			if sb[0] != want {
				return fmt.Errorf("b's stats %+v, want %+v", sb[0], want)
			}
			return nil
		})
	})
}

func TestPriorityOrderAtReceiver(t *testing.T) {
	forKinds(t, func(t *testing.T, kind string) {
		a, _ := newVan(t, kind, 8, nil)
		b, cb := newVan(t, kind, 9, nil)
		connect(t, a, 8, b, 9)
		// Pausing the flow queues everything before the sender may run.
		a.SetWeight(9, 0)
		r := rand.New(rand.NewPCG(1, 1))
		const n = 200
		for i := 0; i < n; i++ {
			m := &Message{Header: pushHeader(8, 9, uint64(i), 4), Payload: make([]byte, 4)}
			m.Header.Priority = int32(r.IntN(5))
			if err := a.Send(m); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(20 * time.Millisecond)
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
	})
}

func TestMesh(t *testing.T) {
	forKinds(t, func(t *testing.T, kind string) {
		const nodes = 6
		const perPair = 25
		vans := make([]Transport, nodes)
		cols := make([]*collector, nodes)
		ids := make([]node.ID, nodes)
		var bad atomic.Int32
		for i := range vans {
			ids[i] = node.ID(8 + i)
			vans[i], cols[i] = newVan(t, kind, ids[i], nil)
			self := ids[i]
			cols[i].check = func(h *frame.Header, p []byte) {
				if node.ID(h.Recipient) != self || check(p, seedOf(node.ID(h.Sender), node.ID(h.Recipient), h.Key)) >= 0 || len(p) != sizeOf(h.Key) {
					bad.Add(1)
				}
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for i := range vans {
			for j := i + 1; j < nodes; j++ {
				if err := vans[i].Dial(ctx, ids[j], vans[j].Addr()); err != nil {
					t.Fatal(err)
				}
			}
		}
		for i := range vans {
			var others []node.ID
			for j := range vans {
				if j != i {
					others = append(others, ids[j])
				}
			}
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
					for k := uint64(0); k < perPair; k++ {
						p := make([]byte, sizeOf(k))
						fill(p, seedOf(ids[i], ids[j], k))
						if err := vans[i].Send(&Message{Header: pushHeader(ids[i], ids[j], k, len(p)), Payload: p}); err != nil {
							t.Error(err)
							return
						}
					}
				})
			}
		}
		wg.Wait()
		for i := range cols {
			cols[i].waitFor(t, "all frames", 30*time.Second, func() bool { return cols[i].n == (nodes-1)*perPair })
		}
		if n := bad.Load(); n > 0 {
			t.Fatalf("%d frames arrived corrupted or misaddressed", n)
		}
	})
}

func seedOf(from, to node.ID, key uint64) uint64 { return uint64(from)<<40 | uint64(to)<<20 | key }

// sizeOf varies frame sizes by key: small, odd and up to 96 KiB.
func sizeOf(key uint64) int { return int(key*key*157%(96<<10)) &^ 3 }

func TestBadConnectionsDoNotHurt(t *testing.T) {
	forKinds(t, func(t *testing.T, kind string) {
		const self = 8
		v, col := newVan(t, kind, self, func(c *Config) { c.IOTimeout = 500 * time.Millisecond; c.MaxPayload = 1 << 20 })
		hello := encode(frame.Header{Type: frame.Hello, Sender: 9, Recipient: self}, nil)
		badMagic := append([]byte(nil), hello...)
		badMagic[0] = 'X'
		badSum := append([]byte(nil), hello...)
		badSum[69] ^= 0xff
		big := frame.Header{Type: frame.Hello, Sender: 9, Recipient: self, Length: 1 << 40}
		bigBytes := make([]byte, frame.HeaderSize)
		big.Encode(bigBytes)
		garbage := make([]byte, 4096)
		fill(garbage, 1)
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
			{"data before hello", encode(pushHeader(9, self, 1, 4), make([]byte, 4)), false},
			{"hello to another node", encode(frame.Header{Type: frame.Hello, Sender: 9, Recipient: 99}, nil), false},
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
		connect(t, p, 9, v, self)
		if err := p.Send(&Message{Header: pushHeader(9, self, 7, 8), Payload: make([]byte, 8)}); err != nil {
			t.Fatal(err)
		}
		if got := col.waitFrames(t, 1); got[0].h.Key != 7 {
			t.Fatalf("got %v", &got[0].h)
		}
		if l := col.lostEvents(); len(l) != 0 {
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
			nc.Write(encode(pushHeader(11, self, 1, 4), make([]byte, 4)))
		}, errProtocol},
		{"oversized length", func(t *testing.T, nc *net.TCPConn) {
			h := pushHeader(peer, self, 1, 0)
			h.Length, h.Total = 1<<30, 1<<30
			b := make([]byte, frame.HeaderSize)
			h.Encode(b)
			nc.Write(b)
		}, frame.ErrTooLarge},
		{"killed mid-frame", func(t *testing.T, nc *net.TCPConn) {
			b := encode(pushHeader(peer, self, 1, 4096), make([]byte, 4096))
			nc.Write(b[:1000])
			nc.Close()
		}, nil},
		{"killed between frames", func(t *testing.T, nc *net.TCPConn) {
			nc.Write(encode(pushHeader(peer, self, 1, 4), make([]byte, 4)))
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
				v, col := newVan(t, kind, self, func(c *Config) { c.MaxPayload = 1 << 20 })
				nc := rawPeer(t, v.Addr(), peer, self)
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if err := v.AwaitPeers(ctx, []node.ID{peer}); err != nil {
					t.Fatal(err)
				}
				tc.act(t, nc)
				col.waitFor(t, "PeerLost", 10*time.Second, func() bool { return len(col.lost) > 0 })
				time.Sleep(100 * time.Millisecond) // a second report would show by now
				l := col.lostEvents()
				if len(l) != 1 || l[0].peer != peer || l[0].err == nil {
					t.Fatalf("PeerLost calls %v, want one for node %d", l, peer)
				}
				if tc.want != nil && !errors.Is(l[0].err, tc.want) {
					t.Fatalf("reason %v, want %v", l[0].err, tc.want)
				}
				if err := v.Send(&Message{Header: pushHeader(self, peer, 1, 0)}); !errors.Is(err, ErrNoPeer) {
					t.Fatalf("Send to a lost peer: %v, want ErrNoPeer", err)
				}
			})
		}
	})
}

// stalledPeer returns a van with a short IOTimeout connected to a raw peer
// that never reads, with a small receive buffer so that writes stall soon.
func stalledPeer(t *testing.T, kind string, self, peer node.ID) (Transport, *collector) {
	t.Helper()
	v, col := newVan(t, kind, self, func(c *Config) { c.IOTimeout = 300 * time.Millisecond })
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
		v, col := stalledPeer(t, kind, self, peer)
		var ok, failed atomic.Int32
		payload := make([]byte, 16<<20)
		const n = 8
		for i := 0; i < n; i++ {
			err := v.Send(&Message{Header: pushHeader(self, peer, uint64(i), len(payload)), Payload: payload, Done: func(err error) {
				if err != nil {
					failed.Add(1)
				} else {
					ok.Add(1)
				}
			}})
			if err != nil && !errors.Is(err, ErrNoPeer) {
				t.Fatal(err)
			}
			if err != nil {
				failed.Add(1) // not queued, no Done
			}
		}
		col.waitFor(t, "PeerLost", 10*time.Second, func() bool { return len(col.lost) > 0 })
		if l := col.lostEvents(); !errors.Is(l[0].err, errStalled) {
			t.Fatalf("reason %v, want a stalled write", l[0].err)
		}
		eventually(t, 5*time.Second, func() error {
			if ok.Load()+failed.Load() != n || failed.Load() == 0 {
				return fmt.Errorf("%d Done(nil), %d failed; want %d in all, some failed", ok.Load(), failed.Load(), n)
			}
			return nil
		})
	})
}

func TestGracefulClose(t *testing.T) {
	forKinds(t, func(t *testing.T, kind string) {
		a, ca := newVan(t, kind, 8, nil)
		b, cb := newVan(t, kind, 9, nil)
		connect(t, a, 8, b, 9)
		// Frames accepted before Close are sent, even from a paused flow.
		a.SetWeight(9, 0)
		var done atomic.Int32
		for i := 0; i < 10; i++ {
			if err := a.Send(&Message{Header: pushHeader(8, 9, uint64(i), 1<<16), Payload: make([]byte, 1<<16), Done: func(err error) {
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
		eventually(t, 5*time.Second, func() error {
			if err := b.Send(&Message{Header: pushHeader(9, 8, 1, 0)}); !errors.Is(err, ErrNoPeer) {
				return fmt.Errorf("Send to a node that left: %v", err)
			}
			return nil
		})
		time.Sleep(100 * time.Millisecond)
		if l := cb.lostEvents(); len(l) != 0 {
			t.Fatalf("PeerLost on a graceful close: %v", l)
		}
		if l := ca.lostEvents(); len(l) != 0 {
			t.Fatalf("PeerLost at the closing node: %v", l)
		}
		if err := a.Send(&Message{Header: pushHeader(8, 9, 1, 0)}); !errors.Is(err, ErrClosed) {
			t.Fatalf("Send after Close: %v, want ErrClosed", err)
		}
		if err := a.Forward(&Message{Header: pushHeader(8, 9, 1, 0)}); !errors.Is(err, ErrClosed) {
			t.Fatalf("Forward after Close: %v, want ErrClosed", err)
		}
		if err := a.Dial(context.Background(), 9, b.Addr()); !errors.Is(err, ErrClosed) {
			t.Fatalf("Dial after Close: %v, want ErrClosed", err)
		}
	})
}

// TestCloseFailsWhatCannotBeSent: a peer that does not read keeps the pool
// from draining; Close gives up after IOTimeout and fails every frame.
func TestCloseFailsWhatCannotBeSent(t *testing.T) {
	forKinds(t, func(t *testing.T, kind string) {
		const self, peer = 8, 9
		v, _ := stalledPeer(t, kind, self, peer)
		var calls, failed atomic.Int32
		payload := make([]byte, 4<<20)
		const n = 16
		for i := 0; i < n; i++ {
			if err := v.Send(&Message{Header: pushHeader(self, peer, uint64(i), len(payload)), Payload: payload, Done: func(err error) {
				calls.Add(1)
				if err != nil {
					failed.Add(1)
				}
			}}); err != nil {
				t.Fatal(err)
			}
		}
		start := time.Now()
		v.Close()
		if d := time.Since(start); d > 3*time.Second {
			t.Fatalf("Close took %v", d)
		}
		if calls.Load() != n || failed.Load() == 0 {
			t.Fatalf("%d Done calls (%d failed), want %d with failures", calls.Load(), failed.Load(), n)
		}
	})
}

func TestSendErrors(t *testing.T) {
	forKinds(t, func(t *testing.T, kind string) {
		v, _ := newVan(t, kind, 8, func(c *Config) { c.MaxPayload = 1 << 10 })
		if err := v.Send(&Message{Header: pushHeader(8, 42, 1, 0)}); !errors.Is(err, ErrNoPeer) {
			t.Fatalf("Send to an unknown node: %v", err)
		}
		if err := v.Forward(&Message{Header: pushHeader(8, 42, 1, 0)}); !errors.Is(err, ErrNoPeer) {
			t.Fatalf("Forward to an unknown node: %v", err)
		}
		if err := v.Send(&Message{Header: pushHeader(8, 42, 1, 2048), Payload: make([]byte, 2048)}); err == nil {
			t.Fatal("Send over MaxPayload accepted")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if err := v.AwaitPeers(ctx, []node.ID{42}); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("AwaitPeers of a node that never comes: %v", err)
		}
		// Dialling a port nobody listens on.
		l, _ := net.Listen("tcp", "127.0.0.1:0")
		addr := l.Addr().String()
		l.Close()
		if err := v.Dial(context.Background(), 9, addr); err == nil || !strings.Contains(err.Error(), addr) {
			t.Fatalf("Dial of a closed port: %v", err)
		}
		// Listening on a port in use.
		_, err := New(kind, Config{Self: 9, ListenAddr: v.Addr(), Handler: newCollector(), Logger: testLogger()})
		if err == nil || !strings.Contains(err.Error(), "address already in use") || !strings.HasPrefix(err.Error(), "van: listen") {
			t.Fatalf("listening on a port in use: %v", err)
		}
		if _, err := New("carrier-pigeon", Config{Handler: newCollector()}); err == nil {
			t.Fatal("unknown kind accepted")
		}
	})
}

func TestBackPressure(t *testing.T) {
	forKinds(t, func(t *testing.T, kind string) {
		a, _ := newVan(t, kind, 8, func(c *Config) { c.PoolBytes = 4096 })
		b, cb := newVan(t, kind, 9, nil)
		connect(t, a, 8, b, 9)
		a.SetWeight(9, 0)
		msg := func(k uint64) *Message {
			return &Message{Header: pushHeader(8, 9, k, 4000), Payload: make([]byte, 4000)}
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
		cb.waitFrames(t, 3)
	})
}

// TestShapingSwitch: a paused flow holds its frames in the pool (counted
// by QueuedBytes) until shaping is switched off, and pauses again when it is
// switched back on.
func TestShapingSwitch(t *testing.T) {
	forKinds(t, func(t *testing.T, kind string) {
		a, _ := newVan(t, kind, 8, nil)
		b, cb := newVan(t, kind, 9, nil)
		connect(t, a, 8, b, 9)
		a.SetWeight(9, 0)
		const n = 1000
		send := func(k uint64) {
			if err := a.Send(&Message{Header: pushHeader(8, 9, k, n), Payload: make([]byte, n)}); err != nil {
				t.Fatal(err)
			}
		}
		queued := func(want int64) {
			eventually(t, 5*time.Second, func() error {
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
		time.Sleep(50 * time.Millisecond)
		if got := len(cb.waitFrames(t, 2)); got != 2 {
			t.Fatalf("%d frames arrived with the flow paused again, want 2", got)
		}
		a.SetWeight(9, 1)
		cb.waitFrames(t, 3)
		queued(0)
	})
}

// TestEpollGoroutinesConstant: the epoll van's goroutines do not grow with
// its peers.
func TestEpollGoroutinesConstant(t *testing.T) {
	const self = 8
	v, col := newVan(t, KindEpoll, self, nil)
	addPeers := func(from, to node.ID) {
		for id := from; id < to; id++ {
			nc := rawPeer(t, v.Addr(), id, self)
			if _, err := nc.Write(encode(pushHeader(id, self, uint64(id), 4), make([]byte, 4))); err != nil {
				t.Fatal(err)
			}
		}
		col.waitFrames(t, int(to-9))
	}
	addPeers(9, 10)
	one := settledGoroutines()
	addPeers(10, 17)
	if s := v.Stats(); len(s) != 8 {
		t.Fatalf("%d peers, want 8", len(s))
	}
	if eight := settledGoroutines(); eight > one {
		t.Fatalf("%d goroutines with 8 peers, %d with 1", eight, one)
	}
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
			connect(t, a, 8, b, 9)
			connect(t, a, 8, c, 10)
			connect(t, b, 9, c, 10)
			raw := rawPeer(t, a.Addr(), 0, 0) // a connection that never says hello
			for _, to := range []node.ID{9, 10} {
				if err := a.Send(&Message{Header: pushHeader(8, to, 1, 1024), Payload: make([]byte, 1024)}); err != nil {
					t.Fatal(err)
				}
			}
			cb.waitFrames(t, 1)
			cc.waitFrames(t, 1)
			for _, v := range []Transport{a, b, c} {
				v.Close()
			}
			raw.Close()
		}
		eventually(t, 5*time.Second, func() error {
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
