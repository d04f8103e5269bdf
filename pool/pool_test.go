package pool

import (
	"math"
	"math/rand/v2"
	"testing"
)

// popAll pops until Pop reports nothing eligible.
func popAll[T any](p *Pool[T]) []Entry[T] {
	var out []Entry[T]
	for {
		e, ok := p.Pop()
		if !ok {
			return out
		}
		out = append(out, e)
	}
}

func TestPriorityWithinFlow(t *testing.T) {
	tests := []struct {
		name string
		in   []int32 // priorities in push order; Value = push index
		want []int   // push indices in expected pop order
	}{
		{"single", []int32{5}, []int{0}},
		{"ascending pushes pop descending", []int32{1, 2, 3}, []int{2, 1, 0}},
		{"fifo among equals", []int32{7, 7, 7, 7}, []int{0, 1, 2, 3}},
		{"mixed", []int32{0, 9, 0, 9, -3, 9, 0}, []int{1, 3, 5, 0, 2, 6, 4}},
		{"negative priorities", []int32{-1, -5, -1, math.MinInt32, math.MaxInt32}, []int{4, 0, 2, 1, 3}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := New[int](1 << 30)
			for i, pr := range tc.in {
				p.Push(Entry[int]{Flow: 3, Priority: pr, Bytes: 100, Value: i})
			}
			got := popAll(p)
			if len(got) != len(tc.want) {
				t.Fatalf("popped %d entries, want %d", len(got), len(tc.want))
			}
			for i, e := range got {
				if e.Value != tc.want[i] {
					t.Fatalf("pop %d = push %d, want push %d (all: %v)", i, e.Value, tc.want[i], got)
				}
			}
			if p.Len() != 0 || p.Bytes() != 0 {
				t.Fatalf("after popping all: Len %d Bytes %d", p.Len(), p.Bytes())
			}
		})
	}
}

// TestPriorityProperty pushes random priorities into random flows,
// interleaving pops, and checks that every flow's pops are in
// (priority desc, push order) among the entries present at each pop.
func TestPriorityProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 200; trial++ {
		p := New[int](1 << 40)
		type queued struct {
			prio int32
			seq  int
		}
		pending := map[uint32][]queued{}
		seq := 0
		for step := 0; step < 300; step++ {
			if r.IntN(3) > 0 {
				fl := uint32(r.IntN(4))
				pr := int32(r.IntN(5))
				p.Push(Entry[int]{Flow: fl, Priority: pr, Bytes: int64(1 + r.IntN(200_000)), Value: seq})
				pending[fl] = append(pending[fl], queued{pr, seq})
				seq++
				continue
			}
			e, ok := p.Pop()
			if !ok {
				if p.Len() != 0 {
					t.Fatalf("Pop reported nothing with %d queued", p.Len())
				}
				continue
			}
			// The popped entry must be the best of its flow.
			q := pending[e.Flow]
			best := 0
			for i := range q {
				if q[i].prio > q[best].prio || (q[i].prio == q[best].prio && q[i].seq < q[best].seq) {
					best = i
				}
			}
			if q[best].seq != e.Value {
				t.Fatalf("trial %d: flow %d popped %d (prio %d), want %d (prio %d)", trial, e.Flow, e.Value, e.Priority, q[best].seq, q[best].prio)
			}
			pending[e.Flow] = append(q[:best], q[best+1:]...)
		}
	}
}

// shares runs a backlogged pool with the given weights (one flow each,
// entries of random sizes) for total bytes and returns each flow's share.
func shares(t *testing.T, r *rand.Rand, weights []float64, total int64, maxEntry int) []float64 {
	t.Helper()
	p := New[struct{}](math.MaxInt64)
	for i, w := range weights {
		p.SetWeight(uint32(i), w)
	}
	return backlogged(t, p, r, len(weights), total, maxEntry)
}

