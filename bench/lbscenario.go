package bench

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/internal/localcluster"
	"github.com/fptps/fpt/launch"
	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/netem"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/scheduler"
	"github.com/fptps/fpt/trainer"
	"github.com/fptps/fpt/worker"
)

// The load-balancing scenarios of "fpt bench --scenario": each runs the
// simulated trainer (package trainer) on a cluster in an emulated network,
// one node per host, twice: with the LB off (every tensor split evenly over
// the servers, as ps-lite does) and on, and prints one JSON line with both
// iteration times next to the lower bound the links allow.
const (
	scenarioSlowServer = "slow-server" // 2 workers, 2 servers; server rank 1 slow
	scenarioEqual      = "equal"       // 4 workers, 4 servers; all equal
	scenarioSlowWorker = "slow-worker" // 4 workers, 2 servers; worker rank 3 slow
)

// lbScenarios are the LB scenarios in the order a list of them runs.
var lbScenarios = []string{scenarioSlowServer, scenarioEqual, scenarioSlowWorker}

// Defaults of the LB scenarios. The fast rate stays below ~500 Mbit/s: two
// cores run every process of the cluster, and the emulation must be what
// limits the links, not the CPU.
const (
	lbDefaultRate     = "400mbit"
	lbDefaultIters    = 20
	lbDefaultTail     = 8
	lbDefaultTensors  = 8
	lbDefaultMinBytes = 64 << 10
	lbDefaultMaxBytes = 8 << 20
	// lbSlowDivisor makes the default slow rate a quarter of the fast one.
	lbSlowDivisor = 4
)

// lbOptions are the LB scenarios' settings ("fpt bench" flags).
type lbOptions struct {
	rate, slowRate string // tc syntax
	iters, tail    int    // iterations per run; the median is over the last tail
	tensors        int
	minBytes       int
	maxBytes       int
	partitionBytes int64         // FPT_PARTITION_BYTES (0: the default)
	compute        time.Duration // the trainer's pause before each iteration's pushes
}

// registerLBFlags adds the LB scenarios' own flags to fs (--rate, --iters,
// --partition-bytes and --json are the bench's and are shared).
func registerLBFlags(fs *flag.FlagSet, lo *lbOptions) {
	fs.StringVar(&lo.slowRate, "slow-rate", "", "LB scenarios: the slow host's rate, both ways (default: a quarter of --rate)")
	fs.IntVar(&lo.tail, "tail", lbDefaultTail, "LB scenarios: iteration time is the median of the last N iterations of each run")
	fs.IntVar(&lo.tensors, "tensors", lbDefaultTensors, "LB and failover scenarios: tensors in the model")
	fs.IntVar(&lo.minBytes, "min-bytes", lbDefaultMinBytes, "LB and failover scenarios: smallest tensor in bytes (sizes are geometric up to --max-bytes)")
	fs.IntVar(&lo.maxBytes, "max-bytes", lbDefaultMaxBytes, "LB and failover scenarios: largest tensor in bytes (failover: default 4 MiB)")
	fs.DurationVar(&lo.compute, "compute", 0, "LB and failover scenarios: the workers pause this long before each iteration's\npushes, standing for the forward and backward passes")
}

// isLBScenario tells whether name is one LB scenario or a comma-separated
// list of them.
func isLBScenario(name string) bool {
	for n := range strings.SplitSeq(name, ",") {
		if !slices.Contains(lbScenarios, n) {
			return false
		}
	}
	return true
}

// trainerOptions is the model the scenario's workers train.
func (lo lbOptions) trainerOptions() trainer.Options {
	return trainer.Options{Iterations: lo.iters, Tensors: lo.tensors, MinBytes: lo.minBytes, MaxBytes: lo.maxBytes,
		DType: frame.Float32, Quiet: true, Compute: lo.compute}
}

