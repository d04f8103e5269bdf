package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fptps/fpt/internal/localcluster"
	"github.com/fptps/fpt/launch"
	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/netem"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/scheduler"
	"github.com/fptps/fpt/svgplot"
	"github.com/fptps/fpt/worker"
)

// The elastic scenarios of "fpt bench --scenario", in an emulated network
// (package netem, one node per host, as the LB scenarios): what a server's
// loss, a server's join and a worker's replacement do to the iteration
// time, next to the LB's bound before and after. Each runs the simulated
// trainer once, LB on:
//
//   - server-loss: 2 workers, 2 servers, every link at --rate, under
//     FPT_ON_SERVER_LOSS=retry; the process server1 is killed (SIGKILL)
//     in iteration --kill-at. The run must still finish every iteration,
//     every pulled value checked by the trainer.
//   - server-join: the slow-server set-up (server rank 1 at --slow-rate);
//     a third server, on a host at --rate made up front and idle until
//     then, is started in iteration --join-at.
//   - worker-wait: 3 workers, 2 servers, every link at --rate, under
//     FPT_ON_WORKER_LOSS=wait; the process worker2 is killed (SIGKILL) in
//     iteration --kill-at and, once the scheduler has logged the loss, a
//     replacement worker is started on a host made up front and idle
//     until then. The run must finish every iteration with the same
//     parameters on every worker.
const (
	scenarioServerLoss = "server-loss"
	scenarioServerJoin = "server-join"
	scenarioWorkerWait = "worker-wait"
)

// Defaults of the elastic scenarios: the LB scenarios' model and rates,
// over a run long enough for times before, around and well after the
// event.
const (
	elasticDefaultIters = 30
	// elasticLossDivisor places the default --kill-at a third of the way
	// into the run: equal links need no LB decision before the loss.
	elasticLossDivisor = 3
	// server-join runs longer and starts the joiner halfway, so that the
	// time before the join is the LB's settled one on the slow server
	// (it takes some ten iterations to get there at the defaults) and the
	// last --tail iterations come after the joiner's probe and share.
	elasticJoinDefaultIters = 40
	elasticJoinDivisor      = 2
	// elasticJoiner is the joined server's process name (localcluster
	// names the third server started so).
	elasticJoiner = "server2"
	// elasticServers are the servers a run starts with; the workers are
	// 2 unless --workers says otherwise (with 2, every worker's link
	// carries the model whatever the servers, so the bound does not move
	// with them; from 3 on it does).
	elasticServers        = 2
	elasticDefaultWorkers = 2
	// elasticMaxWorkers keeps a run within what two cores can drive.
	elasticMaxWorkers = 6
	// waitVictim is the worker worker-wait kills: not rank 0, whose
	// iteration times the scenario reports and which (the lowest id)
	// hands the replacement its parameters. waitMinWorkers leaves two
	// workers after it, so that the sums still add up several.
	waitVictim         = "worker2"
	waitMinWorkers     = 3
	waitDefaultWorkers = 3
)

// isElasticScenario tells whether name is one of the elastic scenarios.
func isElasticScenario(name string) bool {
	return name == scenarioServerLoss || name == scenarioServerJoin || name == scenarioWorkerWait
}

// waitJoiner is worker-wait's replacement's process name: localcluster
// names the first worker started after the job's workers so.
func waitJoiner(workers int) string { return "worker" + strconv.Itoa(workers) }

// elasticOptions are an elastic scenario's settings.
type elasticOptions struct {
	lbOptions
	name    string
	workers int
	killAt  int // server-loss, worker-wait
	joinAt  int // server-join
}

// event is the iteration the scenario's node is killed or started in.
func (eo elasticOptions) event() int {
	if eo.name == scenarioServerJoin {
		return eo.joinAt
	}
	return eo.killAt
}

