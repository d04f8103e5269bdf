package worker

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// least agrees with the minimum of the values it counts, whatever the
// order of adds and removes.
func TestLeast(t *testing.T) {
	tests := []struct {
		name string
		ops  []int64 // v >= 0: add v; v < 0: remove -v-1
		want int64   // -1: none
	}{
		{"empty", nil, -1},
		{"one", []int64{3}, 3},
		{"lower later", []int64{3, 1}, 1},
		{"last at low leaves, next just above", []int64{1, 2, -2}, 2},
		{"last at low leaves, next far above", []int64{1, 1000, -2}, 1000},
		{"one of two at low leaves", []int64{1, 1, 5, -2}, 1},
		{"all leave", []int64{4, 7, -5, -8}, -1},
		{"a push at a time", []int64{0, 0, 1, -1, 1, -1}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var l least
			for _, op := range tc.ops {
				if op >= 0 {
					l.add(uint64(op))
				} else {
					l.remove(uint64(-op - 1))
				}
			}
			got, ok := l.min()
			if want := tc.want; (want < 0) == ok || ok && got != uint64(want) {
				t.Errorf("min() = %d, %v; want %d", got, ok, want)
			}
		})
	}
}

// Random moves of random counters: min is always the least one.
func TestLeastRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 50 {
		var l least
		vals := make([]uint64, 1+rng.IntN(20))
		for i := range vals {
			vals[i] = uint64(rng.IntN(5))
			l.add(vals[i])
		}
		for step := range 500 {
			i := rng.IntN(len(vals))
			old := vals[i]
			switch rng.IntN(4) {
			case 0:
				vals[i] = uint64(rng.IntN(100)) // a jump, either way
			default:
				vals[i]++
			}
			l.remove(old)
			l.add(vals[i])
			if got, ok := l.min(); !ok || got != slices.Min(vals) {
				t.Fatalf("round %d step %d: min() = %d, %v; want %d (values %v)", round, step, got, ok, slices.Min(vals), vals)
			}
		}
	}
}
