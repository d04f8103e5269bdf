package lb

import (
	"runtime"
	"strings"
	"testing"
)

// FuzzUnmarshalDirectiveAllocs bounds what decoding a directive costs: a
// declared aggregator count must be checked against the limit and the
// bytes present before the slices exist, so a refused or accepted input
// allocates at most a small multiple of its size.
func FuzzUnmarshalDirectiveAllocs(f *testing.F) {
	for name, d := range directiveCases() {
		if !strings.HasPrefix(name, "many") && name != "long reason" {
			f.Add(mustMarshal(f, d))
		}
	}
	f.Add(cat([]byte{directiveV1, flagDecision}, make([]byte, 8+4+8), []byte{0xff, 0xff, 0xff, 0x7f}))
	f.Add(cat([]byte{directiveV1, flagDecision}, make([]byte, 8+4+8), []byte{0, 1, 0, 0}))
	f.Fuzz(func(t *testing.T, b []byte) {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, _ = UnmarshalDirective(b)
		_, _ = UnmarshalSample(b)
		runtime.ReadMemStats(&after)
		const slack = 64 << 10 // error values, and the fuzzing engine meanwhile
		if grew, bound := after.TotalAlloc-before.TotalAlloc, uint64(4*len(b)+slack); grew > bound {
			t.Fatalf("decoding %d bytes allocated %d bytes (bound %d)", len(b), grew, bound)
		}
	})
}
