package lb

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/fptps/fpt/node"
)

// State is the Balancer's state.
type State int

// The Balancer's states: the even split over the servers (at the start,
// and after a failed probe), probing (every server and worker aggregates
// an equal share, shaping off, capacities measured), and balanced (shares
// from the measured capacities).
const (
	Default State = iota
	Probe
	Balanced
)

func (s State) String() string {
	switch s {
	case Default:
		return "default"
	case Probe:
		return "probe"
	case Balanced:
		return "balanced"
	}
	return fmt.Sprintf("state(%d)", int(s))
}

// Config configures a Balancer. Zero fields take their defaults.
type Config struct {
	// Servers and Workers are the node ids; the initial decision, which
	// every node starts with on its own, is Even(0, 0, Servers).
	Servers, Workers []node.ID
	// Lookahead is how many iterations past the last one done workers may
	// push at least (default 2). A decision takes effect after every
	// iteration already granted, so it also sets how late decisions land.
	Lookahead uint64
	// AheadFor stretches the lookahead of short iterations: the horizon
	// covers at least AheadFor at the pace of the latest iterations (up to
	// maxTimedLookahead of them; default 100 ms). A grant is a round trip
	// through the scheduler: two iterations of a millisecond ahead, a
	// worker would wait for it every step, while decisions would land no
	// later than AheadFor. Short iterations are reported, and granted,
	// once per half of it (lbagent.Pace): each report and grant is a
	// control message beside the step's frames, which a longer AheadFor
	// makes rarer and decisions later. Negative: Lookahead only. While a
	// probe is on the lookahead is Lookahead (see MinIteration).
	AheadFor time.Duration
	// Warmup is how many iterations finish on the initial decision before
	// the first probe (default 2).
	Warmup uint64
	// ProbeIterations is the length of a probe's measurement window
	// (default 2).
	ProbeIterations uint64
	// ProbeEvery, if positive, probes again after this many iterations
	// in Balanced; 0 probes again only on drift.
	ProbeEvery uint64
	// Tolerance is passed to Balance, and is the predicted gain a
	// refinement must show (default DefaultTolerance).
	Tolerance float64
	// DriftFactor and DriftIterations: probe again when DriftIterations
	// iterations in a row take DriftFactor times the baseline (defaults
	// 1.5 and 3). Iterations that one report completed count once:
	// short ones share a single measurement.
	DriftFactor     float64
	DriftIterations int
	// RetryAfter is how many iterations after a failed probe the next one
	// starts (default 10).
	RetryAfter uint64
	// JoinSettle is how long a joining server's links are measured
	// before the probe that includes it (default 500 ms): its agent
	// reports no rate until it has seen a whole measuring window
	// (lbagent.Window, 250 ms), and a probe of short iterations would
	// otherwise fail for want of its rates.
	JoinSettle time.Duration
	// Fixed keeps the even split over the servers for good: no probe, no
	// balancing. The Balancer then only grants horizons, re-cuts after a
	// lost server or worker (Lose) and counts a joining worker
	// (JoinWorker), which is what FPT_ON_SERVER_LOSS=retry and
	// FPT_ON_WORKER_LOSS=continue|wait need with the LB off.
	Fixed bool
	// Hosts, if set, balances by host (Input.Hosts): the scheduler sets
	// it with local aggregation on, when the nodes' hosts are known.
	Hosts *Hosts
	// MinIteration: no probe starts while one of the latest iterations
	// took less than this (default 20 ms, or with AheadFor negative 0;
	// negative: any). An iteration that short is bound by per-message
	// latency, not by a link's bandwidth, so a split has little to gain;
	// a probe can measure nothing in it (a rate takes lbagent.Window,
	// hundreds of such iterations); and the probe's split (every node
	// aggregating, shaping off) costs a small step more hops and more
	// frames. The job keeps the even split over the servers, as with the
	// LB off, and probes once its iterations are long enough. A job's
	// first iterations are slow with its start, so a probe may start on
	// them: it is abandoned (the split before it issued again, without
	// waiting for its window) once abandonShort iterations in a row take
	// less than this, and starts again once recentIterations in a row
	// take this or more. While a probe is on, the lookahead is Lookahead,
	// so that the decision ending it lands within a few iterations. With
	// the lookahead fixed (AheadFor negative) its default lets short
	// iterations probe.
	MinIteration time.Duration
}

const (
	defaultLookahead       = 2
	defaultWarmup          = 2
	defaultProbeIterations = 2
	defaultDriftFactor     = 1.5
	defaultDriftIterations = 3
	defaultRetryAfter      = 10
	defaultJoinSettle      = 500 * time.Millisecond
	defaultAheadFor        = 100 * time.Millisecond
	defaultMinIteration    = 20 * time.Millisecond
	// maxTimedLookahead bounds the lookahead AheadFor asks for.
	maxTimedLookahead = 1024
	// Sanity bounds: beyond these a setting is a mistake, not a choice.
	maxLookahead       = 1 << 16
	maxProbeIterations = 1 << 16
	maxDriftIterations = 1 << 16
	// baselineIterations is how many iteration times the drift baseline
	// is the median of.
	baselineIterations = 3
	// recentIterations is how many of the latest iteration times
	// MinIteration compares with (the shortest: a job's first
	// iterations, slow with its start, must not pass for long ones).
	recentIterations = 5
	// abandonShort is how many iterations in a row shorter than
	// MinIteration abandon a probe: one alone can be the second of two
	// reports handled together after the scheduler stalled.
	abandonShort = 2
	// evenIterations is how many of the even split's latest iteration
	// times the guard keeps (their median is the even split's time).
	evenIterations = 5
	// guardMargin: a balanced split whose median iteration time is more
	// than this fraction above the even split's goes back to the even
	// split. Measured times are noisier than the predictions Tolerance
	// compares, and on the even split the job is never worse than with
	// the LB off.
	guardMargin = 0.15
	// minBackoff and maxBackoff bound how many iterations the job stays
	// on the even split, without a probe, after the guard sent it back:
	// the back-off doubles each time, from max(RetryAfter, minBackoff).
	minBackoff = 50
	maxBackoff = 1 << 12
)

