package lb

import (
	"github.com/fptps/fpt/node"

	"errors"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

func TestEven(t *testing.T) {
	for n := 1; n <= 5; n++ {
		aggs := make([]node.ID, n)
		for i := range aggs {
			aggs[i] = node.ID(8 + 2*i)
		}
		d := Even(3, 17, aggs)
		if err := d.Validate(); err != nil {
			t.Fatalf("n=%d: %v", n, err)
		}
		if d.Version != 3 || d.Iteration != 17 || !reflect.DeepEqual(d.Aggregators, aggs) {
			t.Fatalf("n=%d: %v", n, d)
		}
		for _, s := range d.Shares {
			if s != 1/float64(n) {
				t.Fatalf("n=%d: shares %v", n, d.Shares)
			}
		}
		aggs[0] = 999
		if d.Aggregators[0] == 999 {
			t.Fatalf("n=%d: Even kept the caller's slice", n)
		}
	}
	if err := Even(1, 0, nil).Validate(); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Even over nothing validated: %v", err)
	}
}

func TestValidate(t *testing.T) {
	withWorkers := func(ws ...node.ID) Decision {
		d := Even(3, 10, []node.ID{8, 10})
		d.Workers = ws
		return d
	}
	cases := []struct {
		name string
		d    Decision
		ok   bool
	}{
		{"even", Even(1, 0, []node.ID{8, 10}), true},
		{"weighted", Decision{Aggregators: []node.ID{8, 10, 9}, Shares: []float64{0.5, 0.3, 0.2}}, true},
		{"zero share allowed", Decision{Aggregators: []node.ID{8, 10}, Shares: []float64{1, 0}}, true},
		{"within tolerance", Decision{Aggregators: []node.ID{8, 10}, Shares: []float64{0.5, 0.5 + 1e-10}}, true},
		{"empty", Decision{}, false},
		{"shares missing", Decision{Aggregators: []node.ID{8, 10}, Shares: []float64{1}}, false},
		{"too many shares", Decision{Aggregators: []node.ID{8}, Shares: []float64{1, 0}}, false},
		{"negative", Decision{Aggregators: []node.ID{8, 10}, Shares: []float64{1.5, -0.5}}, false},
		{"NaN", Decision{Aggregators: []node.ID{8, 10}, Shares: []float64{math.NaN(), 1}}, false},
		{"Inf", Decision{Aggregators: []node.ID{8, 10}, Shares: []float64{math.Inf(1), 1}}, false},
		{"sum too small", Decision{Aggregators: []node.ID{8, 10}, Shares: []float64{0.5, 0.4}}, false},
		{"sum off by 1e-8", Decision{Aggregators: []node.ID{8, 10}, Shares: []float64{0.5, 0.5 + 1e-8}}, false},
		{"all zero", Decision{Aggregators: []node.ID{8, 10}, Shares: []float64{0, 0}}, false},
		{"duplicate aggregator", Decision{Aggregators: []node.ID{8, 10, 8}, Shares: []float64{0.4, 0.3, 0.3}}, false},
		// Workers, when set: worker ids in strictly increasing order, at
		// least one.
		{"one worker", withWorkers(9), true},
		{"workers increasing, with gaps", withWorkers(9, 13, 21), true},
		{"no workers, not nil", withWorkers([]node.ID{}...), false},
		{"workers unsorted", withWorkers(13, 9), false},
		{"a worker twice", withWorkers(9, 9), false},
		{"a server as a worker", withWorkers(8, 9), false},
		{"the scheduler as a worker", withWorkers(1), false},
		{"a group id as a worker", withWorkers(4), false},
		{"id 0 as a worker", withWorkers(0, 9), false},
	}
	for _, c := range cases {
		err := c.d.Validate()
		if c.ok && err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
		if !c.ok && !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: got %v, want ErrInvalid", c.name, err)
		}
	}
}