// lbResult is an LB scenario's line. Times are milliseconds per iteration.
type lbResult struct {
	Scenario    string   `json:"scenario"`
	Rate        string   `json:"rate"`
	SlowRate    string   `json:"slow_rate"`
	ServerRates []string `json:"server_rates"` // by rank, up/down when they differ
	WorkerRates []string `json:"worker_rates"`
	Servers     int      `json:"servers"`
	Workers     int      `json:"workers"`
	Tensors     int      `json:"tensors"`
	ModelBytes  int64    `json:"model_bytes"`
	Iterations  int      `json:"iterations"`
	Tail        int      `json:"tail"`
	// EvenIterMs and LBIterMs are the medians of the last Tail iterations
	// with FPT_LB=off and FPT_LB=on.
	EvenIterMs float64 `json:"even_iter_ms"`
	LBIterMs   float64 `json:"lb_iter_ms"`
	// BoundIterMs is lb.Bound under the configured rates; EvenModelIterMs
	// is the same model's prediction for the even split over the servers.
	BoundIterMs     float64 `json:"bound_iter_ms"`
	EvenModelIterMs float64 `json:"even_model_iter_ms"`
	LBOverBound     float64 `json:"lb_over_bound"`
	EvenOverLB      float64 `json:"even_over_lb"`
	// LBDecisions is how many distinct decisions the scheduler made in the
	// FPT_LB=on run (its decision lines on stdout).
	LBDecisions int `json:"lb_decisions"`
	// LBDecisionMarks are those decisions and the iteration each took
	// effect from (the x of EvenItersMs[i] and LBItersMs[i] is i+1).
	LBDecisionMarks []lbDecisionMark `json:"lb_decision_marks"`
	EvenItersMs     []float64        `json:"even_iters_ms"`
	LBItersMs       []float64        `json:"lb_iters_ms"`
}

// lbLayout places a scenario's nodes on hosts: servers first, then
// workers, then the scheduler, one node per host.
type lbLayout struct {
	hosts []netem.HostSpec
	// serverHosts[r] and workerHosts[r] are the hosts of server and worker
	// rank r. The scheduler ranks each role by address (as a string), so
	// rank order is address order, not host order, past nine hosts.
	serverHosts, workerHosts []int
	schedulerHost            int
	// procHost maps localcluster's process names (scheduler, server0..,
	// worker0..; not ranks) to hosts.
	procHost map[string]int
}

// lbScenarioLayout lays out scenario name with fast and slow links; the
// scheduler's host is unlimited.
func lbScenarioLayout(name string, fast, slow netem.HostSpec) (lbLayout, error) {
	var servers, workers, slowServer, slowWorker int
	slowServer, slowWorker = -1, -1
	switch name {
	case scenarioSlowServer:
		servers, workers, slowServer = 2, 2, 1
	case scenarioEqual:
		servers, workers = 4, 4
	case scenarioSlowWorker:
		servers, workers, slowWorker = 2, 4, 3
	default:
		return lbLayout{}, fmt.Errorf("unknown LB scenario %q (want %s)", name, strings.Join(lbScenarios, ", "))
	}
	return newLayout(servers, workers, slowServer, slowWorker, fast, slow), nil
}

// newLayout lays out servers and workers, one host each, then the
// scheduler's (unlimited); every link fast but those of server rank
// slowServer and worker rank slowWorker (-1: none).
func newLayout(servers, workers, slowServer, slowWorker int, fast, slow netem.HostSpec) lbLayout {
	l := lbLayout{hosts: make([]netem.HostSpec, servers+workers+1), schedulerHost: servers + workers,
		procHost: map[string]int{"scheduler": servers + workers}}
	for i := range servers {
		l.serverHosts = append(l.serverHosts, i)
		l.procHost["server"+strconv.Itoa(i)] = i
	}
	for i := range workers {
		l.workerHosts = append(l.workerHosts, servers+i)
		l.procHost["worker"+strconv.Itoa(i)] = servers + i
	}
	l.serverHosts, l.workerHosts = byAddress(l.serverHosts), byAddress(l.workerHosts)
	for r, h := range l.serverHosts {
		l.hosts[h] = fast
		if r == slowServer {
			l.hosts[h] = slow
		}
	}
	for r, h := range l.workerHosts {
		l.hosts[h] = fast
		if r == slowWorker {
			l.hosts[h] = slow
		}
	}
	return l
}

// byAddress sorts hosts the way the scheduler ranks nodes: by address
// string.
func byAddress(hosts []int) []int {
	s := slices.Clone(hosts)
	slices.SortFunc(s, func(a, b int) int { return cmp.Compare(netem.HostAddr(a), netem.HostAddr(b)) })
	return s
}

// rates lists the specs of hosts, as HostSpec.String prints them.
func (l lbLayout) rates(hosts []int) []string {
	var rs []string
	for _, h := range hosts {
		rs = append(rs, l.hosts[h].String())
	}
	return rs
}