// Balancer is the LB scheduler's state machine. It is fed every node's
// Sample and answers with the Directives to send every node. It is pure:
// time comes only from Observe's argument. It is not safe for concurrent
// use.
type Balancer struct {
	cfg      Config
	isWorker map[node.ID]bool // every known node
	all      []node.ID        // servers then workers: the probe's aggregators

	state   State
	horizon uint64             // the last iteration granted
	next    uint64             // the next iteration to become done
	seen    map[node.ID]uint64 // per node: 1 + the highest iteration reported (0: none)
	model   uint64             // M: the largest ModelBytes a worker reported

	current Decision // the latest decision issued
	good    Decision // the latest non-probe decision: what a failed probe falls back to

	// The latest retry for a lost worker: its version, and the first
	// iteration it re-cuts (0, 0: none). A worker's report of an
	// iteration from then on, made before it applied that version, is of
	// a sum over the old workers and shows no progress.
	recutVersion uint32
	recutFrom    uint64
	// joined holds the workers that joined since the latest lost worker's
	// retry: they never had a sum over the old workers, so their reports
	// count whatever retry version they carry.
	joined map[node.ID]bool
	// joinAt is each joined worker's first iteration.
	joinAt map[node.ID]uint64

	// held: grant no iteration past the horizon (FPT_ON_WORKER_LOSS=wait,
	// until a worker joins); holdWhy says why.
	held    bool
	holdWhy string

	// Timing: timedAt is when iteration timedFrom−1 was done, as of the
	// latest step that timed iterations (zero before the first step).
	// Each worker's latest report that raised its seen came at reportedAt.
	timedAt    time.Time
	timedFrom  uint64
	reportedAt map[node.ID]time.Time
	// ahead is the lookahead of the latest grant (see Config.AheadFor).
	ahead uint64

	probeAt  uint64 // Default: the step that starts the next probe
	probeWhy string
	// probeAfter: Default: the next probe waits for this time too (a
	// joining server's first measurements).
	probeAfter time.Time

	// Per-node highest rates, from samples of iterations in [from, to].
	up, down map[node.ID]float64
	from, to uint64

	enteredAt      uint64 // the step that entered Balanced
	lastDecisionAt uint64 // the step that issued the latest decision

	// recent holds the latest iteration times (up to recentIterations,
	// oldest first), for MinIteration.
	recent []time.Duration

	// Drift: iteration times from driftFrom on, one per report that
	// completed iterations (step); the baseline is the median of the
	// first baselineLen, which the guard also judges.
	driftFrom   uint64
	baseline    []time.Duration
	baselineLen int
	run         int // times in a row above the baseline times DriftFactor
	runSum      time.Duration

	// The guard: the LB's model can predict a split faster that measures
	// slower than the even split over the servers, which it then undoes.
	// landing holds the decisions issued and not in force yet, in order;
	// inForce is the one in force at the latest step.
	landing []landing
	inForce landing
	// even holds the latest iteration times of the even split over the
	// servers (up to evenIterations, oldest first), all under the
	// current set of nodes and conditions: a join, a loss or drift
	// clears it.
	even []time.Duration
	// backingOff: Default after the guard, until the next probe, which
	// drift on the even split brings forward; evenRun holds the times of
	// the iterations in a row above the even split's times DriftFactor.
	backingOff bool
	evenRun    []time.Duration
	backoff    uint64 // the next back-off, in iterations (0: the first)
	guards     uint64 // how many times the guard went back to the even split
}

// landing is a decision's first iteration, and whether it is the even
// split over the servers.
type landing struct {
	from uint64
	even bool
}

// NewBalancer checks cfg, fills in its defaults and returns a Balancer in
// Default, before its first grant (see Start).
func NewBalancer(cfg Config) (*Balancer, error) {
	if err := cfg.fill(); err != nil {
		return nil, fmt.Errorf("lb: new balancer: %w", err)
	}
	b := &Balancer{
		cfg:        cfg,
		isWorker:   make(map[node.ID]bool, len(cfg.Servers)+len(cfg.Workers)),
		all:        slices.Concat(cfg.Servers, cfg.Workers),
		seen:       make(map[node.ID]uint64, len(cfg.Servers)+len(cfg.Workers)),
		reportedAt: make(map[node.ID]time.Time, len(cfg.Workers)),
		horizon:    cfg.Lookahead,
		ahead:      cfg.Lookahead,
		current:    Even(0, 0, cfg.Servers),
		probeAt:    cfg.Warmup,
		probeWhy:   fmt.Sprintf("warm-up done (%d iterations on the even split)", cfg.Warmup),
		// The warm-up's rates count towards the first probe's: on the even
		// split over the servers those carry the most and show their
		// capacity best, while the probe loads them least.
		up:   make(map[node.ID]float64, len(cfg.Servers)+len(cfg.Workers)),
		down: make(map[node.ID]float64, len(cfg.Servers)+len(cfg.Workers)),
		from: 1,
		to:   math.MaxUint64,
		// The initial decision; its first iteration's time is unknown.
		inForce: landing{from: 0, even: true},
	}
	b.good = b.current
	if cfg.Fixed {
		b.probeAt = math.MaxUint64
	}
	for _, id := range cfg.Servers {
		b.isWorker[id] = false
	}
	for _, id := range cfg.Workers {
		b.isWorker[id] = true
	}
	return b, nil
}

