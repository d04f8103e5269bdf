package van_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/van"
	"github.com/fptps/fpt/van/internal/wiretest"
	"github.com/fptps/fpt/van/vantest"
)

// TestSenderGathersFrames: frames queued for a peer leave in the pool's
// order, several per write, each whole and once, their parts gathered
// from the caller's memory: with one channel, a backlog of small frames
// costs a write per many frames (PeerStats.WriteCalls), where writing
// each frame apart costs one per frame; with four channels, each
// channel's frames keep their order. (Partial writes: TestWritevPartial.)
func TestSenderGathersFrames(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*van.Config)
		// maxWrites bounds the writes for n frames (0: at most one per frame).
		maxWrites func(n int) int
	}{
		{"one channel", nil, func(n int) int { return n / 8 }},
		{"four channels", func(c *van.Config) { c.Channels = 4 }, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			forKinds(t, func(t *testing.T, kind string) {
				testGather(t, kind, tc.mod, tc.maxWrites)
			})
		})
	}
}

func testGather(t *testing.T, kind string, mod func(*van.Config), maxWrites func(int) int) {
	a, _ := newVan(t, kind, 8, mod)
	b, cb := newVan(t, kind, 9, mod)
	vantest.Connect(t, a, 8, b, 9)
	channels := 1
	if st := a.Stats(); len(st) == 1 {
		channels = st[0].Channels
	}
	a.SetWeight(9, 0) // everything queues before the sender may take it
	const n = 300
	r := rand.New(rand.NewPCG(3, 4))
	var dones atomic.Int32
	sent := make([]frame.Header, n)
	for i := range n {
		size := 4 * (1 + r.IntN(1000))
		h := wiretest.PushHeader(8, 9, uint64(i), size)
		h.Priority = int32(r.IntN(3))
		h.Partition = uint32(r.IntN(4))
		p := make([]byte, size)
		wiretest.Fill(p, uint64(i))
		m := &frame.Message{Header: h, Done: func(err error) {
			if err != nil {
				t.Errorf("frame %d: Done(%v)", i, err)
			}
			dones.Add(1)
		}}
		// The payload in up to four parts, some empty.
		for len(p) > 0 || r.IntN(4) == 0 {
			k := min(len(p), r.IntN(2*size/3+1))
			if m.Payload == nil {
				m.Payload = p[:k]
			} else {
				m.More = append(m.More, p[:k])
			}
			p = p[k:]
			if len(m.More) == 3 {
				m.More = append(m.More, p)
				break
			}
		}
		sent[i] = h
		if err := a.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	if st := a.Stats(); len(st) != 1 || st[0].WriteCalls != 0 {
		t.Fatalf("writes before the flow resumed: %+v", st)
	}
	a.SetWeight(9, 1)
	got := cb.WaitFrames(t, n)
	for _, f := range got {
		if at := wiretest.Check(f.Payload, f.Header.Key); at >= 0 || len(f.Payload) != int(sent[f.Header.Key].Length) {
			t.Fatalf("frame %d: %d bytes, want %d; content differs at byte %d", f.Header.Key, len(f.Payload), sent[f.Header.Key].Length, at)
		}
	}
	// The pool's order: the most urgent first, equal priorities in the
	// order sent; the receiver sees it on each channel.
	want := slices.Clone(sent)
	slices.SortStableFunc(want, func(x, y frame.Header) int { return int(y.Priority - x.Priority) })
	for ch := range channels {
		var w, g []uint64
		for i := range want {
			if van.ChannelOf(&want[i], channels) == ch {
				w = append(w, want[i].Key)
			}
			if van.ChannelOf(&got[i].Header, channels) == ch {
				g = append(g, got[i].Header.Key)
			}
		}
		if !slices.Equal(w, g) {
			t.Fatalf("channel %d: frames arrived in the order %v, want %v", ch, g, w)
		}
	}
	vantest.Eventually(t, func() error {
		if d := dones.Load(); d != n {
			return fmt.Errorf("%d Done calls, want %d", d, n)
		}
		return nil
	})
	st := a.Stats()[0]
	t.Logf("%d writes for %d frames", st.WriteCalls, n)
	limit := uint64(n)
	if maxWrites != nil {
		limit = uint64(maxWrites(n))
	}
	if st.WriteCalls == 0 || st.WriteCalls > limit {
		t.Errorf("%d writes for %d frames, want 1 to %d", st.WriteCalls, n, limit)
	}
}
