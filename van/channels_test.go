package van_test

import (
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/van"
	"github.com/fptps/fpt/van/internal/wiretest"
	"github.com/fptps/fpt/van/vantest"
)

// rawChannels opens channels [0, open) of n from node from to the van at
// addr, each with a plain Hello naming its channel.
func rawChannels(t testing.TB, addr string, from, to node.ID, open, n int) []*net.TCPConn {
	t.Helper()
	var conns []*net.TCPConn
	for ch := range open {
		nc := rawPeer(t, addr, 0, 0)
		h := frame.Header{Type: frame.Hello, Sender: uint32(from), Recipient: uint32(to), Partition: uint32(ch), Aux: uint32(n)}
		if _, err := nc.Write(wiretest.Encode(h, nil)); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, nc)
	}
	return conns
}

// Frames go out on the channel their partition is striped to, every
// channel carries some, and one partition's frames stay on one channel.
func TestChannelsStripeByPartition(t *testing.T) {
	forKinds(t, func(t *testing.T, kind string) {
		const n = 4
		v, _ := newVan(t, kind, 9, func(c *van.Config) { c.Channels = n })
		conns := rawChannels(t, v.Addr(), 8, 9, n, n)
		if err := v.AwaitPeers(t.Context(), []node.ID{8}); err != nil {
			t.Fatal(err)
		}
		if st := v.Stats(); len(st) != 1 || st[0].Channels != n {
			t.Fatalf("stats %+v, want one peer with %d channels", st, n)
		}
		const parts = 12
		var sent []frame.Header
		for it := range uint64(2) {
			for p := range uint32(parts) {
				h := wiretest.PushHeader(9, 8, 5, 64)
				h.Partition, h.Iteration = p, it
				sent = append(sent, h)
			}
		}
		sent = append(sent, frame.Header{Type: frame.App, Sender: 9, Recipient: 8, Length: 1})
		want := make([]int, n)
		for i := range sent {
			if err := v.Send(&frame.Message{Header: sent[i], Payload: make([]byte, sent[i].Length)}); err != nil {
				t.Fatal(err)
			}
			want[van.ChannelOf(&sent[i], n)]++
		}
		for ch, nc := range conns {
			if want[ch] == 0 {
				t.Errorf("channel %d is striped nothing", ch)
			}
			nc.SetReadDeadline(time.Now().Add(10 * time.Second))
			var hdr [frame.HeaderSize]byte
			for range want[ch] {
				if _, err := io.ReadFull(nc, hdr[:]); err != nil {
					t.Fatalf("channel %d: %v", ch, err)
				}
				h, err := frame.Decode(hdr[:], 1<<20)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := io.CopyN(io.Discard, nc, int64(h.Length)); err != nil {
					t.Fatal(err)
				}
				if got := van.ChannelOf(&h, n); got != ch {
					t.Fatalf("%v arrived on channel %d, want %d", &h, ch, got)
				}
			}
		}
		// Nothing more arrived on any channel (a frame sent twice).
		for ch, nc := range conns {
			nc.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			if n, _ := nc.Read(make([]byte, 1)); n > 0 {
				t.Errorf("channel %d carried more than its %d frames", ch, want[ch])
			}
		}
	})
}

// One channel that dies alone, while another is in the middle of a frame,
// takes the peer with it: reported lost once, naming the channel, and every
// other channel closed; nothing hangs.
func TestChannelLostAlone(t *testing.T) {
	forKinds(t, func(t *testing.T, kind string) {
		const n = 4
		v, col := newVan(t, kind, 9, func(c *van.Config) { c.Channels = n })
		conns := rawChannels(t, v.Addr(), 8, 9, n, n)
		if err := v.AwaitPeers(t.Context(), []node.ID{8}); err != nil {
			t.Fatal(err)
		}
		half := wiretest.Encode(wiretest.PushHeader(8, 9, 1, 1<<16), make([]byte, 1<<16))
		if _, err := conns[1].Write(half[:len(half)/2]); err != nil {
			t.Fatal(err)
		}
		conns[2].Close()
		lost := col.WaitLost(t, 1)
		if lost[0].Peer != 8 || !strings.Contains(lost[0].Err.Error(), "channel 2 of 4") {
			t.Fatalf("lost %v, want node 8 naming channel 2 of 4", lost)
		}
		for ch, nc := range conns {
			if ch != 2 {
				waitClosed(t, nc)
			}
		}
		time.Sleep(50 * time.Millisecond) // time for a second report to show
		if l := col.LostPeers(); len(l) != 1 {
			t.Fatalf("%d loss reports, want 1: %v", len(l), l)
		}
		if err := v.Send(&frame.Message{Header: wiretest.PushHeader(9, 8, 1, 0)}); !errors.Is(err, van.ErrNoPeer) {
			t.Fatalf("Send to the lost peer: %v, want ErrNoPeer", err)
		}
	})
}

// A dialler that opens some of its channels and no more (it died between
// two dials) is refused once the handshake deadline passes: its channels
// are closed, and it never becomes a peer.
func TestChannelsIncompleteRefused(t *testing.T) {
	forKinds(t, func(t *testing.T, kind string) {
		rej := vantest.NewRejects()
		v, col := newVan(t, kind, 9, func(c *van.Config) {
			c.Channels = 4
			c.HandshakeTimeout = 300 * time.Millisecond
			c.OnReject = rej.Hook
		})
		conns := rawChannels(t, v.Addr(), 8, 9, 2, 4)
		for _, nc := range conns {
			waitClosed(t, nc)
		}
		rej.WaitN(t, "channels", 2)
		if err := v.Send(&frame.Message{Header: wiretest.PushHeader(9, 8, 1, 0)}); !errors.Is(err, van.ErrNoPeer) {
			t.Fatalf("Send to a peer that opened 2 of 4 channels: %v, want ErrNoPeer", err)
		}
		if len(col.LostPeers()) != 0 {
			t.Fatalf("the handler heard of a refused peer: %v", col.LostPeers())
		}
	})
}

// Nodes that disagree on FPT_CHANNELS do not connect, and the acceptor
// says why; with a cluster secret the dialler's Dial fails too.
func TestChannelsMismatchRefused(t *testing.T) {
	forKinds(t, func(t *testing.T, kind string) {
		rej := vantest.NewRejects()
		a, _ := newVan(t, kind, 8, func(c *van.Config) { c.Channels = 2; c.HelloKey = vantest.Key(1) })
		b, _ := newVan(t, kind, 9, func(c *van.Config) { c.Channels = 4; c.HelloKey = vantest.Key(1); c.OnReject = rej.Hook })
		if err := a.Dial(t.Context(), 9, b.Addr()); err == nil {
			t.Fatal("Dial with 2 channels to a node that expects 4 succeeded")
		}
		rej.Wait(t, "channels")
	})
}

func TestChannelsConfig(t *testing.T) {
	for _, n := range []int{-1, van.MaxChannels + 1} {
		if _, err := van.New(van.KindEpoll, van.Config{ListenAddr: "127.0.0.1:0", Handler: vantest.NewCollector(), Channels: n}); err == nil || !strings.Contains(err.Error(), "channels") {
			t.Errorf("Channels %d: %v, want an error naming channels", n, err)
		}
	}
}