// fill validates c and sets its defaults; it copies the id slices.
func (c *Config) fill() error {
	if len(c.Servers) == 0 || len(c.Workers) == 0 {
		return fmt.Errorf("need at least one server and one worker, have %d and %d", len(c.Servers), len(c.Workers))
	}
	if n := len(c.Servers) + len(c.Workers); n > MaxAggregators {
		return fmt.Errorf("%d nodes, more than a decision can name (%d)", n, MaxAggregators)
	}
	c.Servers, c.Workers = slices.Clone(c.Servers), slices.Clone(c.Workers)
	if c.Hosts != nil {
		c.Hosts = &Hosts{Of: maps.Clone(c.Hosts.Of), Local: c.Hosts.Local, Alone: maps.Clone(c.Hosts.Alone)}
	}
	seen := make(map[node.ID]bool, len(c.Servers)+len(c.Workers))
	for _, id := range slices.Concat(c.Servers, c.Workers) {
		if seen[id] {
			return fmt.Errorf("node %s named twice", node.ID(id))
		}
		seen[id] = true
	}
	def := func(v *uint64, d uint64) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.Lookahead, defaultLookahead)
	def(&c.Warmup, defaultWarmup)
	def(&c.ProbeIterations, defaultProbeIterations)
	def(&c.RetryAfter, defaultRetryAfter)
	if c.JoinSettle == 0 {
		c.JoinSettle = defaultJoinSettle
	}
	if c.AheadFor == 0 {
		c.AheadFor = defaultAheadFor
	}
	if c.MinIteration == 0 && c.AheadFor > 0 {
		c.MinIteration = defaultMinIteration
	}
	if c.Tolerance == 0 {
		c.Tolerance = DefaultTolerance
	}
	if c.DriftFactor == 0 {
		c.DriftFactor = defaultDriftFactor
	}
	if c.DriftIterations == 0 {
		c.DriftIterations = defaultDriftIterations
	}
	switch {
	case c.Lookahead > maxLookahead:
		return fmt.Errorf("lookahead %d, limit %d", c.Lookahead, maxLookahead)
	case c.ProbeIterations > maxProbeIterations:
		return fmt.Errorf("probe of %d iterations, limit %d", c.ProbeIterations, maxProbeIterations)
	case !(c.Tolerance > 0) || math.IsInf(c.Tolerance, 0):
		return fmt.Errorf("tolerance %g is not a positive fraction", c.Tolerance)
	case !(c.DriftFactor > 1) || math.IsInf(c.DriftFactor, 0):
		return fmt.Errorf("drift factor %g is not above 1", c.DriftFactor)
	case c.DriftIterations < 0 || c.DriftIterations > maxDriftIterations:
		return fmt.Errorf("drift iterations %d, want 1..%d", c.DriftIterations, maxDriftIterations)
	}
	return nil
}

// Start returns the initial grant: workers may push iterations up to
// Lookahead, with shaping on. It carries no decision, since every node
// starts with Even(0, 0, Servers) on its own. Call it once, before Observe.
func (b *Balancer) Start() Directive {
	return Directive{
		Horizon: b.horizon,
		Shaping: b.state != Probe,
		Reason:  fmt.Sprintf("start: even split over %d servers", len(b.cfg.Servers)),
	}
}

// State returns the Balancer's state.
func (b *Balancer) State() State { return b.state }

// Current returns the latest decision issued (which may not be in force
// yet), or the initial one.
func (b *Balancer) Current() Decision { return clone(b.current) }

// Measured returns copies of the highest send (up) and receive (down)
// rates, in bytes per second, measured per node in the current window:
// what the next decision will be made from. Nodes not yet measured are
// absent.
func (b *Balancer) Measured() (up, down map[node.ID]float64) {
	return maps.Clone(b.up), maps.Clone(b.down)
}

// Bound is the least iteration time the measured capacities allow (see
// Bound), or an error while a node is unmeasured; it is 0 while no worker
// has reported its model size.
func (b *Balancer) Bound() (time.Duration, error) { return Bound(b.input()) }

// Observe takes one node's sample, received at now, and returns the
// directives to send every node, in order: one per iteration that the
// sample completes (every worker has reported it), often none.
//
// Samples from unknown nodes, or for an iteration beyond the horizon
// (which no node can have finished), are ignored. Rates that are NaN,
// infinite, negative or above MaxCapacity are not used, but the sample
// still counts as the node's progress: a node with a broken rate counter
// must not stall training. A worker's sample of an iteration that the
// latest lost worker's retry re-cut, made before the worker applied that
// retry (Version older), gives rates but no progress: that worker has
// yet to push the iteration again (a worker that joined since counts:
// JoinWorker). While the grants are held (Hold) the directives keep the
// horizon where it was.
func (b *Balancer) Observe(s Sample, now time.Time) []Directive {
	worker, known := b.isWorker[s.Node]
	if !known || s.Iteration > b.horizon {
		return nil
	}
	if (!worker || s.Version >= b.recutVersion || s.Iteration < b.recutFrom || b.joined[s.Node]) && s.Iteration+1 > b.seen[s.Node] {
		b.seen[s.Node] = s.Iteration + 1
		if worker {
			b.reportedAt[s.Node] = now
		}
	}
	if worker {
		b.model = max(b.model, s.ModelBytes)
	}
	if b.up != nil && s.Iteration >= b.from && s.Iteration <= b.to && usableRate(s.UpRate) && usableRate(s.DownRate) {
		b.up[s.Node] = max(b.up[s.Node], s.UpRate)
		b.down[s.Node] = max(b.down[s.Node], s.DownRate)
	}

	// Iterations done: every worker has reported at least so far.
	doneTo := uint64(math.MaxUint64) // one past the last done
	for _, id := range b.cfg.Workers {
		doneTo = min(doneTo, b.seen[id])
	}
	if doneTo <= b.next {
		return nil
	}
	// Iterations that complete together share the time since the last
	// timed step: giving all but the first a zero time would fake a
	// speed-up.
	var t timing
	doneAt := b.doneAt(doneTo, now)
	first := b.timedAt.IsZero()
	if !first && doneAt.After(b.timedAt) {
		t = timing{from: b.timedFrom, wall: doneAt.Sub(b.timedAt) / time.Duration(doneTo-b.timedFrom)}
	}
	if first || t.wall > 0 {
		b.timedAt, b.timedFrom = doneAt, doneTo
	}
	out := make([]Directive, 0, doneTo-b.next)
	for ; b.next < doneTo; b.next++ {
		measured := timing{}
		if b.next == doneTo-1 {
			measured = t
		}
		out = append(out, b.step(b.next, t.wall, measured, now))
	}
	return out
}

