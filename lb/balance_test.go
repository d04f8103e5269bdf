package lb

import (
	"github.com/fptps/fpt/node"

	"errors"
	"math"
	"slices"
	"testing"
	"time"
)

// caps builds a capacity map: every id at c, then the overrides.
func caps(c float64, ids []node.ID, over map[node.ID]float64) map[node.ID]float64 {
	m := make(map[node.ID]float64, len(ids))
	for _, id := range ids {
		m[id] = c
	}
	for id, v := range over {
		m[id] = v
	}
	return m
}

// near reports whether durations a and b agree to a relative 1e-6 (plus a
// nanosecond of rounding).
func near(a, b time.Duration) bool {
	return math.Abs(float64(a-b)) <= 1e-6*math.Abs(float64(b))+1
}

func TestBalance(t *testing.T) {
	const gb = 1e9           // bytes/s
	const model = 1e8        // bytes a worker pushes per iteration
	unit := time.Second / 10 // model / gb
	s2, w2 := []node.ID{8, 10}, []node.ID{9, 11}
	s4, w4 := []node.ID{8, 10, 12, 14}, []node.ID{9, 11, 13, 15}
	all := func(s, w []node.ID) []node.ID { return slices.Concat(s, w) }
	cases := []struct {
		name     string
		in       Input
		aggs     []node.ID
		shares   []float64 // nil: not checked exactly
		balanced bool
		// predicted and even in units of model/gb, checked if times
		predicted, even float64
		times           bool
		atBound         bool // Predicted equals Bound
	}{
		{
			name:     "2w2s one server at a quarter: all to the workers",
			in:       Input{Servers: s2, Workers: w2, Capacity: caps(gb, all(s2, w2), map[node.ID]float64{10: gb / 4}), ModelBytes: model},
			aggs:     w2,
			shares:   []float64{0.5, 0.5},
			balanced: true, predicted: 1, even: 4, times: true, atBound: true,
		},
		{
			name:   "4w4s equal: even over the servers, exactly",
			in:     Input{Servers: s4, Workers: w4, Capacity: caps(gb, all(s4, w4), nil), ModelBytes: model},
			aggs:   s4,
			shares: []float64{0.25, 0.25, 0.25, 0.25},
			// a server carries 4·¼·M, a worker M: both M/c
			predicted: 1, even: 1, times: true, atBound: true,
		},
		{
			// Even, servers carry 2M each and workers M: the workers take
			// some. Level L: 2·L/4 + 4·(L−1)/2 = 1, L = 1.2.
			name:     "4w2s equal: workers relieve the servers",
			in:       Input{Servers: s2, Workers: w4, Capacity: caps(gb, all(s2, w4), nil), ModelBytes: model},
			aggs:     all(s2, w4),
			shares:   []float64{0.3, 0.3, 0.1, 0.1, 0.1, 0.1},
			balanced: true, predicted: 1.2, even: 2, times: true, atBound: true,
		},
		{
			name:   "4w2s one worker slow: even over the servers kept",
			in:     Input{Servers: s2, Workers: w4, Capacity: caps(gb, all(s2, w4), map[node.ID]float64{13: gb / 4}), ModelBytes: model},
			aggs:   s2,
			shares: []float64{0.5, 0.5},
			// the slow worker's own M at a quarter speed bounds every split
			predicted: 4, even: 4, times: true, atBound: true,
		},
		{
			name:   "one worker sums everything itself",
			in:     Input{Servers: s2, Workers: []node.ID{9}, Capacity: caps(gb, all(s2, []node.ID{9}), nil), ModelBytes: model},
			aggs:   []node.ID{9},
			shares: []float64{1},
			// even: a server carries ½M, the worker sends all of M
			balanced: true, predicted: 0, even: 1, times: true, atBound: true,
		},
		{
			name:     "2w2s workers split by capacity",
			in:       Input{Servers: s2, Workers: w2, Capacity: caps(gb, all(s2, w2), map[node.ID]float64{8: gb / 8, 10: gb / 8, 11: gb / 2}), ModelBytes: model},
			aggs:     w2,
			shares:   []float64{2.0 / 3, 1.0 / 3},
			balanced: true, predicted: 2, even: 8, times: true, atBound: true,
		},
		{
			name:     "4w2s one server dead slow: it gets next to nothing",
			in:       Input{Servers: s2, Workers: w4, Capacity: caps(gb, all(s2, w4), map[node.ID]float64{10: 1}), ModelBytes: model},
			balanced: true, atBound: true,
		},
		{
			name:   "tolerance keeps a slightly better split away",
			in:     Input{Servers: s4, Workers: w4, Capacity: caps(gb, all(s4, w4), map[node.ID]float64{14: gb * 0.97}), ModelBytes: model},
			aggs:   s4,
			shares: []float64{0.25, 0.25, 0.25, 0.25},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := Balance(c.in)
			if err != nil {
				t.Fatal(err)
			}
			d := Decision{Version: 1, Aggregators: p.Aggregators, Shares: p.Shares}
			if err := d.Validate(); err != nil {
				t.Fatalf("plan does not validate: %v", err)
			}
			if c.aggs != nil && !slices.Equal(p.Aggregators, c.aggs) {
				t.Errorf("aggregators %v, want %v", p.Aggregators, c.aggs)
			}
			for i, s := range c.shares {
				if i >= len(p.Shares) || math.Abs(p.Shares[i]-s) > 1e-12 {
					t.Errorf("shares %v, want %v", p.Shares, c.shares)
					break
				}
			}
			if p.Balanced != c.balanced {
				t.Errorf("Balanced = %v, want %v", p.Balanced, c.balanced)
			}
			if c.times {
				if want := time.Duration(c.predicted * float64(unit)); !near(p.Predicted, want) {
					t.Errorf("Predicted %v, want %v", p.Predicted, want)
				}
				if want := time.Duration(c.even * float64(unit)); !near(p.Even, want) {
					t.Errorf("Even %v, want %v", p.Even, want)
				}
			}
			bound, err := Bound(c.in)
			if err != nil {
				t.Fatal(err)
			}
			if p.Predicted < bound-1 {
				t.Errorf("Predicted %v below the bound %v", p.Predicted, bound)
			}
			if c.atBound && !near(p.Predicted, bound) {
				t.Errorf("Predicted %v, want the bound %v", p.Predicted, bound)
			}
			if got, err := Predict(c.in, d); err != nil || !near(got, p.Predicted) {
				t.Errorf("Predict(plan) = %v, %v; want %v", got, err, p.Predicted)
			}
			if got, err := Predict(c.in, Even(0, 0, c.in.Servers)); err != nil || !near(got, p.Even) {
				t.Errorf("Predict(even) = %v, %v; want %v", got, err, p.Even)
			}
		})
	}
}