// backlogged keeps flows 0..flows-1 of p backlogged with entries of random
// sizes and priorities while total bytes are popped, and returns each
// flow's share of those bytes.
func backlogged(t *testing.T, p *Pool[struct{}], r *rand.Rand, flows int, total int64, maxEntry int) []float64 {
	t.Helper()
	refill := func(fl uint32) {
		for p.flows[fl] == nil || len(p.flows[fl].heap) < 4 {
			p.Push(Entry[struct{}]{Flow: fl, Priority: int32(r.IntN(3)), Bytes: int64(1 + r.IntN(maxEntry))})
		}
	}
	for i := range flows {
		refill(uint32(i))
	}
	sent := make([]int64, flows)
	var all int64
	for all < total {
		e, ok := p.Pop()
		if !ok {
			t.Fatal("Pop found nothing in a backlogged pool")
		}
		sent[e.Flow] += e.Bytes
		all += e.Bytes
		refill(e.Flow)
	}
	out := make([]float64, len(sent))
	for i, s := range sent {
		out[i] = float64(s) / float64(all)
	}
	return out
}

// within reports whether every share is within 2 % of weight/sum(weights).
func within(t *testing.T, what string, got, weights []float64) {
	t.Helper()
	var sum float64
	for _, w := range weights {
		sum += w
	}
	for i, w := range weights {
		want := w / sum
		if math.Abs(got[i]-want) > 0.02*want {
			t.Errorf("%s: flow %d share %.4f, want %.4f ±2%% (all %v)", what, i, got[i], want, got)
		}
	}
}

func TestWeightedShares(t *testing.T) {
	tests := []struct {
		name     string
		weights  []float64
		maxEntry int
	}{
		{"3:1 small entries", []float64{3, 1}, 16 << 10},
		{"3:1 entries around the quantum", []float64{3, 1}, 256 << 10},
		{"1:1:2", []float64{1, 1, 2}, 64 << 10},
		{"1:1:2 large entries", []float64{1, 1, 2}, 4 << 20},
		{"fractional 0.25:0.75", []float64{0.25, 0.75}, 32 << 10},
	}
	r := rand.New(rand.NewPCG(42, 7))
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			within(t, tc.name, shares(t, r, tc.weights, 1<<30, tc.maxEntry), tc.weights)
		})
	}
}

// TestWeightChangesAndShaping changes weights and the shaping mode in the
// middle of a backlogged run: each phase's shares follow the weights in
// force (all equal while shaping is off, a paused flow included), and the
// weights set while shaping was off apply when it comes back on.
func TestWeightChangesAndShaping(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 9))
	p := New[struct{}](math.MaxInt64)
	const phase = 256 << 20
	p.SetWeight(0, 3)
	p.SetWeight(1, 1)
	within(t, "3:1", backlogged(t, p, r, 3, phase, 64<<10), []float64{3, 1, 1})
	p.SetWeight(2, 0)
	got := backlogged(t, p, r, 3, phase, 64<<10)
	if got[2] != 0 {
		t.Errorf("paused flow 2 got share %.4f", got[2])
	}
	within(t, "3:1 with 2 paused", got[:2], []float64{3, 1})
	p.SetShaping(false)
	if p.Shaping() {
		t.Fatal("Shaping() true after SetShaping(false)")
	}
	within(t, "shaping off", backlogged(t, p, r, 3, phase, 64<<10), []float64{1, 1, 1})
	p.SetWeight(1, 5) // recorded, not applied while off
	if p.Weight(1) != 5 {
		t.Errorf("Weight(1) = %v while shaping is off, want 5", p.Weight(1))
	}
	within(t, "still off", backlogged(t, p, r, 3, phase, 64<<10), []float64{1, 1, 1})
	p.SetShaping(true)
	got = backlogged(t, p, r, 3, phase, 64<<10)
	if got[2] != 0 {
		t.Errorf("flow 2 paused again: share %.4f", got[2])
	}
	within(t, "3:5 after shaping on", got[:2], []float64{3, 5})
}