// checkLayout verifies the invariants every layout must satisfy and returns
// the bytes each aggregator received.
func checkLayout(t *testing.T, d Decision, key, total uint64, es int, maxPart uint64, parts []Partition) map[node.ID]uint64 {
	t.Helper()
	mp := maxPart - maxPart%uint64(es)
	if mp < uint64(es) {
		mp = uint64(es)
	}
	known := map[node.ID]bool{}
	for _, a := range d.Aggregators {
		known[a] = true
	}
	got := map[node.ID]uint64{}
	var off uint64
	for i, p := range parts {
		switch {
		case p.Index != uint32(i):
			t.Fatalf("key %d total %d: partition %d has index %d", key, total, i, p.Index)
		case p.Offset != off:
			t.Fatalf("key %d total %d: partition %d at %d, want %d (not contiguous)", key, total, i, p.Offset, off)
		case p.Length == 0:
			t.Fatalf("key %d total %d: partition %d empty", key, total, i)
		case p.Length > mp:
			t.Fatalf("key %d total %d: partition %d has %d bytes > maxPart %d", key, total, i, p.Length, mp)
		case p.Offset%uint64(es) != 0 || p.Length%uint64(es) != 0:
			t.Fatalf("key %d total %d: partition %d [%d,+%d) not %d-aligned", key, total, i, p.Offset, p.Length, es)
		case !known[p.Aggregator]:
			t.Fatalf("key %d total %d: partition %d goes to unknown aggregator %d", key, total, i, p.Aggregator)
		}
		off += p.Length
		got[p.Aggregator] += p.Length
	}
	if off != total {
		t.Fatalf("key %d: partitions cover %d bytes, want %d", key, off, total)
	}
	for i, a := range d.Aggregators {
		if d.Shares[i] == 0 && got[a] != 0 {
			t.Fatalf("key %d total %d: zero-share aggregator %d got %d bytes", key, total, a, got[a])
		}
	}
	if again := d.Layout(key, total, es, maxPart); !reflect.DeepEqual(again, parts) {
		t.Fatalf("key %d total %d: layout not deterministic", key, total)
	}
	return got
}

// randomDecision returns a valid decision over 1..6 aggregators, some with
// zero shares.
func randomDecision(rng *rand.Rand) Decision {
	n := 1 + rng.IntN(6)
	d := Decision{Aggregators: make([]node.ID, n), Shares: make([]float64, n)}
	perm := rng.Perm(20)
	var sum float64
	for i := range n {
		d.Aggregators[i] = node.ID(8 + perm[i])
		if i == 0 || rng.IntN(4) != 0 {
			d.Shares[i] = rng.Float64() + 0.01
		}
		sum += d.Shares[i]
	}
	for i := range d.Shares {
		d.Shares[i] /= sum
	}
	return d
}

func TestLayoutRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for iter := range 3000 {
		d := randomDecision(rng)
		if err := d.Validate(); err != nil {
			t.Fatal(err)
		}
		es := []int{2, 4, 8}[rng.IntN(3)]
		var total uint64
		switch rng.IntN(3) {
		case 0: // small
			total = uint64(rng.IntN(MinSplit/es)) * uint64(es)
		case 1: // around the threshold
			total = uint64(MinSplit/es-50+rng.IntN(100)) * uint64(es)
		default: // big
			total = uint64(rng.Int64N(64<<20)/int64(es)) * uint64(es)
		}
		maxPart := uint64(1 + rng.Int64N(8<<20))
		if iter%10 == 0 {
			maxPart = uint64(rng.IntN(3 * es)) // tiny, even zero: clamped
		}
		if total/max(maxPart, 1) > 5000 {
			maxPart = total/5000 + 1 // keep the partition count (and the test's time) sane
		}
		key := rng.Uint64()
		parts := d.Layout(key, total, es, maxPart)
		got := checkLayout(t, d, key, total, es, maxPart, parts)
		if total == 0 {
			if parts != nil {
				t.Fatalf("empty tensor: %v", parts)
			}
			continue
		}
		if total < MinSplit {
			if len(got) != 1 {
				t.Fatalf("small tensor (%d bytes) split over %d aggregators", total, len(got))
			}
			continue
		}
		mp := max(maxPart-maxPart%uint64(es), uint64(es))
		for i, a := range d.Aggregators {
			want := d.Shares[i] * float64(total)
			if diff := math.Abs(float64(got[a]) - want); diff > float64(mp)+float64(es) {
				t.Fatalf("total %d share %g: aggregator %d got %d bytes, want about %.0f", total, d.Shares[i], a, got[a], want)
			}
			// In fact the split is exact to within one element (plus the
			// 2^-32 resolution of the weights).
			if diff := math.Abs(float64(got[a]) - want); diff > float64(es)+float64(total)/(1<<31) {
				t.Fatalf("total %d share %g: aggregator %d got %d bytes, want %.1f", total, d.Shares[i], a, got[a], want)
			}
		}
	}
}

