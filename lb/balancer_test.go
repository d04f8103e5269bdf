package lb

import (
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/node"
)

// ids returns the node ids of n servers and m workers.
func ids(n, m int) (servers, workers []node.ID) {
	for r := range n {
		servers = append(servers, node.ServerID(r))
	}
	for r := range m {
		workers = append(workers, node.WorkerID(r))
	}
	return servers, workers
}

// sim drives a Balancer through whole iterations: every node reports
// iteration it (servers first), iterTime apart, and every directive is
// checked against the invariants every node relies on.
type sim struct {
	t        *testing.T
	b        *Balancer
	servers  []node.ID
	workers  []node.ID
	rate     func(id node.ID, it uint64) (up, down float64)
	iterTime func(it uint64) time.Duration
	skip     func(id node.ID, it uint64) bool // samples not sent
	model    uint64
	now      time.Time
	it       uint64    // the next iteration to report
	joined   time.Time // when a server joined (TestBalancerJoin)
	retried  uint32    // the latest retry's version: the workers' Sample.Version

	checker
	steps []step // one per directive, in order
}

type step struct {
	it uint64 // the iteration whose completion produced the directive
	d  Directive
}

// checker checks the directives' invariants.
type checker struct {
	granted uint64 // the highest horizon granted so far
	version uint32
	sched   *Schedule // starting with the initial decision
	split   Decision  // the latest decision that was not a probe
}

func (c *checker) check(t *testing.T, d Directive) {
	t.Helper()
	if d.Horizon < c.granted {
		t.Fatalf("horizon went back from %d: %v", c.granted, d)
	}
	if d.Probe && d.Decision == nil {
		t.Fatalf("probe without a decision: %v", d)
	}
	if dec := d.Decision; dec != nil {
		if dec.Iteration <= c.granted {
			t.Fatalf("decision takes effect at %d, within the horizon %d already granted: %v", dec.Iteration, c.granted, d)
		}
		if dec.Version <= c.version {
			t.Fatalf("version %d after %d: %v", dec.Version, c.version, d)
		}
		if err := dec.Validate(); err != nil {
			t.Fatalf("%v: %v", d, err)
		}
		if err := c.sched.Add(*dec); err != nil {
			t.Fatalf("%v: %v", d, err)
		}
		c.version = dec.Version
		if !d.Probe {
			c.split = *dec
		}
	}
	b, err := d.MarshalBinary()
	if err != nil {
		t.Fatalf("%v does not encode: %v", d, err)
	}
	if back, err := UnmarshalDirective(b); err != nil || !reflect.DeepEqual(back, d) {
		t.Fatalf("%v came back as %v, %v", d, back, err)
	}
	c.granted = max(c.granted, d.Horizon)
}

// simAheadFor is the timed lookahead of a sim whose Config leaves it
// unset: the iterations its tests expect decisions to land at are worked
// out with it. TestBalancerAheadFor checks the default's.
const simAheadFor = 20 * time.Millisecond

func newSim(t *testing.T, cfg Config) *sim {
	t.Helper()
	if cfg.AheadFor == 0 {
		cfg.AheadFor = simAheadFor
	}
	b, err := NewBalancer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := &sim{
		t: t, b: b, servers: cfg.Servers, workers: cfg.Workers,
		rate:     func(node.ID, uint64) (float64, float64) { return 1e9, 1e9 },
		iterTime: func(uint64) time.Duration { return 100 * time.Millisecond },
		skip:     func(node.ID, uint64) bool { return false },
		model:    100 << 20,
		now:      time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC),
	}
	s.split = Even(0, 0, cfg.Servers)
	s.sched, err = NewSchedule(s.split)
	if err != nil {
		t.Fatal(err)
	}
	d := b.Start()
	if d.Horizon != b.cfg.Lookahead || !d.Shaping || d.Decision != nil || d.Probe {
		t.Fatalf("Start() = %+v", d)
	}
	s.check(t, d)
	return s
}

// newTimedSim is a sim of 2 servers and 2 workers, its Config changed by
// cfg (nil: none), iteration it taking iterTime(it).
func newTimedSim(t *testing.T, cfg func(*Config), iterTime func(uint64) time.Duration) *sim {
	t.Helper()
	servers, workers := ids(2, 2)
	c := Config{Servers: servers, Workers: workers}
	if cfg != nil {
		cfg(&c)
	}
	s := newSim(t, c)
	s.iterTime = iterTime
	return s
}

// run reports iterations until it has reported through last.
func (s *sim) run(last uint64) {
	s.t.Helper()
	for ; s.it <= last; s.it++ {
		if s.it > s.granted {
			s.t.Fatalf("iteration %d beyond the horizon %d", s.it, s.granted)
		}
		s.now = s.now.Add(s.iterTime(s.it))
		for _, id := range slices.Concat(s.servers, s.workers) {
			if s.skip(id, s.it) {
				continue
			}
			up, down := s.rate(id, s.it)
			smp := Sample{Node: id, Iteration: s.it, UpRate: up, DownRate: down, SentBytes: 1, ReceivedBytes: 1}
			if slices.Contains(s.workers, id) {
				smp.ModelBytes, smp.Version = s.model, s.retried
			}
			for _, d := range s.b.Observe(smp, s.now) {
				s.check(s.t, d)
				s.steps = append(s.steps, step{s.it, d})
			}
		}
	}
}

// decisions returns the steps that carried a decision.
func (s *sim) decisions() []step {
	var out []step
	for _, st := range s.steps {
		if st.d.Decision != nil {
			out = append(out, st)
		}
	}
	return out
}