// timing is one measurement of iteration times: iterations from from on,
// through the step's, took wall each.
type timing struct {
	from uint64
	wall time.Duration // 0: no measurement
}

// doneAt is when iteration doneTo−1 was done, as far as the workers'
// reports tell: when the latest of the slowest workers reported it (a
// worker reports an iteration as it begins the next). That is now when
// this report completes it, but earlier when an earlier report of a
// slower worker is what held doneTo back: reports of short iterations are
// paced (lbagent.Pace), and two workers' reports paced apart would
// otherwise time the iterations between them as alternately long and
// almost free.
func (b *Balancer) doneAt(doneTo uint64, now time.Time) time.Time {
	var at time.Time
	for _, id := range b.cfg.Workers {
		if r, ok := b.reportedAt[id]; ok && b.seen[id] == doneTo && r.After(at) {
			at = r
		}
	}
	if at.IsZero() {
		return now
	}
	return at
}

// Coalesce returns the directives of ds that nodes need, in order: those
// with a decision, those that turn shaping on or off (from the one before
// in ds), and the last. The others only raise the horizon and Done, which
// the last raises as far (both only grow): when one report completes
// several iterations (reports of iterations shorter than
// lbagent.ReportEvery come together), the scheduler sends one grant
// instead of one per iteration.
func Coalesce(ds []Directive) []Directive {
	out := make([]Directive, 0, min(len(ds), 2))
	for i, d := range ds {
		if d.Decision != nil || i == len(ds)-1 || i > 0 && d.Shaping != ds[i-1].Shaping {
			out = append(out, d)
		}
	}
	return out
}

// lookahead is how many iterations past the last one done to grant, for
// iterations that take wall each (0: unknown, the latest lookahead holds).
func (b *Balancer) lookahead(wall time.Duration) uint64 {
	if wall <= 0 {
		return b.ahead
	}
	if b.cfg.AheadFor <= 0 || b.cfg.Lookahead >= maxTimedLookahead {
		return b.cfg.Lookahead
	}
	n := uint64(b.cfg.AheadFor / wall)
	if b.cfg.AheadFor%wall != 0 {
		n++
	}
	return min(max(n, b.cfg.Lookahead), maxTimedLookahead)
}

// usableRate reports whether r can be a measured rate.
func usableRate(r float64) bool { return r >= 0 && r <= MaxCapacity } // false for NaN

// step advances past iteration i, now done, which took wall (0: unknown),
// and returns the directive for it. measured is the measurement that
// ends with i, if any: the iterations one report completes share one,
// which the even split's times and the drift baseline and runs count
// once (one slow report of short iterations is one slow time, not tens).
func (b *Balancer) step(i uint64, wall time.Duration, measured timing, now time.Time) Directive {
	prev := b.horizon
	b.ahead = b.lookahead(wall)
	if b.state == Probe {
		// The decision that ends the probe lands after the horizon: a
		// timed lookahead of short iterations would keep the probe's
		// split in force for tens of them.
		b.ahead = min(b.ahead, b.cfg.Lookahead)
	}
	if wall > 0 {
		if len(b.recent) == recentIterations {
			b.recent = slices.Delete(b.recent, 0, 1)
		}
		b.recent = append(b.recent, wall)
	}
	if !b.held {
		b.horizon = max(prev, i+1+b.ahead)
	}
	b.land(i)
	drift := b.timeEven(measured)
	var d Directive
	switch b.state {
	case Default:
		if lead, one := b.hostLeader(); one {
			d = b.defaultOnHost(i, prev, lead, drift, now)
		} else if drift != "" && !b.short() {
			// The times that drifted are the even split's now: what the
			// split after this probe is measured against.
			b.even = slices.Clone(b.evenRun[max(0, len(b.evenRun)-evenIterations):])
			d = b.startProbe(i, prev, drift, false)
		} else if i >= b.probeAt && !now.Before(b.probeAfter) {
			if b.short() {
				d = b.evenWhileShort(i, prev)
			} else {
				d = b.startProbe(i, prev, b.probeWhy, true)
			}
		}
	case Probe:
		// Wait one iteration at most for the servers' reports of the
		// window's last iteration, sent as the next one begins.
		if b.shortRun() {
			d = b.abandon(i, prev)
		} else if last := b.to; i > last || i == last && b.allReported(last) {
			d = b.finishProbe(i, prev)
		}
	case Balanced:
		d = b.balanced(i, prev, measured)
	}
	d.Horizon = b.horizon
	d.Shaping = b.state != Probe
	d.Done = i + 1
	return d
}

// land puts the decisions that take effect by iteration i in force.
func (b *Balancer) land(i uint64) {
	n := 0
	for n < len(b.landing) && b.landing[n].from <= i {
		b.inForce = b.landing[n]
		n++
	}
	b.landing = slices.Delete(b.landing, 0, n)
}

