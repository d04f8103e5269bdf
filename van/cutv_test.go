package van

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/fptps/fpt/frame"
)

// readvStream cuts stream as the epoll van reads it, with scattering reads
// into nextv (plain: into next alone) of at most limit() bytes that each
// take everything the stream still has; it returns the frames, the sink's
// calls and the frames' emits in order, and the reads made.
func readvStream(t *testing.T, stream []byte, limit func() int, sink, plain bool) (got []rx, order []string, reads int) {
	t.Helper()
	const self = 8
	var sinkFn func(*frame.Header) []byte
	if sink {
		sinkFn = func(h *frame.Header) []byte {
			order = append(order, "sink")
			return make([]byte, h.Length)
		}
	}
	c := newCutter(self, 0, false, 1<<20, sinkFn)
	var iov [2][]byte
	for len(stream) > 0 || c.ready() {
		n := 0
		if !c.ready() {
			bufs := c.nextv(iov[:0], limit())
			if plain {
				bufs = bufs[:1]
			}
			for _, b := range bufs {
				k := copy(b, stream)
				stream, n = stream[k:], n+k
				if k < len(b) {
					break
				}
			}
			reads++
		}
		h, p, err := c.advance(n)
		if err != nil {
			t.Fatal(err)
		}
		if h != nil {
			order = append(order, "emit")
			got = append(got, rx{*h, slices.Clone(p)})
		}
	}
	if c.midFrame() {
		t.Fatal("stream ended mid-frame")
	}
	return got, order, reads
}

// TestCutterReadv: reading each payload together with the next frame's
// header cuts the same frames as reading them apart, asks the sink for a
// frame's buffer only after the frame before it was handled, and, when the
// bytes are all there, saves a read per frame with a payload: one read per
// frame, where reading headers on their own takes two. (Without a sink,
// the cutter's own buffer growing takes reads of its own.)
func TestCutterReadv(t *testing.T) {
	const self, peer = 8, 9
	sizes := []int{4, 0, 100, 65536, 0, 0, 4, 70000, 8}
	stream := pushStream(self, peer, sizes)

	var want []rx
	c := newCutter(self, 0, false, 1<<20, nil)
	if err := c.feed(stream, func(h *frame.Header, p []byte) { want = append(want, rx{*h, slices.Clone(p)}) }); err != nil {
		t.Fatal(err)
	}

	r := rand.New(rand.NewPCG(7, 8))
	tests := []struct {
		name  string
		limit func() int
	}{
		{"unbounded", func() int { return 1 << 30 }},
		{"small reads", func() int { return 1 + r.IntN(3*frame.HeaderSize) }},
		{"large reads", func() int { return 1 + r.IntN(100000) }},
	}
	for _, tt := range tests {
		for _, sink := range []bool{false, true} {
			got, order, reads := readvStream(t, stream, tt.limit, sink, false)
			if len(got) != len(want) {
				t.Fatalf("%s, sink %v: %d frames, want %d", tt.name, sink, len(got), len(want))
			}
			for i := range want {
				if got[i].h != want[i].h || !slices.Equal(got[i].p, want[i].p) {
					t.Fatalf("%s, sink %v: frame %d is %v (%d bytes), want %v (%d bytes)", tt.name, sink, i, got[i].h, len(got[i].p), want[i].h, len(want[i].p))
				}
			}
			// Every sink call comes right before its frame's emit.
			for i, o := range order {
				if o == "sink" && (i+1 == len(order) || order[i+1] != "emit") {
					t.Fatalf("%s: sink asked out of turn: %v", tt.name, order)
				}
			}
			if tt.name != "unbounded" {
				continue
			}
			_, _, plainReads := readvStream(t, stream, tt.limit, sink, true)
			saved := 0 // frames with a payload: each shares a read with the next header
			for _, f := range want {
				if len(f.p) > 0 {
					saved++
				}
			}
			if reads >= plainReads || (sink && reads != plainReads-saved) {
				t.Errorf("sink %v: %d reads for %d frames, %d reading headers apart; want %d fewer", sink, reads, len(want), plainReads, saved)
			}
		}
	}
}