func TestPauseAndResume(t *testing.T) {
	p := New[int](1 << 30)
	p.SetWeight(1, 0)
	for i := 0; i < 5; i++ {
		p.Push(Entry[int]{Flow: 1, Bytes: 10, Value: i})
		p.Push(Entry[int]{Flow: 2, Bytes: 10, Value: 100 + i})
	}
	got := popAll(p)
	if len(got) != 5 {
		t.Fatalf("popped %d entries with flow 1 paused, want 5", len(got))
	}
	for _, e := range got {
		if e.Flow != 2 {
			t.Fatalf("paused flow 1 popped: %+v", e)
		}
	}
	if p.Len() != 5 {
		t.Fatalf("Len %d, want 5 paused entries kept", p.Len())
	}
	if _, ok := p.Pop(); ok {
		t.Fatal("Pop returned an entry of a paused flow")
	}
	p.SetWeight(1, 1)
	got = popAll(p)
	if len(got) != 5 {
		t.Fatalf("after resume popped %d, want 5", len(got))
	}
	for i, e := range got {
		if e.Flow != 1 || e.Value != i {
			t.Fatalf("after resume pop %d = %+v", i, e)
		}
	}
	// Pausing an active flow mid-stream removes it from the schedule.
	for i := 0; i < 3; i++ {
		p.Push(Entry[int]{Flow: 1, Bytes: 10, Value: i})
	}
	p.Pop()
	p.SetWeight(1, 0)
	if _, ok := p.Pop(); ok {
		t.Fatal("Pop after pausing an active flow returned an entry")
	}
	p.SetWeight(1, 2)
	if n := len(popAll(p)); n != 2 {
		t.Fatalf("after resume popped %d, want 2", n)
	}
}

func TestInvalidWeights(t *testing.T) {
	for _, w := range []float64{0, -1, math.NaN(), math.Inf(-1)} {
		p := New[int](100)
		p.SetWeight(9, w)
		if got := p.Weight(9); got != 0 {
			t.Errorf("SetWeight(%v): weight %v, want 0", w, got)
		}
		p.Push(Entry[int]{Flow: 9, Bytes: 1})
		if _, ok := p.Pop(); ok {
			t.Errorf("SetWeight(%v): flow not paused", w)
		}
	}
	p := New[int](100)
	p.SetWeight(1, math.Inf(1))
	if got := p.Weight(1); got != MaxWeight {
		t.Errorf("SetWeight(+Inf): weight %v, want MaxWeight", got)
	}
	p.Push(Entry[int]{Flow: 1, Bytes: math.MaxInt64 / 2})
	if _, ok := p.Pop(); !ok {
		t.Error("huge weight: nothing popped")
	}
}

// TestNoStarvation: a tiny weight with an entry far larger than its
// quantum, next to a heavy always-backlogged flow, is still served, after
// the number of rounds DRR predicts.
func TestNoStarvation(t *testing.T) {
	p := New[int](math.MaxInt64)
	p.SetWeight(1, 100)
	p.SetWeight(2, 0.01) // quantum of 655 bytes
	const big = 64 << 20
	const chunk = 1 << 20
	p.Push(Entry[int]{Flow: 2, Bytes: big})
	for i := 0; i < 4; i++ {
		p.Push(Entry[int]{Flow: 1, Bytes: chunk})
	}
	var heavy int64
	for {
		e, ok := p.Pop()
		if !ok {
			t.Fatal("nothing eligible")
		}
		if e.Flow == 2 {
			break
		}
		heavy += e.Bytes
		p.Push(Entry[int]{Flow: 1, Bytes: chunk})
	}
	q1, q2 := int64(BaseQuantum*100), int64(BaseQuantum/100)
	rounds := (big + q2 - 1) / q2
	if limit := (rounds + 1) * (q1 + chunk); heavy > limit {
		t.Fatalf("flow 1 moved %d bytes before flow 2 got its turn, DRR allows %d", heavy, limit)
	}
	if heavy < (rounds-1)*(q1-chunk) {
		t.Fatalf("flow 1 moved only %d bytes before flow 2: weights not applied", heavy)
	}
}

// TestLargeEntrySingleFlow: an entry far larger than the quantum is popped
// at once (rounds skipped), not after millions of iterations.
func TestLargeEntrySingleFlow(t *testing.T) {
	p := New[int](1 << 20)
	if !p.Admit(8 << 30) {
		t.Fatal("an entry larger than the limit must fit an empty pool")
	}
	p.Push(Entry[int]{Flow: 5, Bytes: 8 << 30, Value: 1})
	p.SetWeight(5, 1e-9)
	e, ok := p.Pop()
	if !ok || e.Value != 1 {
		t.Fatalf("Pop = %+v, %v", e, ok)
	}
}