func TestBalancerTimeline(t *testing.T) {
	servers, workers := ids(2, 2)
	s := newSim(t, Config{Servers: servers, Workers: workers})
	s.run(12)
	// Lookahead 2: after iteration i is done, workers may push to i+3.
	for j, st := range s.steps {
		if st.d.Horizon != uint64(j)+3 {
			t.Fatalf("step %d: horizon %d", j, st.d.Horizon)
		}
	}
	ds := s.decisions()
	if len(ds) != 2 {
		t.Fatalf("%d decisions: %v", len(ds), ds)
	}
	// Warm-up: iterations 0..2 done on the initial split; the probe takes
	// effect after the horizon 4 granted before, and measures 5 and 6.
	probe := ds[0]
	if probe.it != 2 || !probe.d.Probe || probe.d.Shaping || probe.d.Decision.Version != 1 || probe.d.Decision.Iteration != 5 ||
		!slices.Equal(probe.d.Decision.Aggregators, slices.Concat(servers, workers)) {
		t.Fatalf("probe: %+v at %d: %v", probe.d, probe.it, probe.d)
	}
	for _, st := range s.steps[3:6] {
		if st.d.Shaping || st.d.Decision != nil {
			t.Fatalf("during the probe, after iteration %d: %v", st.it, st.d)
		}
	}
	// Equal nodes: the even split over the servers, from iteration 9.
	bal := ds[1]
	if bal.it != 6 || bal.d.Probe || !bal.d.Shaping || !reflect.DeepEqual(*bal.d.Decision, Even(2, 9, servers)) {
		t.Fatalf("balanced: %v at %d", bal.d, bal.it)
	}
	if !strings.HasPrefix(bal.d.Reason, "balanced: even split over the servers kept") || !strings.Contains(bal.d.Reason, "server1(10) 8000.0 Mbit/s") {
		t.Fatalf("reason: %s", bal.d.Reason)
	}
	if s.b.State() != Balanced || !reflect.DeepEqual(s.b.Current(), Even(2, 9, servers)) {
		t.Fatalf("state %v, current %v", s.b.State(), s.b.Current())
	}
	for _, st := range s.steps[6:] {
		if !st.d.Shaping {
			t.Fatalf("shaping off after the probe: %v", st.d)
		}
	}
}

func TestBalancerProbe(t *testing.T) {
	const gb = 1e9
	cases := []struct {
		name             string
		servers, workers int
		rate             func(id node.ID, it uint64) (up, down float64)
		skip             func(id node.ID, it uint64) bool
		late             bool // the probe waits an iteration for a server's report
		state            State
		check            func(t *testing.T, d Decision)
	}{
		{
			name: "all equal: even over the servers", servers: 4, workers: 4,
			state: Balanced,
			check: func(t *testing.T, d Decision) {
				if s, _ := ids(4, 4); !slices.Equal(d.Aggregators, s) || !slices.Equal(d.Shares, Even(0, 0, s).Shares) {
					t.Errorf("decision %v", d)
				}
			},
		},
		{
			name: "one dead-slow server gets next to nothing", servers: 2, workers: 4,
			rate: func(id node.ID, _ uint64) (float64, float64) {
				if id == 10 {
					return 1, 2
				}
				return gb, gb
			},
			state: Balanced,
			check: func(t *testing.T, d Decision) {
				for i, a := range d.Aggregators {
					if a == 10 && d.Shares[i] > 1e-6 {
						t.Errorf("server 10 gets %g: %v", d.Shares[i], d)
					}
				}
			},
		},
		{
			name: "slow server, two workers: the workers take it all", servers: 2, workers: 2,
			rate: func(id node.ID, _ uint64) (float64, float64) {
				if id == 10 {
					return gb, gb / 4 // the slower side counts
				}
				return gb, gb
			},
			state: Balanced,
			check: func(t *testing.T, d Decision) {
				if _, w := ids(2, 2); !slices.Equal(d.Aggregators, w) {
					t.Errorf("decision %v", d)
				}
			},
		},
		{
			name: "all-zero samples: fall back", servers: 2, workers: 2,
			rate:  func(node.ID, uint64) (float64, float64) { return 0, 0 },
			state: Default,
		},
		{
			name: "one side never measured: fall back", servers: 2, workers: 2,
			rate: func(id node.ID, _ uint64) (float64, float64) {
				if id == 9 {
					return gb, 0
				}
				return gb, gb
			},
			state: Default,
		},
		{
			name: "no server samples: fall back", servers: 2, workers: 2,
			skip:  func(id node.ID, _ uint64) bool { return id%2 == 0 },
			late:  true,
			state: Default,
		},
		{
			// Its warm-up samples stand for it: they were measured on the
			// even split, where a server carries the most.
			name: "one server silent in the probe window: the warm-up's rates count", servers: 2, workers: 3,
			skip:  func(id node.ID, it uint64) bool { return id == 10 && it >= 4 },
			late:  true,
			state: Balanced,
		},
		{
			name: "one server silent from the start: fall back", servers: 2, workers: 3,
			skip:  func(id node.ID, _ uint64) bool { return id == 10 },
			late:  true,
			state: Default,
		},
		{
			name: "NaN, Inf, negative and huge rates are not measurements", servers: 2, workers: 2,
			rate: func(id node.ID, it uint64) (float64, float64) {
				switch id {
				case 8:
					return math.NaN(), gb
				case 10:
					return gb, math.Inf(1)
				case 9:
					return -gb, gb
				}
				return gb, 2 * MaxCapacity
			},
			state: Default,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			servers, workers := ids(c.servers, c.workers)
			s := newSim(t, Config{Servers: servers, Workers: workers})
			if c.rate != nil {
				s.rate = c.rate
			}
			if c.skip != nil {
				s.skip = c.skip
			}
			s.run(8)
			ds := s.decisions()
			if len(ds) != 2 || !ds[0].d.Probe {
				t.Fatalf("decisions: %v", ds)
			}
			if s.b.State() != c.state {
				t.Fatalf("state %v, want %v; %v", s.b.State(), c.state, ds[1].d)
			}
			got := *ds[1].d.Decision
			if c.check != nil {
				c.check(t, got)
			}
			if c.state != Default {
				return
			}
			// The fallback is the last good split, again, and the probe
			// is retried RetryAfter (10) iterations later.
			end, want := uint64(6), Even(2, 9, servers)
			if c.late {
				end, want = 7, Even(2, 10, servers)
			}
			if ds[1].it != end || !reflect.DeepEqual(got, want) || !strings.HasPrefix(ds[1].d.Reason, "probe failed: ") || !ds[1].d.Shaping {
				t.Fatalf("fallback %v, want %v", ds[1].d, want)
			}
			s.run(end + 12)
			ds = s.decisions()
			if len(ds) != 3 || ds[2].it != end+10 || !ds[2].d.Probe || !strings.Contains(ds[2].d.Reason, "retrying") {
				t.Fatalf("after the fallback at %d: %v", end, ds[2:])
			}
		})
	}
}