// schedule notes that decision d takes effect at its iteration; it
// replaces any decision issued before it for that iteration or later
// (a retry re-cuts iterations already granted).
func (b *Balancer) schedule(d Decision) {
	n := 0
	for n < len(b.landing) && b.landing[n].from < d.Iteration {
		n++
	}
	b.landing = append(b.landing[:n], landing{from: d.Iteration, even: b.isEven(d)})
}

// isEven reports whether d is the even split over the servers.
func (b *Balancer) isEven(d Decision) bool {
	return d.SplitWithin(Even(0, 0, b.cfg.Servers), ShareTolerance)
}

// timeEven records a measurement, t, when the even split over the
// servers is in force, of iterations from its second on: the first may
// have begun under the split before. While the guard backs off it
// returns why to probe when the even split's time drifts up (a link
// slowed since: the balanced split may then win), and keeps the times
// that drifted out of the even split's.
func (b *Balancer) timeEven(t timing) string {
	wall := t.wall
	if wall <= 0 || !b.inForce.even || t.from <= b.inForce.from {
		return ""
	}
	if b.backingOff && len(b.even) >= baselineIterations {
		if base := median(b.even); float64(wall) > float64(base)*b.cfg.DriftFactor {
			b.evenRun = appendLatest(b.evenRun, wall, max(b.cfg.DriftIterations, evenIterations))
			if len(b.evenRun) < b.cfg.DriftIterations {
				return ""
			}
			var sum time.Duration
			for _, d := range b.evenRun {
				sum += d
			}
			return fmt.Sprintf("iteration time on the even split rose from %s to %s", ms(base), ms(sum/time.Duration(len(b.evenRun))))
		}
		b.evenRun = b.evenRun[:0]
	}
	b.even = appendLatest(b.even, wall, evenIterations)
	return ""
}

// appendLatest appends d to ds, keeping the latest n.
func appendLatest(ds []time.Duration, d time.Duration, n int) []time.Duration {
	if len(ds) >= n {
		ds = slices.Delete(ds, 0, len(ds)-n+1)
	}
	return append(ds, d)
}

// forgetEven drops the even split's times and the guard's back-off: the
// set of nodes changed, and neither says anything of the new one.
func (b *Balancer) forgetEven() {
	b.even, b.evenRun = nil, nil
	b.inForce.even = false
	for k := range b.landing {
		b.landing[k].even = false
	}
	b.backingOff, b.backoff = false, 0
}

// guard is the check, at step i, of a balanced split that has been in
// force for baselineLen timed iterations (the drift baseline):
// when its median time is more than guardMargin above the even split's,
// the LB's model was wrong for this job, and it goes back to the even
// split at once, for a back-off that doubles each time, so that it does
// not oscillate. ok is false when the guard does not act.
func (b *Balancer) guard(i, prev uint64) (d Directive, ok bool) {
	if len(b.even) < baselineIterations || b.isEven(b.current) {
		return Directive{}, false
	}
	bal, even := median(b.baseline), median(b.even)
	if !(float64(bal) > float64(even)*(1+guardMargin)) {
		return Directive{}, false
	}
	dec, err := b.issue(i, prev, b.cfg.Servers, Even(0, 0, b.cfg.Servers).Shares)
	if err != nil { // cannot happen: the servers are valid aggregators
		return Directive{}, false
	}
	b.good = *dec
	b.measureAfresh(i + 1)
	wait := max(b.cfg.RetryAfter, minBackoff)
	if b.backoff > 0 {
		wait = max(min(2*b.backoff, maxBackoff), b.cfg.RetryAfter)
	}
	b.backoff = wait
	b.probeAt = satAdd(i, wait)
	b.probeWhy = fmt.Sprintf("retrying a balanced split after %d iterations on the even split", wait)
	b.backingOff, b.evenRun = true, nil
	b.guards++
	next := "probe"
	if _, one := b.hostLeader(); one {
		next = "try of the leader's split"
	}
	return Directive{
		Decision: dec,
		Reason: clip(fmt.Sprintf("balanced split measured %s, slower than the even split's %s; back to the even split, next %s after iteration %d",
			ms(bal), ms(even), next, b.probeAt)),
	}, true
}

// Guards returns how many times a balanced split measured slower than
// the even split over the servers sent the job back to it.
func (b *Balancer) Guards() uint64 { return b.guards }

// short reports whether one of the latest iterations took less than
// MinIteration, so that no probe should start. With no iteration timed
// yet it reports false: nothing shows them short.
func (b *Balancer) short() bool {
	return b.cfg.MinIteration > 0 && len(b.recent) > 0 && slices.Min(b.recent) < b.cfg.MinIteration
}

// shortRun reports whether the latest abandonShort iterations each took
// less than MinIteration: a probe then measures nothing (see
// Config.MinIteration) and is abandoned. A probe starts only when none of
// the latest iterations is that short, so these are the probe's own.
func (b *Balancer) shortRun() bool {
	n := len(b.recent)
	return b.cfg.MinIteration > 0 && n >= abandonShort && slices.Max(b.recent[n-abandonShort:]) < b.cfg.MinIteration
}

// evenWhileShort is a step in Default that would probe but for short
// iterations: the probe waits for longer ones. A server left out of the
// split (it joined, and the LB on gives it its share through a probe)
// gets its share at once: the even split over every server, as with the
// LB off; otherwise the split stays as it is.
func (b *Balancer) evenWhileShort(i, prev uint64) Directive {
	for _, id := range b.cfg.Servers {
		if j := slices.Index(b.current.Aggregators, id); j < 0 || !(b.current.Shares[j] > 0) {
			dec, err := b.issue(i, prev, b.cfg.Servers, Even(0, 0, b.cfg.Servers).Shares)
			if err != nil { // cannot happen: the servers are valid aggregators
				return Directive{}
			}
			b.good = *dec
			return Directive{Decision: dec, Reason: clip(fmt.Sprintf("even split over %d servers: iterations of %s are too short to probe (%s)", len(b.cfg.Servers), ms(slices.Min(b.recent)), b.probeWhy))}
		}
	}
	return Directive{}
}