func TestBalanceDeadSlowServer(t *testing.T) {
	s, w := []node.ID{8, 10}, []node.ID{9, 11, 13, 15}
	in := Input{Servers: s, Workers: w, Capacity: caps(1e9, slices.Concat(s, w), map[node.ID]float64{10: 1}), ModelBytes: 1e8}
	p, err := Balance(in)
	if err != nil {
		t.Fatal(err)
	}
	for i, a := range p.Aggregators {
		if a == 10 && p.Shares[i] > 1e-6 {
			t.Fatalf("dead-slow server gets share %g: %v %v", p.Shares[i], p.Aggregators, p.Shares)
		}
	}
	if p.Predicted > time.Second {
		t.Fatalf("predicted %v with the dead server all but idle", p.Predicted)
	}
	if p.Even < time.Hour {
		t.Fatalf("even split over a 1 byte/s server predicted at only %v", p.Even)
	}
}

// The shares do not depend on the model size, which may be unknown (0),
// and neither does the choice between the even split and the balanced one.
func TestBalanceModelSize(t *testing.T) {
	s, w := []node.ID{8, 10}, []node.ID{9, 11, 13, 15}
	c := caps(1e9, slices.Concat(s, w), map[node.ID]float64{10: 2e8, 13: 5e8})
	ref, err := Balance(Input{Servers: s, Workers: w, Capacity: c, ModelBytes: 1e8})
	if err != nil || !ref.Balanced {
		t.Fatalf("reference: %v, %+v", err, ref)
	}
	for _, m := range []float64{0, 1, 1e3, 1e12, 1e18} {
		p, err := Balance(Input{Servers: s, Workers: w, Capacity: c, ModelBytes: m})
		if err != nil {
			t.Fatalf("M=%g: %v", m, err)
		}
		if p.Balanced != ref.Balanced || !slices.Equal(p.Aggregators, ref.Aggregators) {
			t.Fatalf("M=%g: %v %v, want %v %v", m, p.Aggregators, p.Shares, ref.Aggregators, ref.Shares)
		}
		for i := range p.Shares {
			if math.Abs(p.Shares[i]-ref.Shares[i]) > 1e-12 {
				t.Fatalf("M=%g: shares %v, want %v", m, p.Shares, ref.Shares)
			}
		}
		if p.Predicted < 0 || p.Even < 0 || p.Predicted > p.Even {
			t.Fatalf("M=%g: predicted %v, even %v", m, p.Predicted, p.Even)
		}
	}
}

// Predictions too long for a Duration saturate rather than wrap.
func TestPredictSaturates(t *testing.T) {
	s, w := []node.ID{8}, []node.ID{9, 11, 13}
	in := Input{Servers: s, Workers: w, Capacity: caps(1e-6, slices.Concat(s, w), nil), ModelBytes: 1e18}
	got, err := Predict(in, Even(1, 0, s))
	if err != nil {
		t.Fatal(err)
	}
	if got != math.MaxInt64 {
		t.Fatalf("Predict = %v, want the longest Duration", got)
	}
}

