package reduce

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/fptps/fpt/frame"
)

func f32(vals ...float64) []byte { return encode(frame.Float32, vals) }

// contrib builds a float32 contribution of worker (of 3) for partition 0
// of key 7, iteration 1, sitting at offset 0 of a 64-byte tensor.
func contrib(worker int, vals ...float64) Contribution { return contribOf(3, worker, vals...) }

// contribOf is contrib in a round of the given number of workers.
func contribOf(workers, worker int, vals ...float64) Contribution {
	return Contribution{
		PartID:  PartID{Key: 7, Partition: 0, Iteration: 1},
		Workers: workers,
		Worker:  worker,
		DType:   frame.Float32,
		Total:   64,
		Data:    f32(vals...),
	}
}

// TestTableRules feeds a sequence of contributions to a fresh 3-worker
// table and checks each outcome.
func TestTableRules(t *testing.T) {
	type step struct {
		c       Contribution
		wantErr error     // nil: success
		done    bool      // a Sum is returned
		sum     []float64 // its float32 values
		pending int       // Pending() afterwards
	}
	with := func(c Contribution, f func(*Contribution)) Contribution { f(&c); return c }
	at := func(iter uint64, c Contribution) Contribution { c.Iteration = iter; return c }
	cases := []struct {
		name  string
		steps []step
	}{
		{"three workers sum", []step{
			{c: contrib(0, 1, 2), pending: 1},
			{c: contrib(2, 10, 20), pending: 1},
			{c: contrib(1, 100, 200), done: true, sum: []float64{111, 222}},
		}},
		{"same PartID next round starts fresh", []step{
			{c: contrib(0, 1), pending: 1},
			{c: contrib(1, 1), pending: 1},
			{c: contrib(2, 1), done: true, sum: []float64{3}},
			{c: contrib(0, 5), pending: 1},
			{c: contrib(1, 5), pending: 1},
			{c: contrib(2, 5), done: true, sum: []float64{15}},
		}},
		{"worker rank negative", []step{
			{c: contrib(-1, 1), wantErr: ErrWorker},
		}},
		{"worker rank too large", []step{
			{c: contrib(0, 1), pending: 1},
			{c: contrib(3, 1), wantErr: ErrWorker, pending: 1},
		}},
		{"duplicate", []step{
			{c: contrib(1, 1), pending: 1},
			{c: contrib(1, 1), wantErr: ErrDuplicate, pending: 1},
			{c: contrib(0, 2), pending: 1},
			{c: contrib(2, 4), done: true, sum: []float64{7}},
		}},
		{"dtype mismatch", []step{
			{c: contrib(0, 1, 2), pending: 1},
			{c: with(contrib(1), func(c *Contribution) { c.DType, c.Data = frame.Float64, encode(frame.Float64, []float64{1}) }), wantErr: ErrMismatch, pending: 1},
		}},
		{"offset mismatch", []step{
			{c: contrib(0, 1), pending: 1},
			{c: with(contrib(1, 1), func(c *Contribution) { c.Offset = 8 }), wantErr: ErrMismatch, pending: 1},
		}},
		{"total mismatch", []step{
			{c: contrib(0, 1), pending: 1},
			{c: with(contrib(1, 1), func(c *Contribution) { c.Total = 128 }), wantErr: ErrMismatch, pending: 1},
		}},
		{"length mismatch", []step{
			{c: contrib(0, 1), pending: 1},
			{c: contrib(1, 1, 2), wantErr: ErrMismatch, pending: 1},
			{c: contrib(1, 2), pending: 1},
			{c: contrib(2, 3), done: true, sum: []float64{6}},
		}},
		{"unknown dtype", []step{
			{c: with(contrib(0, 1), func(c *Contribution) { c.DType = 0 }), wantErr: ErrData},
		}},
		{"data not whole elements", []step{
			{c: with(contrib(0, 1), func(c *Contribution) { c.Data = c.Data[:3] }), wantErr: ErrData},
		}},
		{"data outside tensor", []step{
			{c: with(contrib(0, 1, 2), func(c *Contribution) { c.Offset = 60 }), wantErr: ErrData},
			{c: with(contrib(0, 1, 2), func(c *Contribution) { c.Offset = 72 }), wantErr: ErrData},
		}},
		{"misaligned offset", []step{
			{c: with(contrib(0, 1), func(c *Contribution) { c.Offset = 2 }), wantErr: ErrData},
		}},
		{"init from worker 0 completes at once", []step{
			{c: with(contrib(0, 4, 5), func(c *Contribution) { c.Init = true }), done: true, sum: []float64{4, 5}},
		}},
		{"init from another worker", []step{
			{c: with(contrib(1, 4, 5), func(c *Contribution) { c.Init = true }), wantErr: ErrInit},
		}},
		{"init while a normal round is pending", []step{
			{c: contrib(1, 1), pending: 1},
			{c: with(contrib(0, 4), func(c *Contribution) { c.Init = true }), wantErr: ErrInit, pending: 1},
		}},
		{"init then normal round", []step{
			{c: with(contrib(0, 4), func(c *Contribution) { c.Init = true }), done: true, sum: []float64{4}},
			{c: contrib(1, 1), pending: 1},
			{c: contrib(0, 1), pending: 1},
			{c: contrib(2, 1), done: true, sum: []float64{3}},
		}},
		// The workers of an iteration may change while the job runs (a
		// worker lost or joining): each contribution says how many make
		// up its round.
		{"worker index out of range of its round's count", []step{
			{c: contribOf(2, 2, 1), wantErr: ErrWorker},
			{c: contribOf(0, 0, 1), wantErr: ErrWorker},
			{c: with(contribOf(0, 0, 1), func(c *Contribution) { c.Init = true }), wantErr: ErrWorker},
			{c: contribOf(2, 1, 1), pending: 1},
			{c: contribOf(2, 2, 1), wantErr: ErrWorker, pending: 1},
		}},
		{"worker count differs from the pending round's", []step{
			{c: contrib(0, 1), pending: 1},
			{c: contribOf(2, 1, 1), wantErr: ErrMismatch, pending: 1},
			{c: contribOf(130, 129, 1), wantErr: ErrMismatch, pending: 1}, // beyond the round's bitset
			{c: contribOf(1, 0, 1), wantErr: ErrMismatch, pending: 1},
			{c: contrib(1, 2), pending: 1},
			{c: contrib(2, 3), done: true, sum: []float64{6}},
		}},
		{"rounds of different worker counts side by side", []step{
			{c: contrib(0, 1), pending: 1},
			{c: at(2, contribOf(2, 1, 20)), pending: 2},
			{c: at(3, contribOf(1, 0, 300)), done: true, sum: []float64{300}, pending: 2},
			{c: contrib(2, 3), pending: 2},
			{c: at(2, contribOf(2, 0, 10)), done: true, sum: []float64{30}, pending: 1},
			{c: contrib(1, 2), done: true, sum: []float64{6}},
		}},
		// A host's sum (package localagg) counts for every worker it holds.
		{"a host's sum counts its workers", []step{
			{c: with(contrib(2, 10), func(c *Contribution) { c.Also = []int{0} }), pending: 1},
			{c: contrib(1, 1), done: true, sum: []float64{11}},
		}},
		{"a host's sum of every worker completes at once", []step{
			{c: with(contrib(1, 6), func(c *Contribution) { c.Also = []int{0, 2} }), done: true, sum: []float64{6}},
		}},
		{"a host's sum naming a worker in twice", []step{
			{c: contrib(0, 1), pending: 1},
			{c: with(contrib(2, 10), func(c *Contribution) { c.Also = []int{0} }), wantErr: ErrDuplicate, pending: 1},
			{c: with(contrib(2, 10), func(c *Contribution) { c.Also = []int{1, 1} }), wantErr: ErrWorker, pending: 1},
			{c: with(contrib(2, 10), func(c *Contribution) { c.Also = []int{2} }), wantErr: ErrWorker, pending: 1},
			{c: with(contrib(2, 10), func(c *Contribution) { c.Also = []int{3} }), wantErr: ErrWorker, pending: 1},
			{c: with(contrib(2, 10), func(c *Contribution) { c.Also = []int{1} }), done: true, sum: []float64{11}},
		}},
		{"an init round is no host's sum", []step{
			{c: with(contrib(0, 4), func(c *Contribution) { c.Init, c.Also = true, []int{1} }), wantErr: ErrInit},
		}},
		{"init round of a smaller set", []step{
			{c: with(contribOf(2, 0, 4), func(c *Contribution) { c.Init = true }), done: true, sum: []float64{4}},
			{c: with(contribOf(2, 1, 4), func(c *Contribution) { c.Init = true }), wantErr: ErrInit},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tb := NewTable()
			for i, st := range tc.steps {
				s, err := tb.Add(st.c)
				switch {
				case st.wantErr != nil && !errors.Is(err, st.wantErr):
					t.Fatalf("step %d: error %v, want %v", i, err, st.wantErr)
				case st.wantErr == nil && err != nil:
					t.Fatalf("step %d: %v", i, err)
				case st.done != (s != nil):
					t.Fatalf("step %d: sum %v, want done=%v", i, s, st.done)
				}
				if err != nil {
					want := fmt.Sprintf("key %d partition %d iteration %d worker %d: ", st.c.Key, st.c.Partition, st.c.Iteration, st.c.Worker)
					if got := err.Error(); len(got) < len(want) || got[:len(want)] != want {
						t.Errorf("step %d: error %q lacks context %q", i, got, want)
					}
				}
				if s != nil {
					if got := decode(frame.Float32, s.Data); !slices.Equal(got, st.sum) {
						t.Fatalf("step %d: sum %v, want %v", i, got, st.sum)
					}
					if s.PartID != st.c.PartID || s.DType != st.c.DType || s.Offset != st.c.Offset || s.Total != st.c.Total {
						t.Fatalf("step %d: sum header %+v does not match %+v", i, s, st.c)
					}
					tb.Release(s)
				}
				if got := tb.Pending(); got != st.pending {
					t.Fatalf("step %d: Pending() = %d, want %d", i, got, st.pending)
				}
				if got, want := tb.PendingBytes(), int64(st.pending*len(tc.steps[0].c.Data)); got != want && st.pending > 0 {
					t.Fatalf("step %d: PendingBytes() = %d, want %d", i, got, want)
				}
			}
		})
	}
}