// elasticResult is an elastic scenario's line. Times are milliseconds of
// worker rank 0's communication per iteration.
type elasticResult struct {
	Scenario    string   `json:"scenario"`
	Rate        string   `json:"rate"`
	SlowRate    string   `json:"slow_rate,omitempty"`
	ServerRates []string `json:"server_rates"` // by rank, before the event
	Servers     int      `json:"servers"`      // before the event
	Workers     int      `json:"workers"`
	Tensors     int      `json:"tensors"`
	ModelBytes  int64    `json:"model_bytes"`
	Iterations  int      `json:"iterations"`
	Tail        int      `json:"tail"`
	KillAt      int      `json:"kill_at,omitempty"`
	JoinAt      int      `json:"join_at,omitempty"`
	// LostNode and RetryFrom (server-loss) are the server the scheduler
	// took out and the iteration its retry took effect from;
	// RetriedIterMs is that iteration's time.
	LostNode      string  `json:"lost_node,omitempty"`
	RetryFrom     int     `json:"retry_from_iteration,omitempty"`
	RetriedIterMs float64 `json:"retried_iter_ms,omitempty"`
	// JoinedNode and ShareFrom (server-join) are the server the scheduler
	// admitted and the first iteration an LB decision gave it a share of.
	JoinedNode string `json:"joined_node,omitempty"`
	ShareFrom  int    `json:"share_from_iteration,omitempty"`
	// In worker-wait, LostNode and RetryFrom are the killed worker and
	// the first iteration summed over the workers left; HoldIteration is
	// the last iteration they went on to before waiting (the scheduler's
	// last_iteration); JoinedNode the replacement and JoinedFrom its
	// first iteration (the scheduler's from_iteration), whose time on
	// worker rank 0 (it waited for the replacement) is JoinIterMs;
	// WaitedMs the wall time between the scheduler's lines for the loss
	// and the join. Checksum is the parameters' checksum every worker
	// that ended the job printed, ChecksumRanks their ranks.
	HoldIteration int     `json:"hold_iteration,omitempty"`
	JoinedFrom    int     `json:"joined_from_iteration,omitempty"`
	JoinIterMs    float64 `json:"join_iter_ms,omitempty"`
	WaitedMs      float64 `json:"waited_ms,omitempty"`
	Checksum      string  `json:"checksum,omitempty"`
	ChecksumRanks []int   `json:"checksum_ranks,omitempty"`
	// BeforeIterMs is the median of up to Tail iterations before the
	// event (from iteration 2: the first is a warm-up); AfterIterMs that
	// of the last Tail iterations, all past the retry or the share.
	BeforeIterMs float64 `json:"before_iter_ms"`
	AfterIterMs  float64 `json:"after_iter_ms"`
	// BoundBeforeMs and BoundAfterMs are lb.Bound for the configured rates
	// of the servers before the event and after it.
	BoundBeforeMs   float64 `json:"bound_before_ms"`
	BoundAfterMs    float64 `json:"bound_after_ms"`
	BeforeOverBound float64 `json:"before_over_bound"`
	AfterOverBound  float64 `json:"after_over_bound"`
	AfterOverBefore float64 `json:"after_over_before"`
	// Exits is every process's exit status (-1: killed by a signal): 0
	// for a worker is a PASS, every pulled value checked.
	Exits   map[string]int `json:"exits"`
	ItersMs []float64      `json:"iters_ms"`
}

var elasticHeader = []string{"scenario", "workers", "servers", "rate", "slow rate", "event", "from",
	"before ms", "after ms", "bound before ms", "bound after ms", "after/bound", "after/before", "retried ms"}

// waitHeader is worker-wait's summary table.
var waitHeader = []string{"scenario", "workers", "servers", "rate", "lost", "retry from", "hold", "joined", "joined from",
	"waited ms", "join iter ms", "before ms", "after ms", "after/before", "bound ms", "after/bound", "checksum"}

