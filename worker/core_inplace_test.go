package worker

import (
	"bytes"
	"fmt"
	"slices"
	"testing"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/lb"
)

// An in-place FPTPushPull's result partition goes straight into the
// caller's buffer once the push frame of its bytes is written; one that
// comes before is staged and copied when its frame is written. Events:
// sN the push frame of partition N written (its Done), rN result
// partition N received (copied in by the shell), kN partition N claimed
// by the sink to read in place, lN that read landed.
func TestCoreInPlacePushPullGatesPartitions(t *testing.T) {
	for _, tc := range []struct {
		name     string
		events   []string
		restaged uint64 // bytes copied from staging
	}{
		{"each result after its own frame, before the key's last",
			[]string{"s0", "r0", "s1", "r1", "s2", "r2", "s3", "r3"}, 0},
		{"frames written out of order",
			[]string{"s2", "r2", "s0", "r0", "s3", "r3", "s1", "r1"}, 0},
		{"every frame written first", []string{"s0", "s1", "s2", "s3", "r0", "r1", "r2", "r3"}, 0},
		{"two results before their frames",
			[]string{"r0", "r1", "s0", "s1", "s2", "r2", "s3", "r3"}, 2 * testPartBytes},
		{"a result before its frame, the frame the key's last",
			[]string{"s0", "r0", "s1", "r1", "s2", "r2", "r3", "s3"}, testPartBytes},
		{"every result before any frame",
			[]string{"r0", "r1", "r2", "r3", "s0", "s1", "s2", "s3"}, 4 * testPartBytes},
		{"read in place into staging, its frame written meanwhile",
			[]string{"k1", "s1", "l1", "s0", "r0", "s2", "r2", "s3", "r3"}, testPartBytes},
		{"read in place after its frame",
			[]string{"s1", "k1", "l1", "s0", "s2", "s3", "r0", "r2", "r3"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := startedCore(t, 0, 2, false)
			mustDeclare(t, c, 5, 64)
			initRound(t, c)
			restagedInit := c.restaged
			values := pattern(64, 1)
			buf := slices.Clone(values)
			pp, err := c.pushPull([]uint64{5}, buf, buf, []int{64}, frame.Float32, 0, &call{})
			if err != nil {
				t.Fatal(err)
			}
			if len(pp.sends) != 4 || len(pp.locals) != 0 {
				t.Fatalf("%d frames to send and %d local, want 4 and 0", len(pp.sends), len(pp.locals))
			}
			var done []int
			take := func(o effects) {
				for _, d := range o.copies {
					o.merge(copyStaged(c, d))
				}
				done = append(done, finishedTS(o)...)
			}
			take(pp)
			take(c.handedOver(pp.req, nil))
			sum := pattern(64, 9)
			hs := results(c, 5, 1)
			sent := make([]bool, 4)
			var spans [4][]byte
			for i, ev := range tc.events {
				var n int
				if _, err := fmt.Sscanf(ev[1:], "%d", &n); err != nil {
					t.Fatal(err)
				}
				h := &hs[n]
				part := sum[h.Offset : h.Offset+h.Length]
				switch ev[0] {
				case 's':
					m := pp.sends[slices.IndexFunc(pp.sends, func(m frame.Message) bool { return m.Header.Partition == uint32(n) })]
					sent[n] = true
					take(c.sentFrame(pp.req, &m.Header, nil))
				case 'r':
					td, err := receive(c, h, part)
					if err != nil {
						t.Fatal(err)
					}
					take(td)
				case 'k':
					if spans[n] = c.sink(h); spans[n] == nil {
						t.Fatalf("the sink refused partition %d", n)
					}
					copy(spans[n], part)
				case 'l':
					l, inPlace, err := c.received(h)
					if err != nil || !inPlace {
						t.Fatalf("landing of partition %d: in place %v, err %v", n, inPlace, err)
					}
					take(c.land(l, h.Partition))
				}
				for p, s := range sent {
					if o, e := hs[p].Offset, hs[p].Offset+hs[p].Length; !s && !bytes.Equal(buf[o:e], values[o:e]) {
						t.Fatalf("after %s: partition %d's values changed before its frame was written", ev, p)
					}
				}
				if last := i == len(tc.events)-1; !last && len(done) > 0 {
					t.Fatalf("after %s: finished %v before the last event", ev, done)
				}
			}
			if !slices.Equal(done, []int{pp.req.ts}) {
				t.Fatalf("finished %v, want the FPTPushPull %d once", done, pp.req.ts)
			}
			if !bytes.Equal(buf, sum) {
				t.Errorf("pulled %v, want %v", buf, sum)
			}
			if got := c.restaged - restagedInit; got != tc.restaged {
				t.Errorf("%d bytes copied from staging, want %d", got, tc.restaged)
			}
			if len(c.results) != 0 || len(c.gated) != 0 || len(c.readingInPlace) != 0 {
				t.Errorf("left over: %d results, %d gated pulls, %d partitions read in place", len(c.results), len(c.gated), len(c.readingInPlace))
			}
		})
	}
}

// framedParts gates partition by partition only where each push frame is
// exactly one of the result's partitions.
func TestCoreFramedParts(t *testing.T) {
	parts := []lb.Partition{{Index: 0, Offset: 0, Length: 16}, {Index: 1, Offset: 16, Length: 16}, {Index: 2, Offset: 32, Length: 16}}
	frameOf := func(key uint64, part uint32, off, n uint64) frame.Message {
		return frame.Message{Header: frame.Header{Type: frame.Push, Key: key, Iteration: 1, Partition: part, Offset: off, Length: n}}
	}
	for _, tc := range []struct {
		name  string
		sends []frame.Message
		want  []bool
	}{
		{"one frame a partition", []frame.Message{frameOf(5, 0, 0, 16), frameOf(5, 2, 32, 16)}, []bool{true, false, true}},
		{"other keys' frames ignored", []frame.Message{frameOf(6, 0, 0, 64), frameOf(5, 1, 16, 16)}, []bool{false, true, false}},
		{"a frame across two partitions", []frame.Message{frameOf(5, 0, 0, 32)}, nil},
		{"a frame at another offset", []frame.Message{frameOf(5, 1, 8, 16)}, nil},
		{"a partition beyond the result's", []frame.Message{frameOf(5, 3, 48, 16)}, nil},
		{"a partition framed twice", []frame.Message{frameOf(5, 1, 16, 16), frameOf(5, 1, 16, 16)}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &result{iter: 1, parts: parts}
			if got := framedParts(r, tc.sends, 5); !slices.Equal(got, tc.want) {
				t.Errorf("closed %v, want %v", got, tc.want)
			}
		})
	}
}