func TestAdmit(t *testing.T) {
	p := New[int](1000)
	tests := []struct {
		push int64 // pushed before the check (0: none)
		n    int64
		want bool
	}{
		{0, 1000, true},
		{0, 5000, true}, // larger than the limit, pool empty
		{600, 400, true},
		{400, 1, false}, // 1000 queued
		{0, 0, true},
		{500, 1, false}, // over the limit (a Forward pushed anyway)
	}
	for i, tc := range tests {
		if tc.push > 0 {
			p.Push(Entry[int]{Flow: uint32(i), Bytes: tc.push})
		}
		if got := p.Admit(tc.n); got != tc.want {
			t.Errorf("step %d: Admit(%d) with %d queued = %v, want %v", i, tc.n, p.Bytes(), got, tc.want)
		}
	}
	if p.Bytes() != 1500 || p.Len() != 3 {
		t.Fatalf("Bytes %d Len %d, want 1500 and 3", p.Bytes(), p.Len())
	}
	popAll(p)
	if !p.Admit(1000) {
		t.Fatal("Admit after draining by Pop")
	}
}

func TestDrainAndRemoveFlow(t *testing.T) {
	p := New[int](1 << 20)
	p.SetWeight(3, 0)
	for i := 0; i < 10; i++ {
		p.Push(Entry[int]{Flow: uint32(i % 4), Priority: int32(i % 3), Bytes: 10, Value: i})
	}
	got := p.RemoveFlow(1) // values 1, 5, 9 with priorities 1, 2, 0
	want := []int{5, 1, 9}
	if len(got) != len(want) {
		t.Fatalf("RemoveFlow returned %d entries, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i].Value != want[i] {
			t.Fatalf("RemoveFlow order %v, want values %v", got, want)
		}
	}
	if p.Len() != 7 || p.Bytes() != 70 {
		t.Fatalf("after RemoveFlow: Len %d Bytes %d", p.Len(), p.Bytes())
	}
	if len(p.RemoveFlow(1)) != 0 || len(p.RemoveFlow(77)) != 0 {
		t.Fatal("RemoveFlow of an empty or unknown flow returned entries")
	}
	if e, ok := p.Pop(); !ok || e.Flow == 1 || e.Flow == 3 {
		t.Fatalf("Pop after RemoveFlow = %+v %v", e, ok)
	}
	rest := p.Drain()
	if len(rest) != 6 || p.Len() != 0 || p.Bytes() != 0 {
		t.Fatalf("Drain returned %d, left Len %d Bytes %d", len(rest), p.Len(), p.Bytes())
	}
	if _, ok := p.Pop(); ok {
		t.Fatal("Pop after Drain")
	}
	// The pool is usable after Drain, weights kept.
	p.Push(Entry[int]{Flow: 3, Bytes: 1})
	p.Push(Entry[int]{Flow: 2, Bytes: 1})
	if got := popAll(p); len(got) != 1 || got[0].Flow != 2 {
		t.Fatalf("after Drain popped %+v", got)
	}
}

// TestBookkeepingProperty mixes every operation at random and checks Len
// and Bytes against a model, and that nothing is lost or duplicated.
func TestBookkeepingProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	p := New[int](1 << 20)
	live := map[int]int64{} // value -> bytes
	next := 0
	take := func(es []Entry[int]) {
		for _, e := range es {
			if _, ok := live[e.Value]; !ok {
				t.Fatalf("entry %d returned twice or never pushed", e.Value)
			}
			delete(live, e.Value)
		}
	}
	for step := 0; step < 20000; step++ {
		switch op := r.IntN(20); {
		case op < 10:
			b := int64(r.IntN(1 << 18))
			p.Push(Entry[int]{Flow: uint32(r.IntN(6)), Priority: int32(r.IntN(4) - 2), Bytes: b, Value: next})
			live[next] = b
			next++
		case op < 16:
			if e, ok := p.Pop(); ok {
				take([]Entry[int]{e})
			}
		case op < 18:
			p.SetWeight(uint32(r.IntN(6)), []float64{0, 0.5, 1, 3}[r.IntN(4)])
		case op < 19:
			take(p.RemoveFlow(uint32(r.IntN(6))))
		default:
			if r.IntN(50) == 0 {
				take(p.Drain())
			}
		}
		var bytes int64
		for _, b := range live {
			bytes += b
		}
		if p.Len() != len(live) || p.Bytes() != bytes {
			t.Fatalf("step %d: Len %d Bytes %d, model %d and %d", step, p.Len(), p.Bytes(), len(live), bytes)
		}
	}
	for f := uint32(0); f < 6; f++ {
		p.SetWeight(f, 1)
	}
	take(popAll(p))
	if len(live) != 0 {
		t.Fatalf("%d entries lost", len(live))
	}
}