// Samples that cannot be measurements, or that come from nobody, change
// nothing.
func TestBalancerIgnoresHostileSamples(t *testing.T) {
	servers, workers := ids(2, 3)
	rate := func(id node.ID, it uint64) (float64, float64) {
		if id == 10 {
			return 3e8, 2e8
		}
		return 1e9 + float64(it), 1e9
	}
	clean := newSim(t, Config{Servers: servers, Workers: workers})
	clean.rate = rate
	clean.run(40)
	if ds := clean.decisions(); len(ds) != 2 || !strings.HasPrefix(ds[1].d.Reason, "balanced: predicted") {
		t.Fatalf("clean run: %v", ds)
	}

	b, err := NewBalancer(Config{Servers: servers, Workers: workers})
	if err != nil {
		t.Fatal(err)
	}
	hostile := func(id node.ID, it uint64) []Sample {
		out := []Sample{
			{Node: 3, Iteration: it, UpRate: 1, DownRate: 1},
			{Node: 999, Iteration: it, UpRate: 1e9, DownRate: 1e9, ModelBytes: 1 << 50},
			{Node: id, Iteration: it + 100, UpRate: 1e11, DownRate: 1e11},
			{Node: id, Iteration: 1<<64 - 1, UpRate: 1e11, DownRate: 1e11},
		}
		if it == 0 {
			return out
		}
		prev := it - 1 // a report the node has already made
		return append(out, []Sample{
			{Node: id, Iteration: prev, UpRate: math.NaN(), DownRate: 1e11},
			{Node: id, Iteration: prev, UpRate: 1e11, DownRate: math.NaN()},
			{Node: id, Iteration: prev, UpRate: math.Inf(1), DownRate: 1e11},
			{Node: id, Iteration: prev, UpRate: 1e11, DownRate: -1},
			{Node: id, Iteration: prev, UpRate: 2 * MaxCapacity, DownRate: 2 * MaxCapacity},
		}...)
	}
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	var got []Directive
	for it := range uint64(41) {
		now = now.Add(100 * time.Millisecond)
		for _, id := range slices.Concat(servers, workers) {
			for _, h := range hostile(id, it) {
				if ds := b.Observe(h, now); len(ds) != 0 {
					t.Fatalf("hostile %+v produced %v", h, ds)
				}
			}
			up, down := rate(id, it)
			smp := Sample{Node: id, Iteration: it, UpRate: up, DownRate: down}
			if slices.Contains(workers, id) {
				smp.ModelBytes = clean.model
			}
			got = append(got, b.Observe(smp, now)...)
		}
	}
	var want []Directive
	for _, st := range clean.steps {
		want = append(want, st.d)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("hostile samples changed the directives:\n got %v\nwant %v", got, want)
	}
}

// One report can complete several iterations; each gets its directive, in
// order, and they share the time since the last step.
func TestBalancerSeveralSteps(t *testing.T) {
	servers, workers := ids(1, 2)
	b, err := NewBalancer(Config{Servers: servers, Workers: workers, Lookahead: 3})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(0, 0)
	for it := range uint64(4) {
		if ds := b.Observe(Sample{Node: 9, Iteration: it}, t0); len(ds) != 0 {
			t.Fatalf("one worker of two completed %d: %v", it, ds)
		}
	}
	ds := b.Observe(Sample{Node: 11, Iteration: 3}, t0.Add(time.Second))
	if len(ds) != 4 {
		t.Fatalf("%d directives: %v", len(ds), ds)
	}
	for i, d := range ds {
		if d.Horizon != uint64(i)+4 {
			t.Fatalf("directive %d: %v", i, d)
		}
	}
	if ds[2].Decision == nil || !ds[2].Probe || ds[2].Decision.Iteration != 6 {
		t.Fatalf("probe after iteration 2 (Warmup): %v", ds)
	}
	if ds[3].Shaping || ds[3].Decision != nil {
		t.Fatalf("after the probe: %v", ds[3])
	}
	// Old, repeated and unknown reports complete nothing more.
	for _, s := range []Sample{{Node: 11, Iteration: 3}, {Node: 11, Iteration: 1}, {Node: 9, Iteration: 2}, {Node: 42, Iteration: 4}} {
		if ds := b.Observe(s, t0.Add(2*time.Second)); len(ds) != 0 {
			t.Fatalf("%+v: %v", s, ds)
		}
	}
}

