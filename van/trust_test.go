package van_test

import (
	"runtime"
	"testing"
	"time"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/van"
	"github.com/fptps/fpt/van/internal/wiretest"
	"github.com/fptps/fpt/van/vantest"
)

// A connection that says nothing, or drips its Hello a byte at a time, is
// closed once the handshake deadline passes, and counted.
func TestStalledHandshakeClosed(t *testing.T) {
	forKinds(t, func(t *testing.T, kind string) {
		rej := vantest.NewRejects()
		v, col := newVan(t, kind, 9, func(cfg *van.Config) {
			cfg.HandshakeTimeout = 300 * time.Millisecond
			cfg.HelloKey = vantest.Key(1)
			cfg.OnReject = rej.Hook
		})
		silent := rawPeer(t, v.Addr(), 0, 0)
		drip := rawPeer(t, v.Addr(), 0, 0)
		hello := wiretest.Encode(frame.Header{Type: frame.Hello, Sender: 8, Recipient: 9}, nil)
		go func() {
			for _, b := range hello[:10] {
				if _, err := drip.Write([]byte{b}); err != nil {
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		}()
		waitClosed(t, silent)
		waitClosed(t, drip)
		rej.WaitN(t, "handshake", 2)
		if n := rej.Count("handshake"); n != 2 {
			t.Errorf("%d connections counted as stalled handshakes, want 2", n)
		}
		if len(col.Frames()) != 0 || len(col.LostPeers()) != 0 {
			t.Errorf("the handler heard of refused connections: %v %v", col.Frames(), col.LostPeers())
		}
	})
}

// A peer that stops in the middle of a frame for IOTimeout is closed (and,
// being a member, reported lost); without the read deadline it would hold
// its connection and buffer forever.
func TestSlowDripMidFrameClosed(t *testing.T) {
	forKinds(t, func(t *testing.T, kind string) {
		v, col := newVan(t, kind, 9, func(cfg *van.Config) { cfg.IOTimeout = 300 * time.Millisecond })
		nc := rawPeer(t, v.Addr(), 8, 9)
		if err := v.AwaitPeers(t.Context(), []node.ID{8}); err != nil {
			t.Fatal(err)
		}
		b := wiretest.Encode(wiretest.PushHeader(8, 9, 1, 64), make([]byte, 64))
		if _, err := nc.Write(b[:frame.HeaderSize+1]); err != nil {
			t.Fatal(err)
		}
		// One more byte well after the deadline: too late.
		go func() {
			time.Sleep(2 * time.Second)
			nc.Write(b[frame.HeaderSize+1 : frame.HeaderSize+2])
		}()
		lost := col.WaitLost(t, 1)
		if lost[0].Peer != 8 {
			t.Fatalf("lost %v", lost)
		}
		waitClosed(t, nc)
	})
}

// A frame's announced length is checked against what its type may carry
// before any buffer exists, and a legal but large one gets memory only as
// its bytes arrive: announcing 512 MiB and sending 1 MiB costs about 1 MiB.
func TestAnnouncedLengthAllocatesNothing(t *testing.T) {
	forKinds(t, func(t *testing.T, kind string) {
		v, col := newVan(t, kind, 9, func(cfg *van.Config) {
			cfg.PartitionBytes = 1 << 20
			cfg.MaxPayload = 1 << 30
		})
		// A push over the partition size: refused at its header.
		nc := rawPeer(t, v.Addr(), 8, 9)
		h := wiretest.PushHeader(8, 9, 1, 64<<20)
		hb := make([]byte, frame.HeaderSize)
		h.Encode(hb)
		if _, err := nc.Write(hb); err != nil {
			t.Fatal(err)
		}
		if lost := col.WaitLost(t, 1); lost[0].Peer != 8 {
			t.Fatalf("lost %v", lost)
		}
		waitClosed(t, nc)

		// A KVError (no partition bound) announcing 512 MiB.
		const announced = 512 << 20
		nc = rawPeer(t, v.Addr(), 10, 9)
		if err := v.AwaitPeers(t.Context(), []node.ID{10}); err != nil {
			t.Fatal(err)
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		e := frame.Header{Type: frame.KVError, Sender: 10, Recipient: 9, Length: announced}
		e.Encode(hb)
		if _, err := nc.Write(append(hb, make([]byte, 1<<20)...)); err != nil {
			t.Fatal(err)
		}
		vantest.Eventually(t, func() error {
			for _, st := range v.Stats() {
				if st.Peer == 10 && st.ReceivedBytes >= frame.HeaderSize+(1<<20) {
					return nil
				}
			}
			return errNotYet
		})
		runtime.ReadMemStats(&after)
		if grew := int64(after.TotalAlloc - before.TotalAlloc); grew > 64<<20 {
			t.Fatalf("announcing %d bytes and sending 1 MiB allocated %d bytes", announced, grew)
		}
	})
}

var errNotYet = errorString("not yet")

type errorString string

func (e errorString) Error() string { return string(e) }