func TestLayoutBasics(t *testing.T) {
	d := Even(1, 0, []node.ID{8, 10, 12})
	if p := d.Layout(5, 0, 4, 1<<20); p != nil {
		t.Fatalf("empty tensor: %v", p)
	}
	// Small: whole, one partition.
	p := d.Layout(5, 4000, 4, 1<<20)
	if len(p) != 1 || p[0].Offset != 0 || p[0].Length != 4000 {
		t.Fatalf("small tensor: %v", p)
	}
	// Small but larger than maxPart: several pieces, one aggregator.
	p = d.Layout(5, 4000, 4, 1000)
	if len(p) != 4 || p[0].Aggregator != p[3].Aggregator || p[3].Length != 1000 {
		t.Fatalf("small tensor in pieces: %v", p)
	}
	// maxPart clamped up to one element, and down to whole elements.
	p = d.Layout(5, 16, 8, 3)
	if len(p) != 2 || p[0].Length != 8 {
		t.Fatalf("maxPart below one element: %v", p)
	}
	p = d.Layout(5, 64, 8, 20)
	if len(p) != 4 || p[0].Length != 16 {
		t.Fatalf("maxPart not element-aligned: %v", p)
	}
	// Big: even thirds of 3 MiB, 1 MiB each, cut into 512 KiB.
	p = d.Layout(5, 3<<20, 4, 512<<10)
	if len(p) != 6 {
		t.Fatalf("big tensor: %v", p)
	}
	for i := 0; i < 6; i += 2 {
		if p[i].Aggregator != p[i+1].Aggregator || p[i].Length != 512<<10 {
			t.Fatalf("big tensor: %v", p)
		}
	}
	// Largest remainder: 65537 elements over 3 aggregators is 21846+21846+21845 or similar.
	checkLayout(t, d, 5, 65537*4, 4, 1<<30, d.Layout(5, 65537*4, 4, 1<<30))
}