func TestBalancerDrift(t *testing.T) {
	cases := []struct {
		name   string
		times  map[uint64]time.Duration // iteration → time, else 100 ms
		probes []uint64                 // steps that start a probe
		reason string
	}{
		{"steady", nil, []uint64{2}, ""},
		{
			// balanced from 9, timed from 10; baseline 10..12; 13..15 slow
			name:   "doubled",
			times:  map[uint64]time.Duration{13: 200 * time.Millisecond, 14: 200 * time.Millisecond, 15: 200 * time.Millisecond, 16: 200 * time.Millisecond},
			probes: []uint64{2, 15},
			reason: "probe: iteration time rose from 100.0 ms to 200.0 ms",
		},
		{
			name:   "not enough",
			times:  map[uint64]time.Duration{13: 140 * time.Millisecond, 14: 140 * time.Millisecond, 15: 140 * time.Millisecond, 16: 140 * time.Millisecond},
			probes: []uint64{2},
		},
		{
			name:   "interrupted",
			times:  map[uint64]time.Duration{13: time.Second, 14: time.Second, 16: time.Second, 17: time.Second},
			probes: []uint64{2},
		},
		{
			name:   "the baseline is a median",
			times:  map[uint64]time.Duration{10: time.Second, 16: 160 * time.Millisecond, 17: 160 * time.Millisecond, 18: 160 * time.Millisecond},
			probes: []uint64{2, 18},
			reason: "probe: iteration time rose from 100.0 ms to 160.0 ms",
		},
		{
			name:   "the probe is not timed",
			times:  map[uint64]time.Duration{4: time.Second, 5: time.Second, 6: time.Second, 7: time.Second, 8: time.Second, 9: time.Second},
			probes: []uint64{2},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			servers, workers := ids(2, 2)
			s := newSim(t, Config{Servers: servers, Workers: workers})
			s.iterTime = func(it uint64) time.Duration {
				if d, ok := c.times[it]; ok {
					return d
				}
				return 100 * time.Millisecond
			}
			s.run(19)
			var probes []uint64
			for _, st := range s.decisions() {
				if st.d.Probe {
					probes = append(probes, st.it)
					if st.it != 2 && !strings.HasPrefix(st.d.Reason, c.reason) {
						t.Errorf("reason %q", st.d.Reason)
					}
				}
			}
			if !slices.Equal(probes, c.probes) {
				t.Fatalf("probes after iterations %v, want %v", probes, c.probes)
			}
		})
	}
}

func TestBalancerProbeEvery(t *testing.T) {
	cases := []struct {
		every            uint64
		probes, balanced int
	}{
		// A cycle: probe at step p, its decision lands at p+3, the
		// window ends at p+4, Balanced for `every` steps.
		{0, 1, 1},
		{10, 15, 14}, // probes at 2, 16, ..., 198
		{1, 40, 39},  // probes at 2, 7, ..., 197; the last one still on
		{50, 4, 4},   // 2, 56, 110, 164
	}
	for _, c := range cases {
		servers, workers := ids(2, 2)
		s := newSim(t, Config{Servers: servers, Workers: workers, ProbeEvery: c.every})
		s.run(199)
		probes, balanced := 0, 0
		for _, st := range s.decisions() {
			if st.d.Probe {
				probes++
			} else {
				balanced++
			}
		}
		if probes != c.probes || balanced != c.balanced {
			t.Errorf("every %d: %d probes and %d other decisions, want %d and %d", c.every, probes, balanced, c.probes, c.balanced)
		}
	}
}

// Rates measured after the probe that make a better split possible
// refine the decision, at most once per Lookahead+2 iterations.
func TestBalancerRefine(t *testing.T) {
	servers, workers := ids(2, 4)
	s := newSim(t, Config{Servers: servers, Workers: workers})
	s.rate = func(id node.ID, it uint64) (float64, float64) {
		if id == 10 && it < 9 {
			return 2.5e8, 2.5e8 // a quarter, while probing
		}
		return 1e9, 1e9
	}
	s.run(30)
	ds := s.decisions()
	if len(ds) != 3 {
		t.Fatalf("decisions %v", ds)
	}
	// Balanced after 6, from 9; the faster samples count from 9, and the
	// balanced decision is left alone for 4 steps.
	ref := ds[2]
	if ref.it != 10 || ref.d.Decision.Iteration != 13 || !strings.HasPrefix(ref.d.Reason, "refined: predicted 125.8 ms vs ") {
		t.Fatalf("refinement %v after %d", ref.d, ref.it)
	}
	want := []float64{0.3, 0.3, 0.1, 0.1, 0.1, 0.1}
	for i, sh := range ref.d.Decision.Shares {
		if math.Abs(sh-want[i]) > 1e-9 {
			t.Fatalf("refined shares %v, want %v", ref.d.Decision.Shares, want)
		}
	}

	// Rates creeping up each iteration: refinements keep coming, spaced.
	s = newSim(t, Config{Servers: servers, Workers: workers, Tolerance: 0.01})
	s.rate = func(id node.ID, it uint64) (float64, float64) {
		if id == 10 {
			return 1e8 * float64(1+it), 1e10
		}
		return 1e10, 1e10
	}
	s.run(40)
	ds = s.decisions()
	if len(ds) < 4 {
		t.Fatalf("decisions %v", ds)
	}
	for j := 2; j < len(ds); j++ {
		if gap := ds[j].it - ds[j-1].it; gap < 4 {
			t.Fatalf("refinements after %d and %d", ds[j-1].it, ds[j].it)
		}
	}
}