func BenchmarkPushPop(b *testing.B) {
	for _, flows := range []int{1, 8} {
		b.Run(map[int]string{1: "flows=1", 8: "flows=8"}[flows], func(b *testing.B) {
			const size = 64 << 10
			p := New[*int](1 << 30)
			v := new(int)
			b.SetBytes(size)
			b.ReportAllocs()
			// Keep a backlog so Pop does real scheduling work.
			for i := 0; i < 64; i++ {
				p.Push(Entry[*int]{Flow: uint32(i % flows), Priority: int32(i % 4), Bytes: size, Value: v})
			}
			for i := 0; b.Loop(); i++ {
				p.Push(Entry[*int]{Flow: uint32(i % flows), Priority: int32(i % 4), Bytes: size, Value: v})
				if _, ok := p.Pop(); !ok {
					b.Fatal("empty")
				}
			}
		})
	}
}

// TestPopIfKeepsOrder: a pool popped through PopIf, whose take refuses at
// random, pops the same entries in the same order as one popped with Pop,
// pushes, weight changes and shaping interleaved alike; a refused entry is
// the one the next call offers.
func TestPopIfKeepsOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for trial := range 100 {
		a, b := New[int](1<<30), New[int](1<<30)
		var got, want []int
		next := 0
		for step := range 400 {
			switch op := r.IntN(10); {
			case op < 4:
				e := Entry[int]{Flow: uint32(r.IntN(4)), Priority: int32(r.IntN(3)), Bytes: int64(1 + r.IntN(3*BaseQuantum)), Value: next}
				next++
				a.Push(e)
				b.Push(e)
			case op == 4:
				f, w := uint32(r.IntN(4)), float64(r.IntN(4))/2
				a.SetWeight(f, w)
				b.SetWeight(f, w)
			case op == 5:
				on := r.IntN(2) == 0
				a.SetShaping(on)
				b.SetShaping(on)
			default:
				e, ok := a.Pop()
				if ok {
					want = append(want, e.Value)
				}
				var offered []int
				for {
					f, took := b.PopIf(func(e *Entry[int]) bool {
						offered = append(offered, e.Value)
						return r.IntN(3) == 0
					})
					if took {
						got = append(got, f.Value)
						break
					}
					if len(offered) == 0 {
						break // nothing eligible
					}
					if o := offered[len(offered)-1]; len(offered) > 1 && o != offered[len(offered)-2] {
						t.Fatalf("trial %d step %d: refused entry %d, then offered %d", trial, step, offered[len(offered)-2], o)
					}
				}
				if len(got) != len(want) || len(got) > 0 && got[len(got)-1] != want[len(want)-1] {
					t.Fatalf("trial %d step %d: PopIf popped %v, Pop %v", trial, step, got, want)
				}
				if ok != (len(offered) > 0) {
					t.Fatalf("trial %d step %d: Pop found an entry: %v, PopIf offered %v", trial, step, ok, offered)
				}
			}
		}
		if len(got) != len(want) {
			t.Fatalf("trial %d: PopIf popped %d entries, Pop %d", trial, len(got), len(want))
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("trial %d: pop %d is entry %d through PopIf, %d through Pop", trial, i, got[i], want[i])
			}
		}
		if a.Len() != b.Len() || a.Bytes() != b.Bytes() {
			t.Fatalf("trial %d: left %d entries (%d bytes) against %d (%d)", trial, b.Len(), b.Bytes(), a.Len(), a.Bytes())
		}
	}
}