// boundInput is the LB model's input for the layout's configured rates
// and a model of modelBytes per iteration.
func (l lbLayout) boundInput(modelBytes float64) (lb.Input, error) {
	in := lb.Input{Capacity: map[node.ID]float64{}, ModelBytes: modelBytes}
	add := func(id node.ID, host int) error {
		c, err := l.hosts[host].Capacity()
		in.Capacity[id] = c
		return err
	}
	for r, h := range l.serverHosts {
		in.Servers = append(in.Servers, node.ServerID(r))
		if err := add(node.ServerID(r), h); err != nil {
			return in, fmt.Errorf("server %d: %w", r, err)
		}
	}
	for r, h := range l.workerHosts {
		in.Workers = append(in.Workers, node.WorkerID(r))
		if err := add(node.WorkerID(r), h); err != nil {
			return in, fmt.Errorf("worker %d: %w", r, err)
		}
	}
	return in, nil
}

// modelTimes are the LB model's times for the layout's configured rates:
// the bound and the even split's prediction.
//
// The bound is lb.Bound, whose formula is the traffic model in
// lb/balance.go's doc comment: an iteration takes at least the busiest
// node's bytes over its link rate, T(s) = max_n load_n(s)/c_n, and the
// bound is that minimised over every split s of the tensors over servers
// and workers (water-filling). It counts payload only (no TCP/IP or frame
// headers) and assumes perfect overlap, so measured times sit above it.
func (l lbLayout) modelTimes(modelBytes float64) (bound, even time.Duration, err error) {
	in, err := l.boundInput(modelBytes)
	if err != nil {
		return 0, 0, err
	}
	if bound, err = lb.Bound(in); err != nil {
		return 0, 0, err
	}
	if even, err = lb.Predict(in, lb.Even(0, 0, in.Servers)); err != nil {
		return 0, 0, err
	}
	return bound, even, nil
}

// aggregate fills in the times and ratios from both runs' iteration times
// (ms) and the model's bound and even-split prediction.
func (r *lbResult) aggregate(even, balanced []float64, bound, evenModel time.Duration) error {
	var err error
	if r.EvenIterMs, err = tailMedian(even, r.Tail); err != nil {
		return fmt.Errorf("LB off: %w", err)
	}
	if r.LBIterMs, err = tailMedian(balanced, r.Tail); err != nil {
		return fmt.Errorf("LB on: %w", err)
	}
	r.EvenItersMs, r.LBItersMs = even, balanced
	r.BoundIterMs, r.EvenModelIterMs = ms(bound), ms(evenModel)
	if r.BoundIterMs <= 0 || r.LBIterMs <= 0 {
		return fmt.Errorf("non-positive times: bound %v ms, LB %v ms", r.BoundIterMs, r.LBIterMs)
	}
	r.LBOverBound = round3(r.LBIterMs / r.BoundIterMs)
	r.EvenOverLB = round3(r.EvenIterMs / r.LBIterMs)
	return nil
}

// lbDecisionMark is an LB decision and the iteration it took effect from.
type lbDecisionMark struct {
	Version   uint32 `json:"version"`
	Iteration uint64 `json:"iteration"`
}

// decisionMarks are the distinct decisions in a scheduler's stdout, where
// it writes one line per decision (scheduler.DecisionLine), in order.
func decisionMarks(stdout string) []lbDecisionMark {
	var marks []lbDecisionMark
	seen := map[uint32]bool{}
	for line := range strings.Lines(stdout) {
		if v, it, ok := scheduler.ParseDecisionLine(line); ok && !seen[v] {
			seen[v] = true
			marks = append(marks, lbDecisionMark{Version: v, Iteration: it})
		}
	}
	return marks
}

// lbWorkerReport is what worker rank 0 of a scenario's cluster prints.
type lbWorkerReport struct {
	Rank       int       `json:"rank"`
	Host       string    `json:"host"`
	ModelBytes int64     `json:"model_bytes"`
	IterMs     []float64 `json:"iter_ms"`
}

// lbWorker is a scenario worker's body: train, and on rank 0 print the
// iteration times on out and the trainer's lines on errOut as progress.
func lbWorker(ctx context.Context, w *worker.Worker, lo lbOptions, out, errOut io.Writer) error {
	opts := lo.trainerOptions()
	trainerOut := errOut
	if w.Rank() == 0 {
		opts.Quiet = false
		trainerOut = marked(errOut)
	}
	s, err := trainer.Run(ctx, w, opts, trainerOut)
	if err != nil || w.Rank() != 0 {
		return err
	}
	rep := lbWorkerReport{Rank: w.Rank(), Host: w.Node().Self().Host, ModelBytes: s.ModelBytes}
	for _, d := range s.IterTimes {
		rep.IterMs = append(rep.IterMs, ms(d))
	}
	return writeJSONLine(out, rep)
}