func TestNewBalancer(t *testing.T) {
	servers, workers := ids(2, 2)
	ok := func() Config { return Config{Servers: slices.Clone(servers), Workers: slices.Clone(workers)} }
	with := func(f func(*Config)) Config { c := ok(); f(&c); return c }
	bad := map[string]Config{
		"no servers":          with(func(c *Config) { c.Servers = nil }),
		"no workers":          with(func(c *Config) { c.Workers = nil }),
		"duplicate server":    with(func(c *Config) { c.Servers = []node.ID{8, 8} }),
		"server and worker":   with(func(c *Config) { c.Workers = []node.ID{9, 8} }),
		"NaN tolerance":       with(func(c *Config) { c.Tolerance = math.NaN() }),
		"negative tolerance":  with(func(c *Config) { c.Tolerance = -0.1 }),
		"Inf tolerance":       with(func(c *Config) { c.Tolerance = math.Inf(1) }),
		"drift factor 1":      with(func(c *Config) { c.DriftFactor = 1 }),
		"drift factor 0.5":    with(func(c *Config) { c.DriftFactor = 0.5 }),
		"NaN drift factor":    with(func(c *Config) { c.DriftFactor = math.NaN() }),
		"negative drift runs": with(func(c *Config) { c.DriftIterations = -1 }),
		"huge lookahead":      with(func(c *Config) { c.Lookahead = 1 << 40 }),
		"huge probe":          with(func(c *Config) { c.ProbeIterations = 1 << 40 }),
		"too many nodes":      with(func(c *Config) { c.Workers = make([]node.ID, MaxAggregators) }),
	}
	for name, cfg := range bad {
		if _, err := NewBalancer(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	cfg := ok()
	b, err := NewBalancer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := Config{Servers: servers, Workers: workers, Lookahead: 2, Warmup: 2, ProbeIterations: 2, Tolerance: DefaultTolerance, DriftFactor: 1.5, DriftIterations: 3, RetryAfter: 10, JoinSettle: 500 * time.Millisecond, AheadFor: 100 * time.Millisecond, MinIteration: 20 * time.Millisecond}
	if !reflect.DeepEqual(b.cfg, want) {
		t.Fatalf("defaults %+v", b.cfg)
	}
	cfg.Servers[0] = 99
	if b.cfg.Servers[0] != 8 {
		t.Fatal("the balancer keeps the caller's slice")
	}
	if b.State() != Default || !reflect.DeepEqual(b.Current(), Even(0, 0, servers)) {
		t.Fatalf("state %v, current %v", b.State(), b.Current())
	}
	cur := b.Current()
	cur.Shares[0] = 42
	if b.Current().Shares[0] != 0.5 {
		t.Fatal("Current shares the balancer's slices")
	}
}

// Long reasons (many nodes) are clipped so that every directive encodes;
// sim.check encodes each.
func TestBalancerManyNodes(t *testing.T) {
	servers, workers := ids(200, 200)
	s := newSim(t, Config{Servers: servers, Workers: workers})
	s.rate = func(id node.ID, _ uint64) (float64, float64) { return 1e9 + float64(id), 1e9 }
	s.run(10)
	ds := s.decisions()
	if len(ds) != 2 || len(ds[1].d.Reason) > MaxReason || !strings.HasSuffix(ds[1].d.Reason, "…") {
		t.Fatalf("%d decisions; reason of %d bytes", len(ds), len(ds[1].d.Reason))
	}
}

func TestClip(t *testing.T) {
	for _, s := range []string{"", "short", strings.Repeat("é", MaxReason), strings.Repeat("a", MaxReason), strings.Repeat("a", MaxReason+1), strings.Repeat("€", 3000)} {
		got := clip(s)
		if len(got) > MaxReason || !strings.HasPrefix(s, strings.TrimSuffix(got, "…")) || !utf8Valid(got) {
			t.Errorf("clip of %d bytes: %d bytes, %q...", len(s), len(got), got[:min(len(got), 10)])
		}
		if len(s) <= MaxReason && got != s {
			t.Errorf("clip changed a short string")
		}
	}
}

func utf8Valid(s string) bool { return strings.ToValidUTF8(s, "\uFFFD") == s }

func TestStateString(t *testing.T) {
	for s, want := range map[State]string{Default: "default", Probe: "probe", Balanced: "balanced", State(7): "state(7)"} {
		if s.String() != want {
			t.Errorf("%d: %q", int(s), s.String())
		}
	}
}

// The invariant every node relies on to switch at the same boundary, over
// random clusters, settings, rates, delivery orders and clocks: no
// decision takes effect at or before a horizon already granted, versions
// strictly increase, every decision validates and goes into a Schedule in
// order, and training never stalls.
func TestBalancerInvariants(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for round := range 1000 {
		servers, workers := ids(1+rng.IntN(3), 1+rng.IntN(4))
		cfg := Config{
			Servers: servers, Workers: workers,
			Lookahead:       uint64(rng.IntN(4)),
			Warmup:          uint64(rng.IntN(5)),
			ProbeIterations: uint64(rng.IntN(4)),
			ProbeEvery:      uint64(rng.IntN(25)),
			RetryAfter:      uint64(rng.IntN(8)),
			DriftIterations: rng.IntN(4),
		}
		b, err := NewBalancer(cfg)
		if err != nil {
			t.Fatal(err)
		}
		sched, err := NewSchedule(Even(0, 0, servers))
		if err != nil {
			t.Fatal(err)
		}
		c := checker{sched: sched}
		c.check(t, b.Start())

		all := slices.Concat(servers, workers)
		capacity := map[node.ID]float64{}
		for _, id := range all {
			capacity[id] = []float64{0, 1, 1e6, 1e9, 1e9, 1e9, 5e9}[rng.IntN(7)]
		}
		rate := func(id node.ID) float64 {
			switch rng.IntN(40) {
			case 0:
				return math.NaN()
			case 1:
				return -1
			case 2:
				return math.Inf(1)
			case 3:
				return 0
			case 4:
				return 2 * MaxCapacity
			}
			return capacity[id] * (0.5 + rng.Float64())
		}
		next := map[node.ID]uint64{} // each node's next iteration to report
		var bag []Sample             // sent, not yet delivered
		now := time.Unix(1000, 0)
		const iterations = 60
		for ticks := 0; ; ticks++ {
			if ticks > 100000 {
				t.Fatalf("round %d: stalled at horizon %d, next %v", round, c.granted, next)
			}
			// Some nodes send their next report, if the horizon allows.
			id := all[rng.IntN(len(all))]
			if it := next[id]; it <= c.granted && it <= iterations {
				next[id]++
				bag = append(bag, Sample{Node: id, Iteration: it, UpRate: rate(id), DownRate: rate(id), ModelBytes: 1 << 20})
			}
			// The network delivers a random one, sometimes twice.
			if len(bag) > 0 && rng.IntN(2) == 0 {
				k := rng.IntN(len(bag))
				smp := bag[k]
				if rng.IntN(20) != 0 {
					bag = slices.Delete(bag, k, k+1)
				}
				switch rng.IntN(10) {
				case 0: // the clock stands still, or steps back
					now = now.Add(-time.Duration(rng.IntN(2)) * time.Millisecond)
				default:
					now = now.Add(time.Duration(rng.IntN(50)) * time.Millisecond)
				}
				if rng.IntN(50) == 0 { // a lie, besides the report
					lie := smp
					lie.Iteration += uint64(1 + rng.IntN(1000))
					for _, d := range b.Observe(lie, now) {
						c.check(t, d)
					}
				}
				for _, d := range b.Observe(smp, now) {
					c.check(t, d)
				}
				if d := b.Current(); d.Version != c.version {
					t.Fatalf("round %d: Current is v%d, last issued v%d", round, d.Version, c.version)
				}
			}
			done := true
			for _, w := range workers {
				done = done && next[w] > iterations
			}
			if done && len(bag) == 0 {
				break
			}
		}
		if c.granted < iterations {
			t.Fatalf("round %d: horizon %d after %d iterations", round, c.granted, iterations)
		}
	}
}

// Measured and Bound show what the next decision will be made from:
// copies of the rates, and the bound once every node is measured.
func TestBalancerMeasured(t *testing.T) {
	servers, workers := ids(1, 2)
	b, err := NewBalancer(Config{Servers: servers, Workers: workers})
	if err != nil {
		t.Fatal(err)
	}
	b.Start()
	now := time.Unix(0, 0)
	b.Observe(Sample{Node: servers[0], Iteration: 1, UpRate: 1e6, DownRate: 2e6}, now)
	if _, err := b.Bound(); err == nil {
		t.Error("a bound while the workers are unmeasured")
	}
	up, down := b.Measured()
	if up[servers[0]] != 1e6 || down[servers[0]] != 2e6 || len(up) != 1 {
		t.Errorf("measured up %v, down %v; want server 1e6 up, 2e6 down only", up, down)
	}
	up[servers[0]] = 0 // a copy: the balancer's stays
	for _, w := range workers {
		b.Observe(Sample{Node: w, Iteration: 1, UpRate: 1e6, DownRate: 1e6, ModelBytes: 1e6}, now)
	}
	if up, _ := b.Measured(); up[servers[0]] != 1e6 {
		t.Errorf("changing Measured's map changed the balancer's: %v", up)
	}
	bound, err := b.Bound()
	if err != nil || bound <= 0 {
		t.Errorf("bound %v, %v; want a positive time", bound, err)
	}
}

// Short iterations are granted further ahead, so that the grant's round
// trip through the scheduler is not waited for every step: the horizon
// covers AheadFor at the latest iterations' pace, within Lookahead and
// maxTimedLookahead.
func TestBalancerAheadFor(t *testing.T) {
	tests := []struct {
		name     string
		aheadFor time.Duration
		step     time.Duration // between the iterations' completions
		want     uint64        // lookahead of the last grant
	}{
		{"long iterations keep Lookahead", 0, 200 * time.Millisecond, 2},
		{"100 ms iterations keep Lookahead", 0, 100 * time.Millisecond, 2},
		{"20 ms iterations: 5 ahead", 0, 20 * time.Millisecond, 5},
		{"3 ms iterations: 34 ahead (rounded up)", 0, 3 * time.Millisecond, 34},
		{"1 ms iterations: 100 ahead", 0, time.Millisecond, 100},
		{"10 µs iterations: capped", 0, 10 * time.Microsecond, maxTimedLookahead},
		{"AheadFor off", -1, time.Millisecond, 2},
		{"AheadFor 20 ms, 20 ms iterations keep Lookahead", 20 * time.Millisecond, 20 * time.Millisecond, 2},
		{"AheadFor 20 ms, 3 ms iterations: 7 ahead", 20 * time.Millisecond, 3 * time.Millisecond, 7},
		{"AheadFor 20 ms, 1 ms iterations: 20 ahead", 20 * time.Millisecond, time.Millisecond, 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			servers, workers := ids(2, 2)
			b, err := NewBalancer(Config{Servers: servers, Workers: workers, Fixed: true, AheadFor: tt.aheadFor})
			if err != nil {
				t.Fatal(err)
			}
			b.Start()
			now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
			var last Directive
			for it := range uint64(5) {
				now = now.Add(tt.step)
				for _, id := range append(slices.Clone(servers), workers...) {
					for _, d := range b.Observe(Sample{Node: id, Iteration: it}, now) {
						last = d
					}
				}
			}
			if got := last.Horizon - 5; got != tt.want {
				t.Errorf("horizon %d after 5 iterations done: %d ahead, want %d", last.Horizon, got, tt.want)
			}
		})
	}
}

// Short iterations start no probe: their time is per-message latency, not
// bandwidth, and a probe's split would land only past the whole lookahead
// granted (tens of iterations of a millisecond). The job keeps the even
// split over the servers until its iterations are long enough, and a
// balanced job whose iterations are short probes neither periodically nor
// on drift. A server that joins while iterations are short gets its share
// at once: the even split over every server.
func TestBalancerShortIterations(t *testing.T) {
	const joiner = node.ID(12) // server 2
	long, short := 50*time.Millisecond, time.Millisecond
	tests := []struct {
		name     string
		cfg      func(*Config)
		iterTime func(it uint64) time.Duration
		joinAt   uint64 // 0: no join
		probes   int
		firstAt  uint64 // the step of the first probe
		even     bool   // a decision of the even split over every server, not a probe
		state    State
	}{
		{"1 ms iterations: no probe", nil, func(uint64) time.Duration { return short }, 0, 0, 0, false, Default},
		{"19 ms iterations: no probe", nil, func(uint64) time.Duration { return 19 * time.Millisecond }, 0, 0, 0, false, Default},
		{"50 ms iterations: the probe after the warm-up", nil, func(uint64) time.Duration { return long }, 0, 1, 2, false, Balanced},
		{"short, then long from iteration 100: the probe waits for them", nil,
			func(it uint64) time.Duration { return map[bool]time.Duration{true: short, false: long}[it < 100] }, 0, 1, 104, false, Balanced},
		{"a slow start, then short: no probe", nil,
			func(it uint64) time.Duration { return map[bool]time.Duration{true: long, false: short}[it < 2] }, 0, 0, 0, false, Default},
		{"one slow iteration among short ones: no probe", nil,
			func(it uint64) time.Duration { return map[bool]time.Duration{true: long, false: short}[it == 50] }, 0, 0, 0, false, Default},
		{"MinIteration off: 1 ms iterations probe", func(c *Config) { c.MinIteration = -1 }, func(uint64) time.Duration { return short }, 0, 1, 2, false, Balanced},
		{"lookahead fixed (AheadFor off): 1 ms iterations probe", func(c *Config) { c.AheadFor = -1 }, func(uint64) time.Duration { return short }, 0, 1, 2, false, Balanced},
		{"balanced, then short: no periodic probe", func(c *Config) { c.ProbeEvery = 10 },
			func(it uint64) time.Duration { return map[bool]time.Duration{true: long, false: short}[it < 10] }, 0, 1, 2, false, Balanced},
		{"a server joins while iterations are short: even split over every server", nil,
			func(uint64) time.Duration { return short }, 20, 0, 0, true, Default},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newTimedSim(t, tt.cfg, tt.iterTime)
			if tt.joinAt > 0 {
				s.run(tt.joinAt - 1)
				if _, _, err := s.b.Join(joiner, s.now); err != nil {
					t.Fatal(err)
				}
				s.servers = append(s.servers, joiner)
			}
			s.run(1199) // past JoinSettle at 1 ms
			probes, first, even := 0, uint64(0), false
			for _, st := range s.decisions() {
				switch {
				case st.d.Probe:
					if probes == 0 {
						first = st.it
					}
					probes++
				case reflect.DeepEqual(st.d.Decision.Aggregators, s.servers) && slices.Equal(st.d.Decision.Shares, Even(0, 0, s.servers).Shares):
					even = even || len(s.servers) == 3
				}
			}
			if probes != tt.probes || first != tt.firstAt {
				t.Errorf("%d probes, the first at step %d; want %d at %d: %v", probes, first, tt.probes, tt.firstAt, s.decisions())
			}
			if even != tt.even {
				t.Errorf("even split over the 3 servers issued: %v, want %v: %v", even, tt.even, s.decisions())
			}
			if s.b.State() != tt.state {
				t.Errorf("state %v, want %v", s.b.State(), tt.state)
			}
		})
	}
}