// Servers returns the servers the Balancer counts on, in order.
func (b *Balancer) Servers() []node.ID { return slices.Clone(b.cfg.Servers) }

// Workers returns the workers the Balancer counts on, in order.
func (b *Balancer) Workers() []node.ID { return slices.Clone(b.cfg.Workers) }

// Done is one past the last iteration every worker has reported: the
// oldest iteration that may still be incomplete on some worker.
func (b *Balancer) Done() uint64 { return b.next }

// Join adds server id to the job. With the LB fixed (off) it returns the
// directive that gives it its share at once: the even split over every
// server, from the iteration after the horizon granted, as any decision
// (ok true). With the LB on it returns none (ok false): the first step
// JoinSettle after now starts a probe that measures the new server's
// links with every other node's, and the split after it decides its
// share. It fails, changing nothing, when id is already a node of the
// job.
func (b *Balancer) Join(id node.ID, now time.Time) (d Directive, ok bool, err error) {
	if _, known := b.isWorker[id]; known {
		return Directive{}, false, fmt.Errorf("lb: join %s: already a node of the job", id)
	}
	if len(b.all) >= MaxAggregators {
		return Directive{}, false, fmt.Errorf("lb: join %s: the job has %d nodes, as many as a decision can name", id, len(b.all))
	}
	b.forgetEven()
	b.cfg.Servers = append(slices.Clone(b.cfg.Servers), id)
	b.all = slices.Concat(b.cfg.Servers, b.cfg.Workers)
	b.isWorker[id] = false
	if !b.cfg.Fixed {
		b.state = Default
		b.probeAt = b.next
		b.probeAfter = now.Add(b.cfg.JoinSettle)
		b.probeWhy = fmt.Sprintf("%s joined: measuring its links", id)
		return Directive{}, false, nil
	}
	dec := Even(b.current.Version+1, b.horizon+1, b.cfg.Servers)
	return b.adopt(dec, fmt.Sprintf("%s joined: even split over %d servers", id, len(b.cfg.Servers))), true, nil
}

// adopt makes dec, which is not a probe, the current and the last good
// decision, and returns the directive that issues it: shaping on, the
// horizon and Done as they are.
func (b *Balancer) adopt(dec Decision, reason string) Directive {
	b.current, b.good = dec, dec
	b.lastDecisionAt = b.next
	b.schedule(dec)
	out := clone(dec)
	return Directive{
		Horizon:  b.horizon,
		Decision: &out,
		Shaping:  true,
		Done:     b.next,
		Reason:   clip(reason),
	}
}

// Lose takes server or worker id out of the job and returns the
// directive that re-cuts every iteration some worker may not have the sum
// of yet, without it: a decision with Retry set, taking effect at Done(),
// the even split over the remaining servers. Workers push those
// iterations again under it; aggregators drop what they hold of them
// under older versions, so no sum mixes the two. With the LB on, the
// Balancer then starts over from Default: a warm-up, then a probe that
// measures the links that are left. It fails, changing nothing, when id
// is not a node of the job or is its last server or last worker.
//
// A lost worker (FPT_ON_WORKER_LOSS=continue) changes what the re-cut
// iterations sum: the decision's Workers names the workers left, in
// increasing id order (a lost server's leaves Workers nil: unchanged).
// The workers left must then report those iterations again, under the
// retry's version (Sample.Version) or later, before they count as done.
func (b *Balancer) Lose(id node.ID, why string) (Directive, error) {
	worker, known := b.isWorker[id]
	if !known {
		return Directive{}, fmt.Errorf("lb: lose %s: not a node of the job", id)
	}
	role, members := "server", &b.cfg.Servers
	if worker {
		role, members = "worker", &b.cfg.Workers
	}
	if len(*members) == 1 {
		return Directive{}, fmt.Errorf("lb: lose %s: it is the last %s", id, role)
	}
	// A re-cut from Done before another worker's join iteration would
	// sum the iterations between with a joiner that never pushes them,
	// or drop the decision it joins by; a worker's loss at it could
	// change the worker that hands the joiner its parameters after it
	// pushed the join iteration, and no one would (the joiner's own loss
	// is fine: the re-cut leaves it out).
	for j, at := range b.joinAt {
		if j != id && (at > b.next || worker && at == b.next) {
			return Directive{}, fmt.Errorf("lb: lose %s: %s joins at iteration %d, and not every worker has the sums of iteration %d: the iterations between cannot be summed again around the join", id, j, at, b.next)
		}
	}
	i := slices.Index(*members, id)
	left := slices.Delete(slices.Clone(*members), i, i+1)
	servers := b.cfg.Servers
	if !worker {
		servers = left
	}
	dec := Even(b.current.Version+1, b.next, servers)
	if worker {
		dec.Workers = slices.Sorted(slices.Values(left))
	}
	// Config ids are not checked for their roles: a worker id that is
	// not one would make a retry no node accepts.
	if err := dec.Validate(); err != nil {
		return Directive{}, fmt.Errorf("lb: lose %s: %w", id, err)
	}
	b.forgetEven()
	*members = left
	b.all = slices.Concat(b.cfg.Servers, b.cfg.Workers)
	delete(b.isWorker, id)
	delete(b.seen, id)
	delete(b.reportedAt, id)
	delete(b.joinAt, id)
	if worker {
		b.recutVersion, b.recutFrom = dec.Version, dec.Iteration
		clear(b.joined)
		// Their reports from the retry's iteration on were of sums that
		// included the lost worker's pushes: they report them again.
		for _, w := range b.cfg.Workers {
			b.seen[w] = min(b.seen[w], b.next)
		}
	}
	b.measureAfresh(b.next + 1)
	b.probeAt = math.MaxUint64
	if !b.cfg.Fixed {
		b.probeAt = satAdd(b.horizon, b.cfg.Warmup)
		b.probeWhy = fmt.Sprintf("%s lost: measuring the links that are left", id)
	}
	reason := fmt.Sprintf("%s lost (%s): iterations from %d pushed again over %d servers", id, why, b.next, len(b.cfg.Servers))
	if worker {
		reason = fmt.Sprintf("%s lost (%s): iterations from %d pushed again by the %d workers left", id, why, b.next, len(b.cfg.Workers))
	}
	d := b.adopt(dec, reason)
	d.Retry = true
	return d, nil
}

