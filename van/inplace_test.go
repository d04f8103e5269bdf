package van_test

import (
	"fmt"
	"testing"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/van"
	"github.com/fptps/fpt/van/internal/wiretest"
	"github.com/fptps/fpt/van/vantest"
)

// sinkCollector is a vantest.Collector that is also a Sink: it gives a buffer of
// its own to the frames accept chooses and declines the others.
type sinkCollector struct {
	*vantest.Collector
	accept func(h *frame.Header) bool
}

func (s *sinkCollector) PayloadBuffer(h *frame.Header) []byte {
	if !s.accept(h) {
		return nil
	}
	return make([]byte, h.Length)
}

// TestReceivedPayloadCounters: every payload byte received is counted once,
// as read in place when the handler's Sink gave the buffer and as copied
// when it did not (no Sink, or the Sink declined); headers and empty
// payloads count in neither. The handler is told which it was.
func TestReceivedPayloadCounters(t *testing.T) {
	sizes := []int{0, 4, 1000, 64 << 10, 3 << 20, 12}
	tests := []struct {
		name   string
		sink   func(h *frame.Header) bool // nil: the handler has no Sink
		inKeys func(key uint64) bool      // keys expected in place
	}{
		{"no sink", nil, func(uint64) bool { return false }},
		{"sink takes all", func(*frame.Header) bool { return true }, func(uint64) bool { return true }},
		{"sink declines odd keys", func(h *frame.Header) bool { return h.Key%2 == 0 }, func(k uint64) bool { return k%2 == 0 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			forKinds(t, func(t *testing.T, kind string) {
				a, _ := newVan(t, kind, 8, nil)
				col := vantest.NewCollector()
				var h van.Handler = col
				if tt.sink != nil {
					h = &sinkCollector{Collector: col, accept: tt.sink}
				}
				b, _ := newVan(t, kind, 9, func(c *van.Config) { c.Handler = h })
				vantest.Connect(t, a, 8, b, 9)
				var wantIn, wantCopied uint64
				for i, n := range sizes {
					p := make([]byte, n)
					wiretest.Fill(p, uint64(i))
					if err := a.Send(&frame.Message{Header: wiretest.PushHeader(8, 9, uint64(i), n), Payload: p}); err != nil {
						t.Fatal(err)
					}
					if tt.inKeys(uint64(i)) {
						wantIn += uint64(n)
					} else {
						wantCopied += uint64(n)
					}
				}
				for i, f := range col.WaitFrames(t, len(sizes)) {
					if at := wiretest.Check(f.Payload, uint64(i)); at >= 0 || len(f.Payload) != sizes[i] {
						t.Fatalf("frame %d: %d bytes, content differs at byte %d", i, len(f.Payload), at)
					}
					if want := tt.inKeys(uint64(i)); sizes[i] > 0 && f.InPlace != want {
						t.Errorf("frame %d of %d bytes: the handler was told in place %v, want %v", i, sizes[i], f.InPlace, want)
					}
				}
				vantest.Eventually(t, func() error {
					st := b.Stats()
					if len(st) != 1 || st[0].Peer != node.ID(8) {
						return fmt.Errorf("receiver's stats %+v", st)
					}
					if st[0].ReceivedInPlaceBytes != wantIn || st[0].ReceivedCopiedBytes != wantCopied {
						return fmt.Errorf("received payload in place %d, copied %d; want %d, %d",
							st[0].ReceivedInPlaceBytes, st[0].ReceivedCopiedBytes, wantIn, wantCopied)
					}
					return nil
				})
				// The sender counts nothing it did not receive.
				if st := a.Stats(); len(st) != 1 || st[0].ReceivedInPlaceBytes != 0 || st[0].ReceivedCopiedBytes != 0 {
					t.Errorf("sender's stats %+v: counts payload it never received", st)
				}
			})
		})
	}
}