// A probe that starts on a job's first, slow iterations is abandoned once
// its iterations turn out short: its split (every node aggregating,
// shaping off) is in force for a few iterations after they turn short,
// not for the lookahead of short iterations past its window, and it is not
// tried again until iterations are long again. A slow job still probes
// and balances.
func TestBalancerAbandonsShortProbe(t *testing.T) {
	long, short := 50*time.Millisecond, time.Millisecond
	// slowUntil: iterations before n long, then short (until back, if
	// set, and long again from it).
	slowUntil := func(n, back uint64) func(uint64) time.Duration {
		return func(it uint64) time.Duration {
			if it < n || back > 0 && it >= back {
				return long
			}
			return short
		}
	}
	tests := []struct {
		name     string
		cfg      func(*Config)
		iterTime func(it uint64) time.Duration
		endBy    uint64 // the last iteration the first probe's split may be in force at
		probes   int
		abandons int
		state    State
	}{
		{"slow start, short from iteration 3: abandoned", nil, slowUntil(3, 0), 3 + 3, 1, 1, Default},
		{"slow start into the probe, short from 5: abandoned", nil, slowUntil(5, 0), 5 + 3, 1, 1, Default},
		{"a long window, short from 10: abandoned within it", func(c *Config) { c.ProbeIterations = 50 }, slowUntil(10, 0), 10 + 3, 1, 1, Default},
		{"slow start, short, long from 100: probes again then", nil, slowUntil(3, 100), 3 + 3, 2, 1, Balanced},
		{"50 ms iterations: probes and balances", nil, slowUntil(math.MaxUint64, 0), 8, 1, 0, Balanced},
		{"MinIteration off: not abandoned, its split ends after its window", func(c *Config) { c.MinIteration = -1 }, slowUntil(3, 0), 8, 1, 0, Balanced},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newTimedSim(t, tt.cfg, tt.iterTime)
			s.run(299)
			decs := s.decisions()
			probes, abandons, end := 0, 0, uint64(0)
			for j, st := range decs {
				if st.d.Probe {
					if probes == 0 {
						end = math.MaxUint64 // in force for good unless a decision follows
						if j+1 < len(decs) {
							end = decs[j+1].d.Decision.Iteration - 1
						}
					}
					probes++
				}
				if strings.Contains(st.d.Reason, "abandoned") {
					abandons++
				}
			}
			if probes == 0 || end > tt.endBy {
				t.Errorf("the first probe's split in force through iteration %d, want through %d at most: %v", end, tt.endBy, decs)
			}
			if probes != tt.probes || abandons != tt.abandons {
				t.Errorf("%d probes, %d abandoned; want %d, %d: %v", probes, abandons, tt.probes, tt.abandons, decs)
			}
			if s.b.State() != tt.state {
				t.Errorf("state %v, want %v", s.b.State(), tt.state)
			}
		})
	}
}

