package classic

import (
	"math"
	"testing"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/kvstore"
	"github.com/fptps/fpt/node"
)

// BenchmarkApplyJoin measures a server's side of a join: applying the
// layout that adds a server to a store of 10^5 sparse keys of 64 bytes
// (the scan in key order, the keys taken out, their KVMove frames), and
// the joiner adding them in. Bytes are the values moved.
//
//	go test -run - -bench ApplyJoin -benchmem ./classic
func BenchmarkApplyJoin(b *testing.B) {
	const keys, size = 100_000, 64
	s0, s1 := node.ServerID(0), node.ServerID(1)
	v0 := Initial([]node.ID{s0})
	v1 := v0.With(s1)
	val := make([]byte, size)
	moved := 0
	for b.Loop() {
		b.StopTimer()
		src := kvstore.New()
		for i := range uint64(keys) {
			if _, err := src.Add(i*(math.MaxUint64/keys), frame.Float32, 0, val, size); err != nil {
				b.Fatal(err)
			}
		}
		from, to := NewRanges(s0, v0, 1<<20), NewRanges(s1, v0, 1<<20)
		dst := kvstore.New()
		b.StartTimer()
		out := from.Offer(src, v1).Sends
		to.Offer(dst, v1)
		for i := range out {
			h := &out[i].Header
			var err error
			if h.Type == frame.KVMove {
				_, err = to.Move(dst, h, out[i].Payload)
			} else {
				_, err = to.MoveEnd(dst, h)
			}
			if err != nil {
				b.Fatal(err)
			}
		}
		moved = dst.Len()
	}
	b.SetBytes(int64(moved * size))
	b.ReportMetric(float64(moved), "keys/op")
}
