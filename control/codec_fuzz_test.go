package control

import (
	"runtime"
	"testing"
)

// FuzzUnmarshalAllocs bounds what decoding costs whatever the input: a
// message off the network may declare counts and lengths it does not
// carry, and the decoder must check them against the bytes present before
// allocating. The result of a successful decode is at most a small
// multiple of its input (node.Info is wider than its 10-byte wire form);
// a refused input allocates no more than that either.
func FuzzUnmarshalAllocs(f *testing.F) {
	for _, m := range sampleMessages() {
		if len(m.Body) < 1024 {
			f.Add(mustMarshal(f, m))
		}
	}
	f.Add(cat(rawHeader(NodeTable, MaxNodes), le32(0), le32(0)))
	f.Add(cat(rawHeader(Barrier, 0), le32(MaxTextLen), le32(0)))
	f.Add(cat(rawHeader(Report, 0), le32(0), le32(MaxBodyLen)))
	f.Fuzz(func(t *testing.T, b []byte) {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, _ = Unmarshal(b)
		runtime.ReadMemStats(&after)
		const slack = 64 << 10 // the error value, and anything the fuzzing engine allocated meanwhile
		if grew, bound := after.TotalAlloc-before.TotalAlloc, uint64(8*len(b)+slack); grew > bound {
			t.Fatalf("decoding %d bytes allocated %d bytes (bound %d)", len(b), grew, bound)
		}
	})
}