// Coalesce keeps the directives that carry a decision or turn shaping on
// or off, and the last: one report completing several iterations sends
// one grant, not one per iteration.
func TestCoalesce(t *testing.T) {
	dec := &Decision{Version: 1, Iteration: 9, Aggregators: []node.ID{8}, Shares: []float64{1}}
	grant := func(done uint64, shaping bool) Directive {
		return Directive{Horizon: done + 2, Done: done, Shaping: shaping}
	}
	withDec := func(d Directive) Directive { d.Decision = dec; return d }
	tests := []struct {
		name string
		in   []Directive
		want []uint64 // the Done of each kept
	}{
		{"none", nil, nil},
		{"one", []Directive{grant(1, true)}, []uint64{1}},
		{"grants only: the last", []Directive{grant(1, true), grant(2, true), grant(3, true)}, []uint64{3}},
		{"a decision in the middle", []Directive{grant(1, true), withDec(grant(2, true)), grant(3, true)}, []uint64{2, 3}},
		{"shaping turned off, then on", []Directive{grant(1, true), grant(2, false), grant(3, false), grant(4, true), grant(5, true)}, []uint64{2, 4, 5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []uint64
			for _, d := range Coalesce(tt.in) {
				got = append(got, d.Done)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("kept the directives of Done %v, want %v", got, tt.want)
			}
		})
	}
}