// TestTableErrorLeavesTableUnchanged checks that a rejected contribution
// does not count: the round still needs the same workers and the sum is
// unaffected.
func TestTableErrorLeavesTableUnchanged(t *testing.T) {
	tb := NewTable()
	if _, err := tb.Add(contribOf(2, 0, 1)); err != nil {
		t.Fatal(err)
	}
	bad := contribOf(2, 1, 1000, 1000) // wrong length
	if _, err := tb.Add(bad); !errors.Is(err, ErrMismatch) {
		t.Fatalf("got %v", err)
	}
	if tb.Pending() != 1 || tb.PendingBytes() != 4 {
		t.Fatalf("pending %d / %d bytes", tb.Pending(), tb.PendingBytes())
	}
	s, err := tb.Add(contribOf(2, 1, 2))
	if err != nil || s == nil {
		t.Fatalf("sum %v, err %v", s, err)
	}
	if got := decode(frame.Float32, s.Data); got[0] != 3 {
		t.Fatalf("sum %v", got)
	}
}

func TestTableDoesNotRetainData(t *testing.T) {
	tb := NewTable()
	c := contribOf(2, 0, 1, 2)
	if _, err := tb.Add(c); err != nil {
		t.Fatal(err)
	}
	copy(c.Data, f32(50, 50)) // the caller reuses its buffer
	s, err := tb.Add(contribOf(2, 1, 10, 20))
	if err != nil {
		t.Fatal(err)
	}
	if got := decode(frame.Float32, s.Data); !slices.Equal(got, []float64{11, 22}) {
		t.Fatalf("sum %v: the table kept the caller's buffer", got)
	}
}