func (r elasticResult) row() []string {
	f := func(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }
	if r.Scenario == scenarioWorkerWait {
		return []string{r.Scenario, strconv.Itoa(r.Workers), strconv.Itoa(r.Servers), r.Rate, r.LostNode,
			strconv.Itoa(r.RetryFrom), strconv.Itoa(r.HoldIteration), r.JoinedNode, strconv.Itoa(r.JoinedFrom),
			f(r.WaitedMs), f(r.JoinIterMs), f(r.BeforeIterMs), f(r.AfterIterMs), f(r.AfterOverBefore), f(r.BoundAfterMs),
			f(r.AfterOverBound), fmt.Sprintf("%s on ranks %v", r.Checksum, r.ChecksumRanks)}
	}
	event, from := r.JoinedNode+" joined", r.ShareFrom
	if r.Scenario == scenarioServerLoss {
		event, from = r.LostNode+" lost", r.RetryFrom
	}
	slow, retried := r.SlowRate, "-"
	if slow == "" {
		slow = "-"
	}
	if r.RetriedIterMs > 0 {
		retried = f(r.RetriedIterMs)
	}
	return []string{r.Scenario, strconv.Itoa(r.Workers), strconv.Itoa(r.Servers), r.Rate, slow, event, strconv.Itoa(from),
		f(r.BeforeIterMs), f(r.AfterIterMs), f(r.BoundBeforeMs), f(r.BoundAfterMs), f(r.AfterOverBound), f(r.AfterOverBefore),
		retried}
}

// header is the summary table's header for a result of scenario.
func elasticHeaderOf(scenario string) []string {
	if scenario == scenarioWorkerWait {
		return waitHeader
	}
	return elasticHeader
}

// from is the iteration the event took effect from: the retry's, the
// joined server's first share or the replacement worker's first
// iteration.
func (r elasticResult) from() int {
	switch r.Scenario {
	case scenarioServerLoss:
		return r.RetryFrom
	case scenarioWorkerWait:
		return r.JoinedFrom
	}
	return r.ShareFrom
}

// Notes of worker-wait's window.
const (
	noteWorkerKilled = "<- worker killed"
	noteWorkersLeft  = "<- summed over the workers left"
	noteHold         = "<- the last granted: the workers left wait"
	noteReplacement  = "<- the replacement's first"
)

// window is the table of the iterations around the event: each one's
// time, the bound in force and their ratio.
func (r elasticResult) window() (header []string, rows [][]string) {
	header = []string{"iteration", "ms", "bound ms", "ms/bound", ""}
	at := max(r.KillAt, r.JoinAt)
	first, last := max(1, at-failoverBefore), min(len(r.ItersMs), r.from()+failoverAfter)
	for it := first; it <= last; it++ {
		bound := r.BoundBeforeMs
		if it >= r.from() {
			bound = r.BoundAfterMs
		}
		var notes []string
		note := func(when int, what string) {
			if it == when {
				notes = append(notes, what)
			}
		}
		switch r.Scenario {
		case scenarioServerLoss:
			note(at, "<- server killed")
			note(r.RetryFrom, noteRetried)
		case scenarioServerJoin:
			note(at, noteStarted)
			note(r.ShareFrom, noteShare)
		case scenarioWorkerWait:
			note(at, noteWorkerKilled)
			note(r.RetryFrom, noteWorkersLeft)
			note(r.HoldIteration, noteHold)
			note(r.JoinedFrom, noteReplacement)
		}
		x := r.ItersMs[it-1]
		rows = append(rows, []string{strconv.Itoa(it), fmt.Sprintf("%.1f", x), fmt.Sprintf("%.1f", bound),
			fmt.Sprintf("%.2f", x/bound), strings.Join(notes, " ")})
	}
	return header, rows
}