// rank0Report is the report of worker rank 0 of c (which has workers
// workers): the one worker that prints to its stdout, as lbWorker does.
func rank0Report(c *localcluster.Cluster, workers int) (lbWorkerReport, error) {
	for i := range workers {
		proc := c.Proc("worker" + strconv.Itoa(i))
		if strings.TrimSpace(proc.Stdout.String()) == "" {
			continue
		}
		var rep lbWorkerReport
		err := decodeReport(proc, &rep)
		return rep, err
	}
	return lbWorkerReport{}, errors.New("no worker reported its iteration times")
}

// lbResultHeader and row are the table of the LB scenarios without --json.
var lbResultHeader = []string{"scenario", "workers", "servers", "rate", "slow rate",
	"even ms", "LB ms", "bound ms", "even model ms", "LB/bound", "even/LB", "decisions"}

func (r lbResult) row() []string {
	f := func(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }
	return []string{r.Scenario, strconv.Itoa(r.Workers), strconv.Itoa(r.Servers), r.Rate, r.SlowRate,
		f(r.EvenIterMs), f(r.LBIterMs), f(r.BoundIterMs), f(r.EvenModelIterMs), f(r.LBOverBound), f(r.EvenOverLB),
		strconv.Itoa(r.LBDecisions)}
}

// lbDefaults are the LB options from the command line, checked, with the
// rates' defaults and iters as --iters' (the LB and elastic scenarios
// share them); a status other than launch.ExitOK is a usage error, reported.
func lbDefaults(f *flags, iters int) (lbOptions, int) {
	lo := f.lbs
	lo.rate, lo.iters, lo.partitionBytes = lbDefaultRate, iters, f.goodput.partitionBytes
	if f.set("rate") {
		lo.rate = f.scen.rate
	}
	if f.set("iters") {
		lo.iters = f.goodput.iters
	}
	if _, err := netem.ParseRate(lo.rate); err != nil {
		return lo, usageError("--rate %q: want one finite tc rate, as 400mbit: %v", lo.rate, err)
	}
	if lo.slowRate == "" {
		s, err := netem.DivideRate(lo.rate, lbSlowDivisor)
		if err != nil {
			return lo, usageError("--rate %q: %v", lo.rate, err)
		}
		lo.slowRate = s
	} else if _, err := netem.ParseRate(lo.slowRate); err != nil {
		return lo, usageError("--slow-rate %q: want one finite tc rate, as 100mbit: %v", lo.slowRate, err)
	}
	if lo.tail < 1 || lo.iters < lo.tail {
		return lo, usageError("--iters %d, --tail %d: want 1 <= tail <= iters", lo.iters, lo.tail)
	}
	if err := lo.trainerOptions().Validate(); err != nil {
		return lo, usageError("%v", err)
	}
	return lo, launch.ExitOK
}