func TestTableSingleWorker(t *testing.T) {
	tb := NewTable()
	s, err := tb.Add(contribOf(1, 0, 3))
	if err != nil || s == nil {
		t.Fatalf("sum %v, err %v", s, err)
	}
	if tb.Pending() != 0 || tb.PendingBytes() != 0 {
		t.Fatal("single-worker round left pending")
	}
	if got := decode(frame.Float32, s.Data); got[0] != 3 {
		t.Fatalf("sum %v", got)
	}
}

func TestTableManyWorkers(t *testing.T) {
	const w = 130 // more than one bitset word
	tb := NewTable()
	for r := 0; r < w-1; r++ {
		if s, err := tb.Add(contribOf(w, r, float64(r))); err != nil || s != nil {
			t.Fatalf("worker %d: sum %v, err %v", r, s, err)
		}
	}
	if _, err := tb.Add(contribOf(w, 64, 1)); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("duplicate of worker 64: %v", err)
	}
	s, err := tb.Add(contribOf(w, w-1, float64(w-1)))
	if err != nil || s == nil {
		t.Fatalf("last: sum %v, err %v", s, err)
	}
	if got := decode(frame.Float32, s.Data)[0]; got != w*(w-1)/2 {
		t.Fatalf("sum %v", got)
	}
}