// aggregate fills in the medians and ratios from worker rank 0's
// iteration times, the event's iteration (at: the kill or the start),
// the iteration it took effect from, and the bounds.
func (r *elasticResult) aggregate(iters []float64, at, from int, before, after time.Duration) error {
	switch {
	case len(iters) != r.Iterations:
		return fmt.Errorf("%d iteration times, want %d", len(iters), r.Iterations)
	case at < 3:
		return fmt.Errorf("the event in iteration %d: want 3 or later for a time before it", at)
	case from < at || from > r.Iterations-r.Tail:
		return fmt.Errorf("the event took effect from iteration %d: want %d to %d, for the last --tail %d iterations after it (raise --iters or lower --tail)",
			from, at, r.Iterations-r.Tail, r.Tail)
	}
	r.ItersMs = iters
	// Iteration i is iters[i-1]: before is iterations max(2, at-tail) to
	// at-1.
	r.BeforeIterMs = round3(median(iters[max(1, at-1-r.Tail) : at-1]))
	var err error
	if r.AfterIterMs, err = tailMedian(iters, r.Tail); err != nil {
		return err
	}
	r.BoundBeforeMs, r.BoundAfterMs = ms(before), ms(after)
	if r.BeforeIterMs <= 0 || r.AfterIterMs <= 0 || r.BoundBeforeMs <= 0 || r.BoundAfterMs <= 0 {
		return fmt.Errorf("non-positive times: before %v ms, after %v ms, bounds %v and %v ms",
			r.BeforeIterMs, r.AfterIterMs, r.BoundBeforeMs, r.BoundAfterMs)
	}
	r.BeforeOverBound = round3(r.BeforeIterMs / r.BoundBeforeMs)
	r.AfterOverBound = round3(r.AfterIterMs / r.BoundAfterMs)
	r.AfterOverBefore = round3(r.AfterIterMs / r.BeforeIterMs)
	return nil
}

// chart is the run's iteration times next to the bound in force, the
// event and the iteration it took effect from marked.
func (r elasticResult) chart() svgplot.LineChart {
	n, from := float64(max(len(r.ItersMs), 1)), float64(r.from())
	what := map[string]string{scenarioServerLoss: "server killed", scenarioServerJoin: "server started",
		scenarioWorkerWait: "worker killed"}[r.Scenario]
	effect := "in effect"
	if r.Scenario == scenarioWorkerWait {
		effect = "replacement's first"
	}
	return svgplot.LineChart{
		Title:  fmt.Sprintf("%s: %d workers, %d servers at %s, LB on", r.Scenario, r.Workers, r.Servers, r.Rate),
		XLabel: "iteration", YLabel: "iteration time (ms)",
		Series: []svgplot.Series{
			{Name: "iteration time", X: xs(len(r.ItersMs)), Y: r.ItersMs},
			{Name: "bound", X: []float64{1, from, from, n}, Y: []float64{r.BoundBeforeMs, r.BoundBeforeMs, r.BoundAfterMs, r.BoundAfterMs},
				Dashed: true},
		},
		Marks: []svgplot.Mark{{X: float64(max(r.KillAt, r.JoinAt)), Label: what}, {X: from, Label: effect}},
	}
}

// elasticLayout places the scenario's nodes: the LB scenarios'
// slow-server layout with workers workers (every link fast for
// server-loss and worker-wait), plus for server-join and worker-wait a
// fast host for the joiner, last.
func elasticLayout(name string, workers int, fast, slow netem.HostSpec) lbLayout {
	slowServer := 1
	if name != scenarioServerJoin {
		slowServer = -1
	}
	l := newLayout(elasticServers, workers, slowServer, -1, fast, slow)
	joiner := map[string]string{scenarioServerJoin: elasticJoiner, scenarioWorkerWait: waitJoiner(workers)}[name]
	if joiner != "" {
		l.hosts = append(l.hosts, fast)
		l.procHost[joiner] = len(l.hosts) - 1
	}
	return l
}