func TestLayoutPanics(t *testing.T) {
	d := Even(1, 0, []node.ID{8})
	for name, f := range map[string]func(){
		"elemSize 0":        func() { d.Layout(1, 8, 0, 8) },
		"total not whole":   func() { d.Layout(1, 10, 4, 8) },
		"no positive share": func() { Decision{Aggregators: []node.ID{8}, Shares: []float64{0}}.Layout(1, 8, 4, 8) },
		"shares missing":    func() { Decision{Aggregators: []node.ID{8}}.Layout(1, 8, 4, 8) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
}

// TestLayoutHuge: a 5 GiB tensor (lengths past 32 bits) is just arithmetic.
func TestLayoutHuge(t *testing.T) {
	d := Decision{Aggregators: []node.ID{8, 10, 12}, Shares: []float64{0.5, 0.25, 0.25}}
	const total = 5 << 30
	parts := d.Layout(99, total, 2, 4<<20)
	got := checkLayout(t, d, 99, total, 2, 4<<20, parts)
	if got[8] != total/2 || got[10] != total/4 || got[12] != total/4 {
		t.Fatalf("5 GiB split %v", got)
	}
	if len(parts) != 1280 {
		t.Fatalf("%d partitions, want 1280", len(parts))
	}
	if last := parts[len(parts)-1]; last.Offset+last.Length != total || last.Offset < 1<<32 {
		t.Fatalf("last partition %+v", last)
	}
}

// TestLayoutSmallSpread: small tensors go whole to one aggregator, and over
// many keys the choice follows the shares.
func TestLayoutSmallSpread(t *testing.T) {
	cases := []struct {
		name string
		d    Decision
	}{
		{"even 1", Even(1, 0, []node.ID{8})},
		{"even 2", Even(1, 0, []node.ID{8, 10})},
		{"even 3", Even(1, 0, []node.ID{8, 10, 12})},
		{"even 5", Even(1, 0, []node.ID{8, 10, 12, 14, 16})},
		{"weighted with a zero", Decision{Aggregators: []node.ID{8, 10, 12, 14}, Shares: []float64{0.5, 0.3, 0, 0.2}}},
	}
	const keys = 20000
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			count := map[node.ID]int{}
			for k := range uint64(keys) {
				p := c.d.Layout(k, 1000*4, 4, 1<<20)
				if len(p) != 1 {
					t.Fatalf("key %d: %v", k, p)
				}
				count[p[0].Aggregator]++
			}
			for i, a := range c.d.Aggregators {
				want := c.d.Shares[i] * keys
				if got := float64(count[a]); math.Abs(got-want) > 0.05*keys*math.Sqrt(c.d.Shares[i]) && !(want == 0 && got == 0) {
					t.Errorf("aggregator %d: %v small tensors, want about %.0f", a, got, want)
				}
				if c.d.Shares[i] == 0 && count[a] != 0 {
					t.Errorf("zero-share aggregator %d got %d tensors", a, count[a])
				}
			}
		})
	}
}

// TestLayoutRotation: over many big tensors, the first segment goes to
// every aggregator about equally often.
func TestLayoutRotation(t *testing.T) {
	d := Even(1, 0, []node.ID{8, 10, 12, 14})
	first := map[node.ID]int{}
	const keys = 4000
	for k := range uint64(keys) {
		p := d.Layout(k, 4<<20, 4, 1<<20)
		first[p[0].Aggregator]++
	}
	for _, a := range d.Aggregators {
		if n := first[a]; n < keys/4*8/10 || n > keys/4*12/10 {
			t.Errorf("aggregator %d gets the first segment of %d of %d tensors", a, n, keys)
		}
	}
}