// lbScenarioMain runs "fpt bench --scenario slow-server|equal|slow-worker"
// (or a comma-separated list of them): in the parent, for each scenario its
// network and both runs, one JSON line each with --json, else a table; in
// a worker it starts, the worker's side.
func lbScenarioMain(f *flags) int {
	lo, code := lbDefaults(f, lbDefaultIters)
	if code != launch.ExitOK {
		return code
	}
	if isChild() {
		return runWorker(func(ctx context.Context, w *worker.Worker) error {
			return lbWorker(ctx, w, lo, os.Stdout, os.Stderr)
		})
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	p := newProgress(os.Stderr)
	results := resultWriter{w: os.Stdout, jsonOut: f.goodput.jsonOut, header: lbResultHeader, plot: f.plot}
	for n := range strings.SplitSeq(f.scen.name, ",") {
		res, err := runLBScenario(ctx, n, lo, p)
		if err != nil {
			return failed(n, err)
		}
		if err := results.add(res); err != nil {
			return failed(n, err)
		}
	}
	if err := results.flush(); err != nil {
		return failed("table", err)
	}
	return launch.ExitOK
}

// runLBScenario builds the scenario's network and runs its cluster with
// the LB off, then on. The network is torn down on every path.
func runLBScenario(ctx context.Context, name string, lo lbOptions, p *progress) (lbResult, error) {
	fast := netem.HostSpec{Up: lo.rate, Down: lo.rate}
	slow := netem.HostSpec{Up: lo.slowRate, Down: lo.slowRate}
	l, err := lbScenarioLayout(name, fast, slow)
	if err != nil {
		return lbResult{}, err
	}
	var model int64
	for _, n := range lo.trainerOptions().Sizes() {
		model += int64(n) * 4
	}
	bound, evenModel, err := l.modelTimes(float64(model))
	if err != nil {
		return lbResult{}, err
	}
	res := lbResult{Scenario: name, Rate: lo.rate, SlowRate: lo.slowRate,
		ServerRates: l.rates(l.serverHosts), WorkerRates: l.rates(l.workerHosts),
		Servers: len(l.serverHosts), Workers: len(l.workerHosts), Tensors: lo.tensors,
		ModelBytes: model, Iterations: lo.iters, Tail: lo.tail}
	p.printf(name, "building a network of %d hosts (%s, the slow one %s)", len(l.hosts), lo.rate, lo.slowRate)
	net, err := netem.New(ctx, l.hosts)
	if err != nil {
		return res, err
	}
	defer net.Close()
	even, _, err := runLBCluster(ctx, net, l, name, lo, false, model, p)
	if err != nil {
		return res, fmt.Errorf("LB off: %w", err)
	}
	balanced, decisions, err := runLBCluster(ctx, net, l, name, lo, true, model, p)
	if err != nil {
		return res, fmt.Errorf("LB on: %w", err)
	}
	res.LBDecisions, res.LBDecisionMarks = len(decisions), decisions
	if err := res.aggregate(even, balanced, bound, evenModel); err != nil {
		return res, err
	}
	return res, net.Close()
}

// runLBCluster runs the scenario's cluster in net once, FPT_LB on or off,
// and returns worker rank 0's iteration times (ms) and the LB decisions
// the scheduler made.
func runLBCluster(ctx context.Context, net *netem.Network, l lbLayout, name string, lo lbOptions, lbOn bool, model int64, p *progress) ([]float64, []lbDecisionMark, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, nil, err
	}
	args := []string{self, "bench", "--scenario", name, "--rate", lo.rate, "--slow-rate", lo.slowRate,
		"--iters", strconv.Itoa(lo.iters), "--tail", strconv.Itoa(lo.tail), "--tensors", strconv.Itoa(lo.tensors),
		"--min-bytes", strconv.Itoa(lo.minBytes), "--max-bytes", strconv.Itoa(lo.maxBytes), "--compute", lo.compute.String()}
	mode := "off"
	if lbOn {
		mode = "on"
	}
	// PS_VERBOSE=1: the scheduler writes every LB decision, probes too, on
	// its stdout (decisionMarks).
	env := []string{childEnv + "=1", "PS_VERBOSE=1", "DMLC_INTERFACE=" + net.Iface(), "FPT_LB=" + mode}
	if lo.partitionBytes > 0 {
		env = append(env, "FPT_PARTITION_BYTES="+strconv.FormatInt(lo.partitionBytes, 10))
	}
	run := fmt.Sprintf("%s, LB %s", name, mode)
	p.printf(run, "cluster starting")
	c, err := runOnHosts(ctx, net, localcluster.Spec{
		Servers: len(l.serverHosts), Workers: len(l.workerHosts),
		Scheduler: []string{self}, Server: []string{self}, Worker: args,
		RootURI: net.Addr(l.schedulerHost), Env: env,
	}, func(proc string) int { return l.procHost[proc] }, p, run, 30*time.Minute)
	if err != nil {
		return nil, nil, err
	}
	defer c.Kill()
	rep, err := rank0Report(c, len(l.workerHosts))
	if err != nil {
		return nil, nil, err
	}
	if len(rep.IterMs) != lo.iters {
		return nil, nil, fmt.Errorf("worker 0 reported %d iterations, want %d", len(rep.IterMs), lo.iters)
	}
	if err := checkRank0(rep, net.Addr(l.workerHosts[0]), model); err != nil {
		return nil, nil, err
	}
	return rep.IterMs, decisionMarks(c.Proc("scheduler").Stdout.String()), nil
}

// checkRank0 checks worker rank 0's report: it ran on host (else a slow
// host would not be the rank the scenario means) and trained model bytes
// per iteration.
func checkRank0(rep lbWorkerReport, host string, model int64) error {
	switch {
	case rep.Host != host:
		return fmt.Errorf("worker rank 0 ran on %s, want %s: ranks are not in address order", rep.Host, host)
	case rep.ModelBytes != model:
		return fmt.Errorf("worker 0 trained %d bytes per iteration, want %d", rep.ModelBytes, model)
	}
	return nil
}