// issue makes the next decision from a split: the next version, taking
// effect right after prev, the last iteration granted before it.
func (b *Balancer) issue(i, prev uint64, aggs []node.ID, shares []float64) (*Decision, error) {
	d := Decision{
		Version:     b.current.Version + 1,
		Iteration:   prev + 1,
		Aggregators: slices.Clone(aggs),
		Shares:      slices.Clone(shares),
	}
	if err := d.Validate(); err != nil {
		return nil, err
	}
	b.current = d
	b.lastDecisionAt = i
	b.schedule(d)
	out := clone(d)
	return &out, nil
}

// startProbe starts a probe at step i. From Default, the rates measured
// since the last decision (the warm-up's) count too (keep); a probe for
// drift or a periodic one starts afresh, since rates seen before may be
// out of date.
func (b *Balancer) startProbe(i, prev uint64, why string, keep bool) Directive {
	dec, err := b.issue(i, prev, b.all, Even(0, 0, b.all).Shares)
	if err != nil { // cannot happen: NewBalancer checked the ids
		return Directive{Reason: "probe not started: " + err.Error()}
	}
	b.state = Probe
	b.backingOff, b.evenRun = false, nil
	b.probeWhy = why // what an abandoned probe's next try gives as its reason
	if !keep || b.up == nil {
		b.up, b.down = make(map[node.ID]float64, len(b.all)), make(map[node.ID]float64, len(b.all))
		b.from = dec.Iteration
	}
	b.to = dec.Iteration + b.cfg.ProbeIterations - 1
	return Directive{
		Decision: dec,
		Probe:    true,
		Reason:   clip(fmt.Sprintf("probe: %s; measuring iterations %d to %d", why, b.from, b.to)),
	}
}

// allReported reports whether every node has reported iteration it.
func (b *Balancer) allReported(it uint64) bool {
	for _, id := range b.all {
		if b.seen[id] <= it {
			return false
		}
	}
	return true
}

func (b *Balancer) finishProbe(i, prev uint64) Directive {
	in := b.input()
	plan, err := Balance(in)
	var dec *Decision
	if err == nil {
		dec, err = b.issue(i, prev, plan.Aggregators, plan.Shares)
	}
	if err != nil {
		return b.fallBack(i, prev, err)
	}
	b.good = *dec
	b.enterBalanced(i, dec.Iteration)
	var why string
	if plan.Balanced {
		why = fmt.Sprintf("balanced: %s vs %s for the even split", b.times(plan.Predicted), b.times(plan.Even))
	} else {
		why = fmt.Sprintf("balanced: even split over the servers kept, no split predicted %.0f%% faster than %s", 100*b.cfg.Tolerance, b.times(plan.Even))
	}
	return Directive{Decision: dec, Reason: clip(why + "; capacities " + b.capacities(in.Capacity))}
}

// fallBack issues the last good decision again after a failed probe, and
// schedules the next try.
func (b *Balancer) fallBack(i, prev uint64, cause error) Directive {
	was := b.good.Version
	dec := b.reissueGood(i, prev)
	b.probeAt = satAdd(i, b.cfg.RetryAfter)
	b.probeWhy = "retrying after a failed probe"
	return Directive{
		Decision: dec,
		Reason:   clip(fmt.Sprintf("probe failed: %v; back to the split of v%d, next probe after iteration %d", cause, was, b.probeAt)),
	}
}

// abandon issues the last good decision again when a probe's iterations
// turn out short (shortRun), without waiting for its window. The next
// probe, for the same reason, waits for long iterations again (short).
func (b *Balancer) abandon(i, prev uint64) Directive {
	was := b.good.Version
	latest := slices.Max(b.recent[len(b.recent)-abandonShort:])
	dec := b.reissueGood(i, prev)
	b.probeAt = satAdd(i, 1)
	return Directive{
		Decision: dec,
		Reason: clip(fmt.Sprintf("probe abandoned: iterations of %s are too short to probe; back to the split of v%d until %d in a row take %s or more",
			ms(latest), was, recentIterations, ms(b.cfg.MinIteration))),
	}
}

// reissueGood issues the last good decision again and returns to Default,
// measuring afresh from the next iteration, on the split fallen back to.
func (b *Balancer) reissueGood(i, prev uint64) *Decision {
	dec, err := b.issue(i, prev, b.good.Aggregators, b.good.Shares)
	if err != nil { // cannot happen: good was valid when issued
		dec = nil
	} else {
		b.good = *dec
	}
	b.measureAfresh(i + 1)
	return dec
}

// measureAfresh returns to Default, measuring every node's rates anew from
// iteration from on.
func (b *Balancer) measureAfresh(from uint64) {
	b.state = Default
	b.up, b.down = make(map[node.ID]float64, len(b.all)), make(map[node.ID]float64, len(b.all))
	b.from, b.to = from, math.MaxUint64
}