func TestSchedule(t *testing.T) {
	aggs := []node.ID{8, 10}
	if _, err := NewSchedule(Decision{}); err == nil {
		t.Fatal("invalid initial decision accepted")
	}
	s, err := NewSchedule(Even(1, 0, aggs))
	if err != nil {
		t.Fatal(err)
	}
	w := func(v uint32, it uint64, shares ...float64) Decision {
		return Decision{Version: v, Iteration: it, Aggregators: aggs, Shares: shares}
	}
	steps := []struct {
		name string
		d    Decision
		ok   bool
	}{
		{"later version and iteration", w(2, 10, 0.7, 0.3), true},
		{"same version", w(2, 12, 0.6, 0.4), false},
		{"older version", w(1, 12, 0.6, 0.4), false},
		{"iteration backwards", w(3, 9, 0.6, 0.4), false},
		{"invalid", w(3, 12, 0.6, 0.6), false},
		{"same iteration supersedes", w(3, 10, 0.8, 0.2), true},
		{"version may skip", w(7, 20, 0.1, 0.9), true},
		{"later", w(8, 30, 0.2, 0.8), true},
	}
	for _, st := range steps {
		before := s.Len()
		err := s.Add(st.d)
		if st.ok != (err == nil) {
			t.Fatalf("%s: err %v, want ok=%v", st.name, err, st.ok)
		}
		if !st.ok && s.Len() != before {
			t.Fatalf("%s: rejected decision changed the schedule", st.name)
		}
	}
	at := []struct {
		iter    uint64
		version uint32
	}{{0, 1}, {9, 1}, {10, 3}, {19, 3}, {20, 7}, {29, 7}, {30, 8}, {1 << 40, 8}}
	for _, c := range at {
		if v := s.At(c.iter).Version; v != c.version {
			t.Errorf("At(%d) = version %d, want %d", c.iter, v, c.version)
		}
	}
	if v := s.Latest().Version; v != 8 {
		t.Errorf("Latest() = version %d", v)
	}

	// Forget keeps the decision in force at before and all later ones.
	s.Forget(5) // version 1 is in force at 5: nothing goes
	if s.Len() != 5 || s.At(0).Version != 1 {
		t.Fatalf("Forget(5): %d decisions, At(0) = v%d", s.Len(), s.At(0).Version)
	}
	s.Forget(25) // version 7 in force at 25
	if s.Len() != 2 || s.At(25).Version != 7 || s.At(30).Version != 8 {
		t.Fatalf("Forget(25): %d decisions, At(25) = v%d", s.Len(), s.At(25).Version)
	}
	if v := s.At(3).Version; v != 7 {
		t.Errorf("At before the earliest kept = v%d, want the earliest kept (7)", v)
	}
	s.Forget(1 << 50)
	if s.Len() != 1 || s.Latest().Version != 8 {
		t.Fatalf("Forget(all): %d decisions, latest v%d", s.Len(), s.Latest().Version)
	}
	// Ordering still enforced against the latest after forgetting.
	if err := s.Add(w(8, 40, 0.5, 0.5)); err == nil {
		t.Fatal("same version accepted after Forget")
	}
	if err := s.Add(w(9, 29, 0.5, 0.5)); err == nil {
		t.Fatal("earlier iteration accepted after Forget")
	}

	// The schedule keeps its own copy.
	d := w(10, 50, 0.5, 0.5)
	if err := s.Add(d); err != nil {
		t.Fatal(err)
	}
	d.Shares[0] = 42
	if s.Latest().Shares[0] != 0.5 {
		t.Fatal("schedule shares the caller's slice")
	}
}

// TestScheduleRewrite: a retry's decision replaces every decision taking
// effect at or after its iteration and leaves the earlier ones in force;
// one that is invalid or not newer than every decision held changes
// nothing.
func TestScheduleRewrite(t *testing.T) {
	servers := []node.ID{8, 10, 12}
	left := []node.ID{8, 12} // server 10 lost
	base := func(t *testing.T) *Schedule {
		t.Helper()
		s, err := NewSchedule(Even(1, 0, servers))
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range []Decision{
			{Version: 2, Iteration: 10, Aggregators: servers, Shares: []float64{0.5, 0.25, 0.25}},
			{Version: 3, Iteration: 20, Aggregators: servers, Shares: []float64{0.25, 0.5, 0.25}},
			{Version: 4, Iteration: 30, Aggregators: servers, Shares: []float64{0.25, 0.25, 0.5}},
		} {
			if err := s.Add(d); err != nil {
				t.Fatal(err)
			}
		}
		return s
	}
	cases := []struct {
		name string
		d    Decision
		ok   bool
		kept int // decisions kept from before
	}{
		{"between two decisions", Even(5, 15, left), true, 2},
		{"at a decision's iteration: replaces it", Even(5, 20, left), true, 2},
		{"at the first decision: replaces all", Even(5, 0, left), true, 0},
		{"after the latest: appends", Even(5, 40, left), true, 4},
		{"version may skip", Even(9, 25, left), true, 3},
		{"same version as the latest", Even(4, 15, left), false, 4},
		{"older than the latest", Even(3, 35, left), false, 4},
		{"invalid shares", Decision{Version: 5, Iteration: 15, Aggregators: left, Shares: []float64{0.6, 0.6}}, false, 4},
		{"no aggregators", Decision{Version: 5, Iteration: 15}, false, 4},
	}
	probe := []uint64{0, 9, 10, 14, 15, 19, 20, 24, 25, 29, 30, 39, 40, 1 << 40}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, old := base(t), base(t)
			err := s.Rewrite(tc.d)
			if tc.ok != (err == nil) {
				t.Fatalf("err %v, want ok=%v", err, tc.ok)
			}
			if want := tc.kept + map[bool]int{true: 1}[tc.ok]; s.Len() != want {
				t.Fatalf("%d decisions, want %d", s.Len(), want)
			}
			for _, it := range probe {
				want := old.At(it)
				if tc.ok && it >= tc.d.Iteration {
					want = tc.d
				}
				if got := s.At(it); !reflect.DeepEqual(got, want) {
					t.Errorf("At(%d) = %v, want %v", it, got, want)
				}
			}
			if !tc.ok {
				return
			}
			if !reflect.DeepEqual(s.Latest(), tc.d) {
				t.Errorf("Latest() = %v, want %v", s.Latest(), tc.d)
			}
			// The schedule keeps its own copy, and later decisions follow
			// the rewritten one.
			tc.d.Shares[0] = 42
			if s.Latest().Shares[0] == 42 {
				t.Error("schedule shares the caller's slice")
			}
			if err := s.Add(Even(tc.d.Version, tc.d.Iteration+1, left)); err == nil {
				t.Error("Add of the rewritten decision's version accepted")
			}
			if err := s.Add(Even(tc.d.Version+1, tc.d.Iteration+1, left)); err != nil {
				t.Errorf("Add after Rewrite: %v", err)
			}
		})
	}
}

