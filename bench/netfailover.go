package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/fptps/fpt/internal/localcluster"
	"github.com/fptps/fpt/launch"
	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/netem"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/svgplot"
	"github.com/fptps/fpt/worker"
)

// The elastic scenarios of "fpt bench --scenario", in an emulated network
// (package netem, one node per host, as the LB scenarios): what a server's
// loss and a server's join do to the iteration time, next to the LB's
// bound before and after. Each runs the simulated trainer once, LB on:
//
//   - server-loss: 2 workers, 2 servers, every link at --rate, under
//     FPT_ON_SERVER_LOSS=retry; the process server1 is killed (SIGKILL)
//     in iteration --kill-at. The run must still finish every iteration,
//     every pulled value checked by the trainer.
//   - server-join: the slow-server set-up (server rank 1 at --slow-rate);
//     a third server, on a host at --rate made up front and idle until
//     then, is started in iteration --join-at.
const (
	scenarioServerLoss = "server-loss"
	scenarioServerJoin = "server-join"
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
)

// isElasticScenario tells whether name is one of the elastic scenarios.
func isElasticScenario(name string) bool {
	return name == scenarioServerLoss || name == scenarioServerJoin
}

// elasticOptions are an elastic scenario's settings.
type elasticOptions struct {
	lbOptions
	name    string
	workers int
	killAt  int // server-loss
	joinAt  int // server-join
}

// event is the iteration the scenario's server is killed or started in.
func (eo elasticOptions) event() int {
	if eo.name == scenarioServerLoss {
		return eo.killAt
	}
	return eo.joinAt
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

func (r elasticResult) row() []string {
	f := func(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }
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

// from is the iteration the event took effect from: the retry's or the
// joined server's first share.
func (r elasticResult) from() int {
	if r.Scenario == scenarioServerLoss {
		return r.RetryFrom
	}
	return r.ShareFrom
}

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
		var note string
		switch {
		case it == at && r.Scenario == scenarioServerLoss:
			note = "<- server killed"
		case it == at:
			note = noteStarted
		}
		if it == r.from() {
			note = map[string]string{scenarioServerLoss: noteRetried, scenarioServerJoin: noteShare}[r.Scenario]
		}
		x := r.ItersMs[it-1]
		rows = append(rows, []string{strconv.Itoa(it), fmt.Sprintf("%.1f", x), fmt.Sprintf("%.1f", bound),
			fmt.Sprintf("%.2f", x/bound), note})
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
	what := map[string]string{scenarioServerLoss: "killed", scenarioServerJoin: "started"}[r.Scenario]
	return svgplot.LineChart{
		Title:  fmt.Sprintf("%s: %d workers, %d servers at %s, LB on", r.Scenario, r.Workers, r.Servers, r.Rate),
		XLabel: "iteration", YLabel: "iteration time (ms)",
		Series: []svgplot.Series{
			{Name: "iteration time", X: xs(len(r.ItersMs)), Y: r.ItersMs},
			{Name: "bound", X: []float64{1, from, from, n}, Y: []float64{r.BoundBeforeMs, r.BoundBeforeMs, r.BoundAfterMs, r.BoundAfterMs},
				Dashed: true},
		},
		Marks: []svgplot.Mark{{X: float64(max(r.KillAt, r.JoinAt)), Label: "server " + what}, {X: from, Label: "in effect"}},
	}
}

// elasticLayout places the scenario's nodes: the LB scenarios'
// slow-server layout with workers workers (every link fast for
// server-loss), plus for server-join a fast host for the joiner, last.
func elasticLayout(name string, workers int, fast, slow netem.HostSpec) lbLayout {
	slowServer := 1
	if name == scenarioServerLoss {
		slowServer = -1
	}
	l := newLayout(elasticServers, workers, slowServer, -1, fast, slow)
	if name == scenarioServerJoin {
		l.hosts = append(l.hosts, fast)
		l.procHost[elasticJoiner] = len(l.hosts) - 1
	}
	return l
}

// elasticBounds are lb.Bound before the event and after it: without the
// victim's server (server-loss) or with the joiner's (server-join, a new
// id past the job's servers).
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
	}
	if after, err = lb.Bound(in); err != nil {
		return 0, 0, err
	}
	return before, after, nil
}

// elasticMain runs "fpt bench --scenario server-loss|server-join": in the
// parent the network, the run and the result; in a worker it starts, the
// trainer.
func elasticMain(f *flags) int {
	eo := elasticOptions{name: f.scen.name, workers: elasticDefaultWorkers, killAt: f.killAt, joinAt: f.joinAt}
	if f.set("workers") {
		eo.workers = f.goodput.workers
	}
	if eo.workers < 1 || eo.workers > elasticMaxWorkers {
		return usageError("--workers %d: want 1 to %d (one host each)", eo.workers, elasticMaxWorkers)
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
		flag := map[string]string{scenarioServerLoss: "--kill-at", scenarioServerJoin: "--join-at"}[eo.name]
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
	return writeWindowed(w, res, elasticHeader, jsonOut, plot, res.window)
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
	env := []string{childEnv + "=1", "DMLC_INTERFACE=" + net.Iface(), "FPT_LB=on"}
	er := elasticRun{label: eo.name, iters: eo.iters, workers: len(l.workerHosts)}
	if eo.name == scenarioServerLoss {
		env = append(env, "FPT_ON_SERVER_LOSS=retry")
		er.victim, er.killAt = failoverVictim, eo.killAt
		er.label = fmt.Sprintf("%s, %s killed in iteration %d", eo.name, failoverVictim, eo.killAt)
	} else {
		er.joinAt = eo.joinAt
		er.label = fmt.Sprintf("%s, %s started in iteration %d", eo.name, elasticJoiner, eo.joinAt)
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
	res.Exits, res.LostNode, res.RetryFrom, res.JoinedNode, res.ShareFrom = run.exits, run.lost, run.retryFrom, run.joined, run.joinFrom
	from := run.joinFrom
	if eo.name == scenarioServerLoss {
		from = run.retryFrom
		if from >= 1 && from <= len(run.report.IterMs) {
			res.RetriedIterMs = run.report.IterMs[from-1]
		}
	}
	if err := res.aggregate(run.report.IterMs, eo.event(), from, boundBefore, boundAfter); err != nil {
		return res, err
	}
	return res, net.Close()
}