// TestTableInterleaved runs 3 workers over several keys, partitions and
// iterations, delivering contributions in a scrambled order with rounds of
// consecutive iterations overlapping, and checks every sum exactly.
func TestTableInterleaved(t *testing.T) {
	const workers, keys, parts, iters, elems = 3, 3, 4, 5, 6
	// value(w, k, p, i, e) is small and integral: every sum is exact.
	value := func(w, k, p, i, e int) float64 { return float64(w*1000 + k*100 + p*10 + i + e) }
	var cs []Contribution
	for i := range iters {
		for k := range keys {
			for p := range parts {
				for w := range workers {
					vals := make([]float64, elems)
					for e := range vals {
						vals[e] = value(w, k, p, i, e)
					}
					cs = append(cs, Contribution{
						PartID:  PartID{Key: uint64(k), Partition: uint32(p), Iteration: uint64(i)},
						Workers: workers, Worker: w, DType: frame.Float32,
						Offset: uint64(p * elems * 4), Total: parts * elems * 4,
						Data: f32(vals...),
					})
				}
			}
		}
	}
	// Scramble deterministically within windows of two iterations, so that
	// iteration i+1 starts before iteration i completes.
	rng := rand.New(rand.NewPCG(7, 8))
	window := keys * parts * workers * 2
	for start := 0; start < len(cs); start += window / 2 {
		w := cs[start:min(start+window, len(cs))]
		rng.Shuffle(len(w), func(i, j int) { w[i], w[j] = w[j], w[i] })
	}
	tb := NewTable()
	got := map[PartID]bool{}
	maxPending := 0
	for _, c := range cs {
		s, err := tb.Add(c)
		if err != nil {
			t.Fatal(err)
		}
		maxPending = max(maxPending, tb.Pending())
		if s == nil {
			continue
		}
		if got[s.PartID] {
			t.Fatalf("%+v completed twice", s.PartID)
		}
		got[s.PartID] = true
		vals := decode(frame.Float32, s.Data)
		for e, v := range vals {
			var want float64
			for w := range workers {
				want += value(w, int(s.Key), int(s.Partition), int(s.Iteration), e)
			}
			if v != want {
				t.Fatalf("%+v element %d = %g, want %g", s.PartID, e, v, want)
			}
		}
		if s.Offset != uint64(s.Partition)*elems*4 {
			t.Fatalf("%+v offset %d", s.PartID, s.Offset)
		}
		tb.Release(s)
	}
	if len(got) != keys*parts*iters {
		t.Fatalf("%d partitions completed, want %d", len(got), keys*parts*iters)
	}
	if tb.Pending() != 0 || tb.PendingBytes() != 0 {
		t.Fatalf("left pending: %d, %d bytes", tb.Pending(), tb.PendingBytes())
	}
	if maxPending <= keys*parts/2 {
		t.Fatalf("the scramble did not interleave (max pending %d)", maxPending)
	}
}

func TestTableFloat16(t *testing.T) {
	tb := NewTable()
	id := PartID{Key: 1, Partition: 2, Iteration: 3}
	inputs := [][]float64{{1, 0.5, -2, 65504}, {2, 0.25, 2, 0}, {0.125, 1e-7, 0, 65504}}
	var s *Sum
	for w, vals := range inputs {
		var err error
		s, err = tb.Add(Contribution{PartID: id, Workers: 3, Worker: w, DType: frame.Float16, Offset: 8, Total: 16, Data: encode(frame.Float16, vals)})
		if err != nil {
			t.Fatal(err)
		}
	}
	if s == nil {
		t.Fatal("no sum")
	}
	bits := make([]uint16, 4)
	for i := range bits {
		bits[i] = uint16(s.Data[2*i]) | uint16(s.Data[2*i+1])<<8
	}
	// 1e-7 rounds to the subnormal 2^-24*2 = 1.19e-7; 0.75 + that is
	// below half an ulp of 0.75 and vanishes; 65504+65504 overflows.
	want := []uint16{Float32ToFloat16(3.125), Float32ToFloat16(0.75), 0x0000, 0x7c00}
	if !slices.Equal(bits, want) {
		t.Fatalf("float16 sum bits %#04x, want %#04x", bits, want)
	}
	tb.Release(s)
}