// enterBalanced switches to Balanced at step i for a decision taking
// effect at it: the maxima go on from the probe's, with samples from it.
func (b *Balancer) enterBalanced(i, it uint64) {
	b.state = Balanced
	b.enteredAt = i
	b.from, b.to = it, math.MaxUint64
	b.resetDrift(it)
}

// resetDrift starts timing the decision taking effect at it, once it has
// been in force for a whole iteration.
func (b *Balancer) resetDrift(it uint64) {
	b.driftFrom = it + 1
	b.baseline = b.baseline[:0]
	b.baselineLen = baselineIterations
	if _, one := b.hostLeader(); one && b.short() {
		b.baselineLen *= shortDriftRun
	}
	b.run, b.runSum = 0, 0
}

// balanced is a step in Balanced: drift and periodic probes first, then
// refinements from the rates measured since; measured is the measurement
// ending with i (step).
func (b *Balancer) balanced(i, prev uint64, measured timing) Directive {
	_, oneHost := b.hostLeader()
	if wall := measured.wall; measured.from >= b.driftFrom && wall > 0 {
		if len(b.baseline) < b.baselineLen {
			b.baseline = append(b.baseline, wall)
			if len(b.baseline) == b.baselineLen {
				if d, ok := b.guard(i, prev); ok {
					return d
				}
			}
		} else if base := median(b.baseline); float64(wall) > float64(base)*b.cfg.DriftFactor {
			b.run++
			b.runSum += wall
			// Short iterations start no probe; on one host they drift
			// only after a longer run (shortDriftRun).
			need, short := b.cfg.DriftIterations, b.short()
			if short && oneHost {
				need *= shortDriftRun
			}
			if b.run >= need && (oneHost || !short) {
				rose := fmt.Sprintf("from %s to %s", ms(base), ms(b.runSum/time.Duration(b.run)))
				if oneHost {
					return b.timeAfresh(i, prev, "iteration time on the leader rose "+rose)
				}
				// Conditions changed: the even split's times are out of
				// date, and the split after this probe goes unguarded.
				b.even = nil
				return b.startProbe(i, prev, "iteration time rose "+rose, false)
			}
		} else {
			b.run, b.runSum = 0, 0
		}
	}
	if oneHost {
		return Directive{} // no link to probe or refine a split by
	}
	if b.cfg.ProbeEvery > 0 && i-b.enteredAt >= b.cfg.ProbeEvery && !b.short() {
		return b.startProbe(i, prev, fmt.Sprintf("periodic, every %d iterations", b.cfg.ProbeEvery), false)
	}
	if i-b.lastDecisionAt < b.ahead+2 {
		return Directive{} // let the latest decision land and be measured
	}
	in := b.input()
	plan, err := Balance(in)
	if err != nil || sameSplit(plan, b.current) {
		return Directive{}
	}
	now, best := in.perByte(b.current.Aggregators, b.current.Shares), in.perByte(plan.Aggregators, plan.Shares)
	if !(now > best*(1+b.cfg.Tolerance)) {
		return Directive{}
	}
	was := b.current.Version
	dec, err := b.issue(i, prev, plan.Aggregators, plan.Shares)
	if err != nil {
		return Directive{}
	}
	b.good = *dec
	b.resetDrift(dec.Iteration)
	return Directive{
		Decision: dec,
		Reason: clip(fmt.Sprintf("refined: %s vs %s for v%d; capacities %s",
			b.times(in.duration(best)), b.times(in.duration(now)), was, b.capacities(in.Capacity))),
	}
}

// input is what Balance decides from: each node's capacity is the slower
// of its highest send and receive rates; nodes without both are left out
// (Balance then fails, naming one).
func (b *Balancer) input() Input {
	c := make(map[node.ID]float64, len(b.all))
	for _, id := range b.all {
		if u, d := b.up[id], b.down[id]; u > 0 && d > 0 {
			c[id] = min(u, d)
		}
	}
	return Input{
		Servers:    b.cfg.Servers,
		Workers:    b.cfg.Workers,
		Capacity:   c,
		ModelBytes: float64(b.model),
		Tolerance:  b.cfg.Tolerance,
		Hosts:      b.cfg.Hosts,
	}
}

// sameSplit reports whether plan gives the aggregators of d the same
// shares, to rounding.
func sameSplit(plan Plan, d Decision) bool {
	return d.SplitWithin(Decision{Aggregators: plan.Aggregators, Shares: plan.Shares}, ShareTolerance)
}

// times formats a predicted time, which means nothing while no worker has
// reported its model size.
func (b *Balancer) times(d time.Duration) string {
	if b.model == 0 {
		return "(model size unknown)"
	}
	return "predicted " + ms(d)
}

// capacities formats the capacities in Mbit/s, servers then workers.
func (b *Balancer) capacities(c map[node.ID]float64) string {
	var sb strings.Builder
	for i, id := range b.all {
		if i > 0 {
			sb.WriteString(", ")
		}
		if v, ok := c[id]; ok {
			fmt.Fprintf(&sb, "%s %.1f Mbit/s", node.ID(id), v*8/1e6)
		} else {
			fmt.Fprintf(&sb, "%s unmeasured", node.ID(id))
		}
	}
	return sb.String()
}

func ms(d time.Duration) string {
	return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

// clip keeps a reason within MaxReason bytes, cutting at a rune boundary,
// so that the directive always encodes.
func clip(s string) string {
	const more = "…"
	if len(s) <= MaxReason {
		return s
	}
	cut := MaxReason - len(more)
	for cut > 0 && !utf8.RuneStart(s[cut]) { // s[cut] is the first byte dropped
		cut--
	}
	return s[:cut] + more
}

// satAdd is a + b, or the largest uint64 if that overflows.
func satAdd(a, b uint64) uint64 {
	if a+b < a {
		return math.MaxUint64
	}
	return a + b
}