// elasticBounds are lb.Bound before the event and after it: without the
// victim's server (server-loss), with the joiner's (server-join, a new id
// past the job's servers), or with the replacement's link in place of
// the killed worker's (worker-wait, a new id past the job's workers).
func elasticBounds(l lbLayout, name string, model float64) (before, after time.Duration, err error) {
	in, err := l.boundInput(model)
	if err != nil {
		return 0, 0, err
	}
	if before, err = lb.Bound(in); err != nil {
		return 0, 0, err
	}
	switch name {
	case scenarioServerLoss:
		r := slices.Index(l.serverHosts, l.procHost[failoverVictim])
		if r < 0 {
			return 0, 0, fmt.Errorf("%s has no server host", failoverVictim)
		}
		lost := node.ServerID(r)
		in.Servers = slices.DeleteFunc(slices.Clone(in.Servers), func(id node.ID) bool { return id == lost })
		delete(in.Capacity, lost)
	case scenarioServerJoin:
		joined := node.ServerID(len(in.Servers))
		if in.Capacity[joined], err = l.hosts[l.procHost[elasticJoiner]].Capacity(); err != nil {
			return 0, 0, fmt.Errorf("joined server: %w", err)
		}
		in.Servers = append(slices.Clone(in.Servers), joined)
	case scenarioWorkerWait:
		r := slices.Index(l.workerHosts, l.procHost[waitVictim])
		if r < 0 {
			return 0, 0, fmt.Errorf("%s has no worker host", waitVictim)
		}
		lost, joined := node.WorkerID(r), node.WorkerID(len(in.Workers))
		in.Workers = append(slices.DeleteFunc(slices.Clone(in.Workers), func(id node.ID) bool { return id == lost }), joined)
		delete(in.Capacity, lost)
		if in.Capacity[joined], err = l.hosts[l.procHost[waitJoiner(len(l.workerHosts))]].Capacity(); err != nil {
			return 0, 0, fmt.Errorf("replacement worker: %w", err)
		}
	}
	if after, err = lb.Bound(in); err != nil {
		return 0, 0, err
	}
	return before, after, nil
}