func TestTableRelease(t *testing.T) {
	tb := NewTable()
	tb.Release(nil)
	tb.Release(&Sum{Data: make([]byte, 4)}) // not from the table
	if tb.idleBytes != 0 {
		t.Fatal("a foreign Sum was taken in")
	}
	other := NewTable()
	os, _ := other.Add(contribOf(1, 0, 1))
	tb.Release(os)
	if tb.idleBytes != 0 || os.Data == nil {
		t.Fatal("another table's Sum was taken in")
	}
	s, _ := tb.Add(contribOf(1, 0, 1))
	buf := s.Data
	tb.Release(s)
	if s.Data != nil || tb.idleBytes != 4 {
		t.Fatalf("release: data %v idle %d", s.Data, tb.idleBytes)
	}
	tb.Release(s) // twice: no effect
	if tb.idleBytes != 4 {
		t.Fatalf("double release: idle %d", tb.idleBytes)
	}
	s2, _ := tb.Add(contribOf(1, 0, 2))
	if &s2.Data[0] != &buf[0] {
		t.Fatal("released buffer not reused")
	}
	if tb.idleBytes != 0 {
		t.Fatalf("idle %d after reuse", tb.idleBytes)
	}
	tb.Release(s2)
	tb.Trim()
	if tb.idleBytes != 0 || len(tb.free) != 0 || len(tb.slots) != 0 {
		t.Fatal("Trim kept something")
	}
}

// TestTableReleaseWhilePendingIgnored: a stale Sum whose record now
// aggregates another round cannot release that round's buffer.
func TestTableReleaseWhilePendingIgnored(t *testing.T) {
	tb := NewTable()
	c0, c1 := contribOf(2, 0, 1), contribOf(2, 1, 2)
	tb.Add(c0)
	s, _ := tb.Add(c1)
	stale := s
	tb.Release(s)
	c0.Iteration, c1.Iteration = 2, 2
	tb.Add(c0) // reuses the record
	tb.Release(stale)
	if tb.idleBytes != 0 || tb.Pending() != 1 {
		t.Fatal("stale release freed a pending buffer")
	}
	s, _ = tb.Add(c1)
	if got := decode(frame.Float32, s.Data)[0]; got != 3 {
		t.Fatalf("sum %v", got)
	}
}

// TestTableSteadyStateAllocatesNothing aggregates the same partitions
// iteration after iteration, all pending at once, as a training loop does.
func TestTableSteadyStateAllocatesNothing(t *testing.T) {
	const workers, parts = 3, 16
	sizes := []int{4096, 4096, 1024, 64} // several partitions share a size
	var data [workers][parts][]byte
	for w := range workers {
		for p := range parts {
			data[w][p] = make([]byte, sizes[p%len(sizes)])
		}
	}
	tb := NewTable()
	sums := make([]*Sum, 0, parts)
	iter := uint64(0)
	round := func() {
		iter++
		for w := range workers {
			for p := range parts {
				s, err := tb.Add(Contribution{
					PartID:  PartID{Key: uint64(p % 5), Partition: uint32(p), Iteration: iter},
					Workers: workers, Worker: w, DType: frame.Float32, Total: 1 << 20, Data: data[w][p],
				})
				if err != nil {
					t.Fatal(err)
				}
				if s != nil {
					sums = append(sums, s)
				}
			}
		}
		if len(sums) != parts {
			t.Fatalf("%d sums", len(sums))
		}
		for _, s := range sums {
			tb.Release(s)
		}
		sums = sums[:0]
	}
	for range 3 {
		round() // warm up
	}
	if n := testing.AllocsPerRun(200, round); n != 0 {
		t.Fatalf("%v allocations per iteration", n)
	}
}