// The guard: a balanced split that measures slower than the even split
// over the servers goes back to it, and the next probe waits for a
// back-off that doubles each time; drift on the even split probes at
// once; a balanced split that is faster, or slower only within the
// margin, stays. The servers' links are slow and the workers' fast, so
// the LB moves the aggregation onto the workers; each case says how long
// an iteration takes on the even split, on that balanced split, and from
// iteration `from` on (a link slowing, say) each times `slower`.
func TestBalancerGuard(t *testing.T) {
	ms := func(n float64) time.Duration { return time.Duration(n * float64(time.Millisecond)) }
	tests := []struct {
		name          string
		even, bal     time.Duration
		from          uint64  // 0: no change
		slowerEven    float64 // the even split's time times this from `from`
		slowerBal     float64 // the balanced split's
		guards        []uint64
		backoffs      []uint64 // between each guard and the next probe
		driftProbe    string   // a probe's reason, after the first guard
		state         State
		firstGuardMsg string
	}{
		{
			name: "balanced twice as slow: back to even, back-off doubling",
			even: ms(25), bal: ms(50),
			guards:        []uint64{12, 72, 182, 392},
			backoffs:      []uint64{50, 100, 200},
			state:         Default,
			firstGuardMsg: "balanced split measured 50.0 ms, slower than the even split's 25.0 ms; back to the even split, next probe after iteration 62",
		},
		{name: "balanced faster (a slow server): stays", even: ms(100), bal: ms(40), state: Balanced},
		{name: "balanced slower within the margin: stays", even: ms(100), bal: ms(110), state: Balanced},
		{
			name: "the even split slows while backing off: probes at once, then balanced",
			even: ms(25), bal: ms(50), from: 30, slowerEven: 3, slowerBal: 1,
			guards:     []uint64{12},
			driftProbe: "probe: iteration time on the even split rose from 25.0 ms to 75.0 ms",
			state:      Balanced,
		},
		{
			// The even split's times from before the drift are out of
			// date: the split after the drift's probe is not compared
			// with them.
			name: "drift while balanced: the even split's old times are dropped",
			even: ms(100), bal: ms(40), from: 30, slowerEven: 3, slowerBal: 3,
			state: Balanced,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s *sim
			s = newTimedSim(t, nil, func(it uint64) time.Duration {
				d, slower := tt.bal, tt.slowerBal
				switch dec := s.sched.At(it); {
				case dec.SplitWithin(Even(0, 0, s.servers), ShareTolerance):
					d, slower = tt.even, tt.slowerEven
				case len(dec.Aggregators) == len(s.servers)+len(s.workers):
					d = (tt.even + tt.bal) / 2 // the probe's
					slower = max(tt.slowerEven, tt.slowerBal)
				}
				if tt.from > 0 && it >= tt.from {
					d = time.Duration(float64(d) * slower)
				}
				return d
			})
			s.rate = func(id node.ID, _ uint64) (float64, float64) {
				if slices.Contains(s.servers, id) {
					return 1e8, 1e8
				}
				return 1e9, 1e9
			}
			s.run(399)
			var guards, probes []uint64
			drift := false
			for _, st := range s.decisions() {
				switch {
				case st.d.Probe:
					probes = append(probes, st.it)
					drift = drift || tt.driftProbe != "" && strings.HasPrefix(st.d.Reason, tt.driftProbe)
				case strings.HasPrefix(st.d.Reason, "balanced split measured"):
					guards = append(guards, st.it)
					if !st.d.Decision.SplitWithin(Even(0, 0, s.servers), ShareTolerance) {
						t.Errorf("the guard's decision is not the even split: %v", st.d)
					}
					if len(guards) == 1 && tt.firstGuardMsg != "" && st.d.Reason != tt.firstGuardMsg {
						t.Errorf("reason %q, want %q", st.d.Reason, tt.firstGuardMsg)
					}
				}
			}
			if !slices.Equal(guards, tt.guards) {
				t.Fatalf("the guard after iterations %v, want %v: %v", guards, tt.guards, s.decisions())
			}
			if got := s.b.Guards(); got != uint64(len(guards)) {
				t.Errorf("Guards() = %d, %d guards issued", got, len(guards))
			}
			for j, g := range tt.backoffs {
				k := slices.IndexFunc(probes, func(p uint64) bool { return p > guards[j] })
				if k < 0 || probes[k]-guards[j] != g {
					t.Errorf("after the guard at %d, probes at %v: want one %d iterations later", guards[j], probes, g)
				}
			}
			if tt.driftProbe != "" && !drift {
				t.Errorf("no probe %q: %v", tt.driftProbe, s.decisions())
			}
			if s.b.State() != tt.state {
				t.Errorf("state %v, want %v: %v", s.b.State(), tt.state, s.decisions())
			}
		})
	}
}

// A join drops the even split's times: the split after the joiner's
// probe is not compared with an even split measured over other nodes.
func TestBalancerGuardForgetsOnJoin(t *testing.T) {
	const joiner, joinAt = node.ID(12), 30 // server 2
	var s *sim
	s = newTimedSim(t, nil, func(it uint64) time.Duration {
		switch dec := s.sched.At(it); {
		case dec.SplitWithin(Even(0, 0, s.servers), ShareTolerance):
			return 100 * time.Millisecond
		case it >= joinAt:
			return 120 * time.Millisecond // 20 % above the even split's time before the join
		}
		return 40 * time.Millisecond
	})
	s.rate = func(id node.ID, _ uint64) (float64, float64) {
		if s.b.isWorker[id] {
			return 1e9, 1e9
		}
		return 1e8, 1e8
	}
	s.run(joinAt - 1)
	if _, _, err := s.b.Join(joiner, s.now); err != nil {
		t.Fatal(err)
	}
	s.servers = append(s.servers, joiner)
	s.run(199)
	probes := 0
	for _, st := range s.decisions() {
		if st.d.Probe {
			probes++
		}
	}
	if probes != 2 || s.b.Guards() != 0 || s.b.State() != Balanced {
		t.Fatalf("%d probes, %d guards, state %v; want 2, 0, balanced: %v", probes, s.b.Guards(), s.b.State(), s.decisions())
	}
}