// elasticMain runs "fpt bench --scenario server-loss|server-join|worker-wait":
// in the parent the network, the run and the result; in a worker it
// starts, the trainer.
func elasticMain(f *flags) int {
	eo := elasticOptions{name: f.scen.name, workers: elasticDefaultWorkers, killAt: f.killAt, joinAt: f.joinAt}
	minWorkers := 1
	if eo.name == scenarioWorkerWait {
		eo.workers, minWorkers = waitDefaultWorkers, waitMinWorkers
	}
	if f.set("workers") {
		eo.workers = f.goodput.workers
	}
	if eo.workers < minWorkers || eo.workers > elasticMaxWorkers {
		return usageError("--workers %d: want %d to %d (one host each)", eo.workers, minWorkers, elasticMaxWorkers)
	}
	iters := elasticDefaultIters
	if eo.name == scenarioServerJoin {
		iters = elasticJoinDefaultIters
	}
	lo, code := lbDefaults(f, iters)
	if code != launch.ExitOK {
		return code
	}
	eo.lbOptions = lo
	if !f.set("kill-at") {
		eo.killAt = eo.iters / elasticLossDivisor
	}
	if !f.set("join-at") {
		eo.joinAt = eo.iters / elasticJoinDivisor
	}
	if at := eo.event(); at < 3 || at > eo.iters-eo.tail {
		flag := map[string]string{scenarioServerLoss: "--kill-at", scenarioServerJoin: "--join-at", scenarioWorkerWait: "--kill-at"}[eo.name]
		return usageError("%s %d, --iters %d, --tail %d: want 3 <= %s <= iters-tail (times before the event and after it)",
			flag, at, eo.iters, eo.tail, flag[2:])
	}
	if isChild() {
		return runWorker(func(ctx context.Context, w *worker.Worker) error {
			return lbWorker(ctx, w, eo.lbOptions, os.Stdout, os.Stderr)
		})
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := runElasticScenario(ctx, eo, newProgress(os.Stderr))
	if err != nil {
		return failed(eo.name, err)
	}
	if err := writeElastic(os.Stdout, res, f.goodput.jsonOut, f.plot); err != nil {
		return failed("table", err)
	}
	return launch.ExitOK
}

// writeElastic prints res: the iterations around the event and the
// summary as tables, or one JSON line; and draws it with plot set.
func writeElastic(w io.Writer, res elasticResult, jsonOut bool, plot string) error {
	return writeWindowed(w, res, elasticHeaderOf(res.Scenario), jsonOut, plot, res.window)
}

// runElasticScenario builds the scenario's network and runs its cluster
// once. The network is torn down on every path.
func runElasticScenario(ctx context.Context, eo elasticOptions, p *progress) (elasticResult, error) {
	fast := netem.HostSpec{Up: eo.rate, Down: eo.rate}
	l := elasticLayout(eo.name, eo.workers, fast, netem.HostSpec{Up: eo.slowRate, Down: eo.slowRate})
	var model int64
	for _, n := range eo.trainerOptions().Sizes() {
		model += int64(n) * 4
	}
	boundBefore, boundAfter, err := elasticBounds(l, eo.name, float64(model))
	if err != nil {
		return elasticResult{}, err
	}
	res := elasticResult{Scenario: eo.name, Rate: eo.rate, ServerRates: l.rates(l.serverHosts),
		Servers: len(l.serverHosts), Workers: len(l.workerHosts), Tensors: eo.tensors, ModelBytes: model,
		Iterations: eo.iters, Tail: eo.tail}
	if eo.name == scenarioServerJoin {
		res.SlowRate, res.JoinAt = eo.slowRate, eo.joinAt
	} else {
		res.KillAt = eo.killAt
	}
	self, err := os.Executable()
	if err != nil {
		return res, err
	}
	p.printf(eo.name, "building a network of %d hosts (%s)", len(l.hosts), eo.rate)
	net, err := netem.New(ctx, l.hosts)
	if err != nil {
		return res, err
	}
	defer net.Close()
	args := []string{self, "bench", "--scenario", eo.name, "--rate", eo.rate, "--slow-rate", eo.slowRate,
		"--iters", strconv.Itoa(eo.iters), "--tail", strconv.Itoa(eo.tail), "--tensors", strconv.Itoa(eo.tensors),
		"--min-bytes", strconv.Itoa(eo.minBytes), "--max-bytes", strconv.Itoa(eo.maxBytes), "--compute", eo.compute.String(),
		"--kill-at", strconv.Itoa(eo.killAt), "--join-at", strconv.Itoa(eo.joinAt), "--workers", strconv.Itoa(eo.workers)}
	// PS_VERBOSE=1: the scheduler writes every LB decision, the probe that
	// first gives a joined server a share too (parseJoin).
	env := []string{childEnv + "=1", "PS_VERBOSE=1", "DMLC_INTERFACE=" + net.Iface(), "FPT_LB=on"}
	er := elasticRun{label: eo.name, iters: eo.iters, workers: len(l.workerHosts)}
	switch eo.name {
	case scenarioServerLoss:
		env = append(env, "FPT_ON_SERVER_LOSS=retry")
		er.victim, er.killAt = failoverVictim, eo.killAt
		er.label = fmt.Sprintf("%s, %s killed in iteration %d", eo.name, failoverVictim, eo.killAt)
	case scenarioServerJoin:
		er.joiner, er.joinAt = "server", eo.joinAt
		er.label = fmt.Sprintf("%s, %s started in iteration %d", eo.name, elasticJoiner, eo.joinAt)
	case scenarioWorkerWait:
		env = append(env, "FPT_ON_WORKER_LOSS=wait")
		er.victim, er.killAt, er.joiner = waitVictim, eo.killAt, "worker"
		er.label = fmt.Sprintf("%s, %s killed in iteration %d, then replaced", eo.name, waitVictim, eo.killAt)
	}
	if eo.partitionBytes > 0 {
		env = append(env, "FPT_PARTITION_BYTES="+strconv.FormatInt(eo.partitionBytes, 10))
	}
	er.spec = localcluster.Spec{Servers: len(l.serverHosts), Workers: len(l.workerHosts),
		Scheduler: []string{self}, Server: []string{self}, Worker: args, RootURI: net.Addr(l.schedulerHost), Env: env,
		Command: func(proc string, argv []string) *exec.Cmd {
			return net.Command(ctx, l.procHost[proc], argv[0], argv[1:]...)
		}}
	run, err := runElastic(ctx, er, p)
	if err != nil {
		return res, err
	}
	if err := checkRank0(run.report, net.Addr(l.workerHosts[0]), model); err != nil {
		return res, err
	}
	res.Exits, res.LostNode, res.RetryFrom, res.JoinedNode = run.exits, run.lost, run.retryFrom, run.joined
	from := run.joinFrom
	switch eo.name {
	case scenarioServerLoss:
		from = run.retryFrom
		if from >= 1 && from <= len(run.report.IterMs) {
			res.RetriedIterMs = run.report.IterMs[from-1]
		}
	case scenarioServerJoin:
		res.ShareFrom = run.joinFrom
	case scenarioWorkerWait:
		if err := res.replaced(run); err != nil {
			return res, err
		}
	}
	if err := res.aggregate(run.report.IterMs, eo.event(), from, boundBefore, boundAfter); err != nil {
		return res, err
	}
	return res, net.Close()
}

// replaced fills in worker-wait's figures from its run: the hold, the
// replacement's first iteration and its time, the wait, and the
// parameters' checksum, which every worker that ended the job must have
// printed alike.
func (r *elasticResult) replaced(run failoverRun) error {
	hold, err := parseHold(run.stderr["scheduler"])
	if err != nil {
		return err
	}
	// The replacement's decision comes after the iterations granted (the
	// horizon, frozen by the hold): its sums count it from the next one.
	if run.joinFrom != hold+1 {
		return fmt.Errorf("the replacement counts from iteration %d, want %d (after the hold at %d)", run.joinFrom, hold+1, hold)
	}
	if run.leftAt.IsZero() || run.joinedAt.IsZero() {
		return errors.New("the scheduler's lines for the loss and the join were not both seen while it ran")
	}
	r.HoldIteration, r.JoinedFrom = hold, run.joinFrom
	r.WaitedMs = round3(ms(run.joinedAt.Sub(run.leftAt)))
	if r.JoinedFrom >= 1 && r.JoinedFrom <= len(run.report.IterMs) {
		r.JoinIterMs = run.report.IterMs[r.JoinedFrom-1]
	}
	workers := map[string]string{}
	for name, log := range run.stderr {
		if strings.HasPrefix(name, "worker") && name != waitVictim {
			workers[name] = log
		}
	}
	r.Checksum, r.ChecksumRanks, err = sameChecksums(workers, waitJoiner(r.Workers), r.JoinedFrom)
	return err
}

// parseHold reads the last iteration granted before the scheduler held
// the job for a replacement worker.
func parseHold(log string) (int, error) {
	for line := range strings.SplitSeq(log, "\n") {
		if n, ok := scheduler.ParseHoldLine(line); ok {
			return int(n), nil
		}
	}
	return 0, errors.New("the scheduler logged no hold under FPT_ON_WORKER_LOSS=wait (last_iteration)")
}

// checksumLine and joinedLine are the simulated trainer's lines (package
// trainer) for a worker's parameters at its end and for a joiner's start.
var (
	checksumLine = regexp.MustCompile(`worker (\d+): parameters checksum (0x[0-9a-f]+)`)
	joinedLine   = regexp.MustCompile(`worker (\d+): joined the running job at iteration (\d+)`)
)

// sameChecksums checks the workers' logs (stderr by process name): each
// printed its parameters' checksum, all the same; joiner printed that it
// joined at iteration from. It returns the checksum and the ranks that
// printed it, in order.
func sameChecksums(logs map[string]string, joiner string, from int) (string, []int, error) {
	if len(logs) == 0 {
		return "", nil, errors.New("no worker's log to read a checksum from")
	}
	var sum string
	var ranks []int
	for _, name := range slices.Sorted(maps.Keys(logs)) {
		m := checksumLine.FindStringSubmatch(logs[name])
		if m == nil {
			return "", nil, fmt.Errorf("%s printed no parameters checksum", name)
		}
		if sum != "" && m[2] != sum {
			return "", nil, fmt.Errorf("parameters differ: %s (worker %s) ends with checksum %s, worker %d with %s", name, m[1], m[2], ranks[0], sum)
		}
		rank, err := strconv.Atoi(m[1])
		if err != nil {
			return "", nil, fmt.Errorf("%s: rank %q: %w", name, m[1], err)
		}
		sum, ranks = m[2], append(ranks, rank)
	}
	m := joinedLine.FindStringSubmatch(logs[joiner])
	if m == nil {
		return "", nil, fmt.Errorf("%s printed no line saying it joined the running job", joiner)
	}
	if m[2] != strconv.Itoa(from) {
		return "", nil, fmt.Errorf("%s says it joined at iteration %s, the scheduler counts it from %d", joiner, m[2], from)
	}
	slices.Sort(ranks)
	return sum, ranks, nil
}