// TestTableWorkerCountChanges: a recycled record serves rounds of any
// worker count (its bitset grows when too small and is clear again), and
// once the count settles after a change the table allocates nothing.
func TestTableWorkerCountChanges(t *testing.T) {
	tb := NewTable()
	iter := uint64(0)
	data := f32(1)
	// round aggregates one partition over workers, in reverse order, and
	// checks the sum (without allocating); dup tries every contribution
	// twice (errors allocate).
	round := func(workers int, dup bool) {
		iter++
		c := Contribution{PartID: PartID{Key: 9, Iteration: iter}, Workers: workers, DType: frame.Float32, Total: 64, Data: data}
		for w := workers - 1; w >= 0; w-- {
			c.Worker = w
			s, err := tb.Add(c)
			if err != nil || (s != nil) != (w == 0) {
				t.Fatalf("%d workers, worker %d: sum %v, err %v", workers, w, s, err)
			}
			if s == nil && dup {
				if _, err := tb.Add(c); !errors.Is(err, ErrDuplicate) {
					t.Fatalf("%d workers, worker %d again: %v", workers, w, err)
				}
			}
			if s == nil {
				continue
			}
			if got := math.Float32frombits(binary.LittleEndian.Uint32(s.Data)); got != float32(workers) {
				t.Fatalf("%d workers: sum %v", workers, got)
			}
			tb.Release(s)
		}
	}
	for _, workers := range []int{1, 130, 2, 3, 200, 64, 65, 1} {
		round(workers, true)
	}
	// A lost worker: 3, then 2 for good.
	for range 3 {
		round(3, false)
	}
	round(2, false)
	if n := testing.AllocsPerRun(100, func() { round(2, false) }); n != 0 {
		t.Fatalf("%v allocations per round once the count settled", n)
	}
}

// TestTableIdleBound: after a layout change the old sizes' idle buffers
// make room for the new ones, so memory does not accumulate.
func TestTableIdleBound(t *testing.T) {
	tb := NewTable()
	peak := int64(0)
	for size := 1000; size < 1100; size += 4 { // a new size every round
		var sums []*Sum
		var inUse int64
		for p := range 8 {
			s, err := tb.Add(Contribution{PartID: PartID{Partition: uint32(p)}, Workers: 1, DType: frame.Float32, Total: 1 << 20, Data: make([]byte, size)})
			if err != nil {
				t.Fatal(err)
			}
			sums = append(sums, s)
			inUse += int64(size)
			if held := inUse + tb.idleBytes; held > peak {
				peak = held
			}
		}
		for _, s := range sums {
			tb.Release(s)
		}
	}
	if max := int64(8 * 1100); peak > max || tb.idleBytes > max {
		t.Fatalf("held up to %d bytes, idle %d; the working set is at most %d", peak, tb.idleBytes, max)
	}
}

// Adopted buffers become the sum without a copy when they open a round,
// are summed and recycled otherwise, and come back on error: a steady loop
// of adopting contributions allocates nothing.
func TestTableAdopt(t *testing.T) {
	tab := NewTable()
	id := PartID{Key: 1, Partition: 0, Iteration: 1}
	contrib := func(worker int, v float32) Contribution {
		buf := tab.Buffer(8)
		binary.LittleEndian.PutUint32(buf, math.Float32bits(v))
		binary.LittleEndian.PutUint32(buf[4:], math.Float32bits(v))
		return Contribution{PartID: id, Workers: 2, Worker: worker, DType: frame.Float32, Total: 8, Data: buf, Adopt: true}
	}
	first := contrib(0, 1)
	if sum, err := tab.Add(first); err != nil || sum != nil {
		t.Fatalf("first: %v, %v", sum, err)
	}
	second := contrib(1, 2)
	sum, err := tab.Add(second)
	if err != nil || sum == nil {
		t.Fatalf("second: %v, %v", sum, err)
	}
	if &sum.Data[0] != &first.Data[0] {
		t.Error("the round's first adopted buffer is not the sum buffer")
	}
	if got := decode(frame.Float32, sum.Data); got[0] != 3 || got[1] != 3 {
		t.Errorf("sum = %v", got)
	}
	tab.Release(sum)
	// An adopted contribution that fails comes back to the free list.
	bad := contrib(5, 1)
	if _, err := tab.Add(bad); !errors.Is(err, ErrWorker) {
		t.Fatalf("bad worker: %v", err)
	}
	if n := testing.AllocsPerRun(50, func() {
		id.Iteration++
		a, _ := tab.Add(contrib(0, 1))
		b, _ := tab.Add(contrib(1, 1))
		if a != nil || b == nil {
			t.Fatal("round did not complete")
		}
		tab.Release(b)
	}); n != 0 {
		t.Errorf("%v allocations per adopted round", n)
	}
}