// TestScheduleForgetKeepsWorkers: Forget drops the decisions before an
// iteration but WorkersAt still answers for every iteration, from the
// worker sets of those dropped (a rewrite that goes back before them
// replaces the later sets).
func TestScheduleForgetKeepsWorkers(t *testing.T) {
	aggs := []node.ID{8, 10}
	all, two, back := []node.ID{9, 11, 13}, []node.ID{9, 13}, []node.ID{9, 13, 15}
	d := func(v uint32, it uint64, workers []node.ID) Decision {
		return Decision{Version: v, Iteration: it, Aggregators: aggs, Shares: []float64{0.5, 0.5}, Workers: workers}
	}
	build := func(t *testing.T) *Schedule {
		t.Helper()
		s, err := NewSchedule(d(1, 0, all))
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range []Decision{
			d(2, 5, nil), d(3, 10, two), d(4, 10, two), d(5, 12, nil), d(6, 20, back), d(7, 25, nil), d(8, 30, nil),
		} {
			if err := s.Add(x); err != nil {
				t.Fatal(err)
			}
		}
		return s
	}
	want := map[uint64][]node.ID{0: all, 4: all, 5: all, 9: all, 10: two, 11: two, 19: two, 20: back, 29: back, 30: back, 1 << 40: back}
	cases := []struct {
		name    string
		before  uint64
		rewrite *Decision // applied after Forget
		len     int
		want    map[uint64][]node.ID
	}{
		{"nothing to forget", 3, nil, 8, want},
		{"some", 22, nil, 3, want},
		{"all but the latest", 1 << 40, nil, 1, want},
		{"rewrite before the kept", 28, &Decision{Version: 9, Iteration: 15, Aggregators: aggs, Shares: []float64{0.5, 0.5}, Workers: all}, 1,
			map[uint64][]node.ID{0: all, 9: all, 10: two, 14: two, 15: all, 40: all}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := build(t)
			s.Forget(tc.before)
			if tc.rewrite != nil {
				if err := s.Rewrite(*tc.rewrite); err != nil {
					t.Fatal(err)
				}
			}
			if s.Len() != tc.len {
				t.Errorf("%d decisions held, want %d", s.Len(), tc.len)
			}
			for it, ws := range tc.want {
				if got := s.WorkersAt(it); !slices.Equal(got, ws) {
					t.Errorf("WorkersAt(%d) = %v, want %v", it, got, ws)
				}
			}
		})
	}
}