func TestBalanceErrors(t *testing.T) {
	s, w := []node.ID{8, 10}, []node.ID{9, 11}
	ok := func() map[node.ID]float64 { return caps(1e9, slices.Concat(s, w), nil) }
	with := func(id node.ID, c float64) map[node.ID]float64 { m := ok(); m[id] = c; return m }
	without := func(id node.ID) map[node.ID]float64 { m := ok(); delete(m, id); return m }
	cases := []struct {
		name     string
		in       Input
		capacity bool // wraps ErrCapacity
	}{
		{"missing server", Input{Servers: s, Workers: w, Capacity: without(10), ModelBytes: 1}, true},
		{"missing worker", Input{Servers: s, Workers: w, Capacity: without(9), ModelBytes: 1}, true},
		{"nil map", Input{Servers: s, Workers: w, ModelBytes: 1}, true},
		{"zero", Input{Servers: s, Workers: w, Capacity: with(8, 0), ModelBytes: 1}, true},
		{"negative", Input{Servers: s, Workers: w, Capacity: with(11, -5), ModelBytes: 1}, true},
		{"NaN", Input{Servers: s, Workers: w, Capacity: with(8, math.NaN()), ModelBytes: 1}, true},
		{"+Inf", Input{Servers: s, Workers: w, Capacity: with(9, math.Inf(1)), ModelBytes: 1}, true},
		{"huge", Input{Servers: s, Workers: w, Capacity: with(10, 2*MaxCapacity), ModelBytes: 1}, true},
		{"no servers", Input{Workers: w, Capacity: ok(), ModelBytes: 1}, true},
		{"no workers", Input{Servers: s, Capacity: ok(), ModelBytes: 1}, true},
		{"NaN model", Input{Servers: s, Workers: w, Capacity: ok(), ModelBytes: math.NaN()}, true},
		{"negative model", Input{Servers: s, Workers: w, Capacity: ok(), ModelBytes: -1}, true},
		{"NaN tolerance", Input{Servers: s, Workers: w, Capacity: ok(), ModelBytes: 1, Tolerance: math.NaN()}, false},
		{"negative tolerance", Input{Servers: s, Workers: w, Capacity: ok(), ModelBytes: 1, Tolerance: -0.5}, false},
	}
	for _, c := range cases {
		if p, err := Balance(c.in); err == nil {
			t.Errorf("%s: Balance accepted: %+v", c.name, p)
		} else if c.capacity != errors.Is(err, ErrCapacity) {
			t.Errorf("%s: %v; ErrCapacity %v", c.name, err, errors.Is(err, ErrCapacity))
		}
		if _, err := Bound(c.in); err == nil {
			t.Errorf("%s: Bound accepted", c.name)
		}
		if _, err := Predict(c.in, Even(1, 0, s)); err == nil {
			t.Errorf("%s: Predict accepted", c.name)
		}
	}
	// A malformed decision is an error, not a panic.
	in := Input{Servers: s, Workers: w, Capacity: ok(), ModelBytes: 1}
	bad := Decision{Version: 1, Aggregators: []node.ID{8, 10}, Shares: []float64{1}}
	if _, err := Predict(in, bad); !errors.Is(err, ErrInvalid) {
		t.Errorf("Predict of a decision with a missing share: %v", err)
	}
}

func TestWeights(t *testing.T) {
	servers, workers := []node.ID{8, 10}, []node.ID{9, 11}
	d := Decision{Aggregators: []node.ID{8, 10, 9}, Shares: []float64{0.5, 0.25, 0.25}}
	cases := []struct {
		name string
		d    Decision
		self node.ID
		want map[node.ID]float64
	}{
		{
			// to 8 its half; to 10 its quarter; to worker 11 its own sums (¼)
			name: "aggregating worker", d: d, self: 9,
			want: map[node.ID]float64{8: 1, 10: 0.5, 11: 0.5},
		},
		{
			// to 8 and 10 its contributions; to worker 9 its contribution to 9's share
			name: "plain worker", d: d, self: 11,
			want: map[node.ID]float64{8: 1, 10: 0.5, 9: 0.5},
		},
		{
			name: "server: sums to every worker, nothing to servers", d: d, self: 8,
			want: map[node.ID]float64{10: MinWeight, 9: 1, 11: 1},
		},
		{
			name: "zero-share server gets MinWeight from a worker", d: Even(1, 0, []node.ID{8}), self: 9,
			want: map[node.ID]float64{8: 1, 10: MinWeight, 11: MinWeight},
		},
		{
			name: "zero-share server sends nothing", d: Even(1, 0, []node.ID{8}), self: 10,
			want: map[node.ID]float64{8: MinWeight, 9: MinWeight, 11: MinWeight},
		},
		{
			name: "even over servers", d: Even(1, 0, servers), self: 11,
			want: map[node.ID]float64{8: 1, 10: 1, 9: MinWeight},
		},
		{
			name: "tiny share floored", d: Decision{Aggregators: []node.ID{8, 10}, Shares: []float64{0.999, 0.001}}, self: 9,
			want: map[node.ID]float64{8: 1, 10: MinWeight, 11: MinWeight},
		},
	}
	for _, c := range cases {
		got := Weights(c.d, c.self, servers, workers)
		if len(got) != len(c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
			continue
		}
		for id, w := range c.want {
			if g, ok := got[id]; !ok || math.Abs(g-w) > 1e-12 {
				t.Errorf("%s: %v, want %v", c.name, got, c.want)
				break
			}
		}
	}
}
