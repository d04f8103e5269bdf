package classic

import (
	"bytes"
	"math"
	"testing"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/kvstore"
	"github.com/fptps/fpt/node"
)

const benchKeys, benchSize = 100_000, 64

// benchStore is a store of benchKeys sparse keys of benchSize bytes.
func benchStore(b *testing.B) *kvstore.Store {
	src := kvstore.New()
	val := make([]byte, benchSize)
	for i := range uint64(benchKeys) {
		if _, err := src.Add(i*(math.MaxUint64/benchKeys), frame.Float32, 0, val, benchSize); err != nil {
			b.Fatal(err)
		}
	}
	return src
}

// BenchmarkApplyJoin measures a server's side of a join: applying the
// layout that adds a server to a store of 10^5 sparse keys of 64 bytes
// (the scan in key order, the keys taken out, their KVMove frames), and
// the joiner adding them in. Bytes are the values moved. Its baseline,
// BenchmarkSnapshotBaseline, encodes the same store in key order, as a
// checkpoint does: the cheapest pass over every value.
//
//	go test -run - -bench 'ApplyJoin|SnapshotBaseline' -benchmem ./classic
func BenchmarkApplyJoin(b *testing.B) { benchJoin(b, true) }

// BenchmarkApplyJoinSend is BenchmarkApplyJoin's sending side alone: the
// part a server does under its lock (scan, take out, build the frames).
func BenchmarkApplyJoinSend(b *testing.B) { benchJoin(b, false) }

// benchJoin has server 0 of a store of benchStore's keys apply the layout
// that adds server 1 and, with takeIn, server 1 take the keys in.
func benchJoin(b *testing.B, takeIn bool) {
	s0, s1 := node.ServerID(0), node.ServerID(1)
	v0 := Initial([]node.ID{s0})
	v1 := v0.With(s1)
	moved := 0
	for b.Loop() {
		b.StopTimer()
		src := benchStore(b)
		from, to := NewRanges(s0, v0, 1<<20), NewRanges(s1, v0, 1<<20)
		dst := kvstore.New()
		b.StartTimer()
		t := from.Offer(src, v1)
		moved = t.Applied[0].MovedOut
		if !takeIn {
			continue
		}
		to.Offer(dst, v1)
		for i := range t.Sends {
			h := &t.Sends[i].Header
			var err error
			if h.Type == frame.KVMove {
				_, err = to.Move(dst, h, t.Sends[i].Payload)
			} else {
				_, err = to.MoveEnd(dst, h)
			}
			if err != nil {
				b.Fatal(err)
			}
		}
		if dst.Len() != moved {
			b.Fatalf("the joiner holds %d keys, %d were moved", dst.Len(), moved)
		}
	}
	b.SetBytes(int64(moved * benchSize))
	b.ReportMetric(float64(moved), "keys/op")
}

// BenchmarkSnapshotBaseline is BenchmarkApplyJoin's baseline: the same
// store written in key order (kvstore.Snapshot). Bytes are all the values.
func BenchmarkSnapshotBaseline(b *testing.B) {
	src := benchStore(b)
	var buf bytes.Buffer
	for b.Loop() {
		buf.Reset()
		if _, err := src.Snapshot(&buf, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(benchKeys * benchSize)
}
