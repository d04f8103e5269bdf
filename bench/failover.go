package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fptps/fpt/internal/localcluster"
	"github.com/fptps/fpt/launch"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/scheduler"
	"github.com/fptps/fpt/svgplot"
	"github.com/fptps/fpt/worker"
)

// The failover scenario of "fpt bench --scenario failover": what losing a
// server, and a new one joining, cost a job under
// FPT_ON_SERVER_LOSS=retry. On loopback (no emulated network, no root), 2
// servers and 2 workers run the simulated trainer twice: without a
// failure (the baseline), then with FPT_ON_SERVER_LOSS=retry, the process
// server1 killed with SIGKILL once worker rank 0 has verified iteration
// --kill-at minus one, so that the loss lands in iteration --kill-at, and
// a new server process (server2) started with the job's environment once
// the loss is done and worker rank 0 has verified iteration --join-at
// minus one. It prints the iteration times around the loss and around the
// join, side by side.
const scenarioFailover = "failover"

// Defaults of the failover scenario: a model of about 9 MB an iteration,
// tens of milliseconds on loopback.
const (
	failoverDefaultIters  = 60
	failoverDefaultKillAt = 20
	// failoverDefaultJoinAfter is --join-at's default distance from
	// --kill-at.
	failoverDefaultJoinAfter = 15
	// failoverJoinTail is how many iterations at least follow --join-at:
	// with the LB on, the joined server's share comes with a probe that
	// starts past the iterations already granted (lb's lookahead), and
	// the mean after it needs some.
	failoverJoinTail        = 10
	failoverDefaultMaxBytes = 4 << 20
	failoverServers         = 2
	failoverWorkers         = 2
	// failoverVictim is the process killed (a process name, not a rank:
	// the scheduler's log names the rank it had).
	failoverVictim = "server1"
)

// failoverBefore and failoverAfter are how many iterations before and
// after the retried one the table shows.
const failoverBefore, failoverAfter = 3, 10

// failoverOptions are the failover scenario's settings: the iterations
// and model (the LB scenarios' flags), when the server is killed and when
// the new one is started.
type failoverOptions struct {
	lbOptions
	killAt, joinAt int
}

// failoverResult is the failover scenario's result. Times are
// milliseconds of worker rank 0's communication per iteration (first push
// to last pull, as the trainer measures them).
type failoverResult struct {
	Scenario   string `json:"scenario"`
	Servers    int    `json:"servers"`
	Workers    int    `json:"workers"`
	Tensors    int    `json:"tensors"`
	ModelBytes int64  `json:"model_bytes"`
	Iterations int    `json:"iterations"`
	KillAt     int    `json:"kill_at"`
	JoinAt     int    `json:"join_at"`
	// LostNode is the server the scheduler took out of the job, as its
	// log names it; RetryFrom the iteration its retry decision took
	// effect from (the first one pushed again).
	LostNode  string `json:"lost_node"`
	RetryFrom int    `json:"retry_from_iteration"`
	// JoinedNode is the server the scheduler admitted into the running
	// job, as its log names it; JoinFrom the first iteration an LB
	// decision gave it a share of (with the LB on, a probe's).
	JoinedNode string `json:"joined_node"`
	JoinFrom   int    `json:"join_from_iteration"`
	// The means are over iterations 2 to RetryFrom-1 (before: the first
	// is a warm-up), RetryFrom+1 to JoinFrom-1 (after the loss) and
	// JoinFrom+1 to the last (joined), in both runs.
	BaselineBeforeMs float64 `json:"baseline_before_ms"`
	BaselineAfterMs  float64 `json:"baseline_after_ms"`
	BaselineJoinedMs float64 `json:"baseline_joined_ms"`
	RetryBeforeMs    float64 `json:"retry_before_ms"`
	RetryAfterMs     float64 `json:"retry_after_ms"`
	RetryJoinedMs    float64 `json:"retry_joined_ms"`
	// BeforeRatio, AfterRatio and JoinedRatio are the retry run's means
	// over the baseline's; RetriedIterMs is the retried iteration's time
	// and RetriedRatio that over the baseline's mean before.
	BeforeRatio     float64   `json:"before_ratio"`
	AfterRatio      float64   `json:"after_ratio"`
	JoinedRatio     float64   `json:"joined_ratio"`
	RetriedIterMs   float64   `json:"retried_iter_ms"`
	RetriedRatio    float64   `json:"retried_ratio"`
	BaselineItersMs []float64 `json:"baseline_iters_ms"`
	RetryItersMs    []float64 `json:"retry_iters_ms"`
}

// failoverHeader and row are the summary table without --json.
var failoverHeader = []string{"scenario", "workers", "servers", "iters", "lost", "retry from", "joined", "share from",
	"baseline before ms", "baseline after ms", "baseline joined ms", "retry before ms", "retry after ms", "retry joined ms",
	"before ratio", "after ratio", "joined ratio", "retried ms", "retried ratio"}

func (r failoverResult) row() []string {
	f := func(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }
	return []string{r.Scenario, strconv.Itoa(r.Workers), strconv.Itoa(r.Servers), strconv.Itoa(r.Iterations),
		r.LostNode, strconv.Itoa(r.RetryFrom), r.JoinedNode, strconv.Itoa(r.JoinFrom),
		f(r.BaselineBeforeMs), f(r.BaselineAfterMs), f(r.BaselineJoinedMs), f(r.RetryBeforeMs), f(r.RetryAfterMs), f(r.RetryJoinedMs),
		f(r.BeforeRatio), f(r.AfterRatio), f(r.JoinedRatio), f(r.RetriedIterMs), f(r.RetriedRatio)}
}

// Notes of the windows' rows.
const (
	noteRetried = "<- server lost, retried"
	noteStarted = "<- new server started"
	noteShare   = "<- joined server's first share"
)

// lossWindow and joinWindow are the tables of the iterations around the
// retried one and around the join (from the one the new server was
// started in to the first the LB gave it a share of): each run's time
// and their ratio.
func (r failoverResult) lossWindow() (header []string, rows [][]string) {
	return r.window(r.RetryFrom, r.RetryFrom)
}

func (r failoverResult) joinWindow() (header []string, rows [][]string) {
	return r.window(min(r.JoinAt, r.JoinFrom), r.JoinFrom)
}

// window is the table from failoverBefore iterations before from to
// failoverAfter after to, within the run.
func (r failoverResult) window(from, to int) (header []string, rows [][]string) {
	header = []string{"iteration", "baseline ms", "retry ms", "retry/baseline", ""}
	first := max(1, from-failoverBefore)
	last := min(r.Iterations, to+failoverAfter, len(r.BaselineItersMs), len(r.RetryItersMs))
	for it := first; it <= last; it++ {
		b, x := r.BaselineItersMs[it-1], r.RetryItersMs[it-1]
		var notes []string
		for _, n := range []struct {
			at   int
			note string
		}{{r.RetryFrom, noteRetried}, {r.JoinAt, noteStarted}, {r.JoinFrom, noteShare}} {
			if it == n.at {
				notes = append(notes, n.note)
			}
		}
		note := strings.Join(notes, " ")
		ratio := "-"
		if b > 0 {
			ratio = fmt.Sprintf("%.2f", x/b)
		}
		rows = append(rows, []string{strconv.Itoa(it), fmt.Sprintf("%.1f", b), fmt.Sprintf("%.1f", x), ratio, note})
	}
	return header, rows
}

// aggregate fills in the means and ratios from both runs' iteration times,
// the iteration the retry took effect from and the first the joined
// server had a share of.
func (r *failoverResult) aggregate(baseline, retry []float64, retryFrom, joinFrom int) error {
	switch {
	case len(baseline) != r.Iterations || len(retry) != r.Iterations:
		return fmt.Errorf("%d and %d iteration times, want %d", len(baseline), len(retry), r.Iterations)
	case retryFrom < 3:
		// The means need an iteration before the loss, past the warm-up.
		return fmt.Errorf("the retry took effect from iteration %d: want 3 or later for a time before it", retryFrom)
	case joinFrom < retryFrom+2 || joinFrom >= r.Iterations:
		// And one between the loss and the join, and one after the join.
		return fmt.Errorf("the retry took effect from iteration %d and the joined server's share from %d: want the share from %d to %d for times between them and after it (raise --iters or move --join-at)",
			retryFrom, joinFrom, retryFrom+2, r.Iterations-1)
	}
	r.RetryFrom, r.JoinFrom, r.BaselineItersMs, r.RetryItersMs = retryFrom, joinFrom, baseline, retry
	// Iteration i is xs[i-1].
	before, after, joined := func(xs []float64) float64 { return round3(mean(xs[1 : retryFrom-1])) },
		func(xs []float64) float64 { return round3(mean(xs[retryFrom : joinFrom-1])) },
		func(xs []float64) float64 { return round3(mean(xs[joinFrom:])) }
	r.BaselineBeforeMs, r.BaselineAfterMs, r.BaselineJoinedMs = before(baseline), after(baseline), joined(baseline)
	r.RetryBeforeMs, r.RetryAfterMs, r.RetryJoinedMs = before(retry), after(retry), joined(retry)
	r.RetriedIterMs = retry[retryFrom-1]
	if r.BaselineBeforeMs <= 0 || r.BaselineAfterMs <= 0 || r.BaselineJoinedMs <= 0 {
		return fmt.Errorf("non-positive baseline times %v, %v and %v ms", r.BaselineBeforeMs, r.BaselineAfterMs, r.BaselineJoinedMs)
	}
	r.BeforeRatio = round3(r.RetryBeforeMs / r.BaselineBeforeMs)
	r.AfterRatio = round3(r.RetryAfterMs / r.BaselineAfterMs)
	r.JoinedRatio = round3(r.RetryJoinedMs / r.BaselineJoinedMs)
	r.RetriedRatio = round3(r.RetriedIterMs / r.BaselineBeforeMs)
	return nil
}

// chart is both runs' iteration times, the loss marked where the retry
// took effect and the join where the joined server's share did.
func (r failoverResult) chart() svgplot.LineChart {
	marks := []svgplot.Mark{{X: float64(r.RetryFrom), Label: "loss, retry"}}
	if r.JoinFrom > 0 {
		marks = append(marks, svgplot.Mark{X: float64(r.JoinFrom), Label: "join, share"})
	}
	return svgplot.LineChart{
		// Nodes without their addresses, to fit the title in the chart.
		Title: fmt.Sprintf("failover: %d workers, %d servers, %s killed, %s joined (FPT_ON_SERVER_LOSS=retry)", r.Workers, r.Servers,
			strings.Split(r.LostNode, "@")[0], strings.Split(r.JoinedNode, "@")[0]),
		XLabel: "iteration", YLabel: "iteration time (ms)",
		Series: []svgplot.Series{
			{Name: "no failure", X: xs(len(r.BaselineItersMs)), Y: r.BaselineItersMs},
			{Name: "server lost, then one joined", X: xs(len(r.RetryItersMs)), Y: r.RetryItersMs},
		},
		Marks: marks,
	}
}

// parseLoss reads the lost node of role (a server or a worker) and the
// iteration the workers left push again from (a server's retry, the
// sums over the workers left) from a scheduler's log.
func parseLoss(log string, role node.Role) (lost string, retryFrom int, err error) {
	m, ok := membershipIn(log, role, false)
	if !ok {
		return "", 0, fmt.Errorf(`the scheduler logged no "membership change: %s left"`, role)
	}
	return m.Node, int(m.RetryFrom), nil
}

// membershipIn is the first membership change of a node of role, of the
// kind joined, in a scheduler's log.
func membershipIn(log string, role node.Role, joined bool) (scheduler.Membership, bool) {
	for line := range strings.SplitSeq(log, "\n") {
		if m, ok := scheduler.ParseMembershipLine(line); ok && m.Role == role && m.Joined == joined {
			return m, true
		}
	}
	return scheduler.Membership{}, false
}

// parseWorkerJoin reads the joined worker and the first iteration whose
// sums count it from a scheduler's log.
func parseWorkerJoin(log string) (joined string, from int, err error) {
	m, ok := membershipIn(log, node.Worker, true)
	if !ok {
		return "", 0, errors.New(`the scheduler logged no "membership change: worker joined"`)
	}
	return m.Node, int(m.From), nil
}

// shareRe matches an aggregator and its share in a decision line
// (scheduler.DecisionLine).
var shareRe = regexp.MustCompile(`(\S+\(\d+\)) (\d+(?:\.\d+)?)%`)

// parseJoin reads the joined server from a scheduler's log (stderr) and
// the first iteration an LB decision gave it a share of from its decision
// lines (stdout). The joined server's id is new to the job, so any
// decision naming it came after the join.
func parseJoin(log, decisions string) (joined string, from int, err error) {
	m, ok := membershipIn(log, node.Server, true)
	if !ok {
		return "", 0, errors.New(`the scheduler logged no "membership change: server joined"`)
	}
	name, _, _ := strings.Cut(m.Node, "@")
	for _, line := range strings.Split(decisions, "\n") {
		_, it, ok := scheduler.ParseDecisionLine(line)
		if !ok {
			continue
		}
		for _, s := range shareRe.FindAllStringSubmatch(line, -1) {
			if share, _ := strconv.ParseFloat(s[2], 64); s[1] == name && share > 0 {
				return m.Node, int(it), nil
			}
		}
	}
	return m.Node, 0, fmt.Errorf("no LB decision gave the joined server %s a share within the run (raise --iters or lower --join-at)", m.Node)
}

// failoverMain runs "fpt bench --scenario failover": in the parent both
// runs and the result; in a worker it starts, the trainer.
func failoverMain(f *flags) int {
	fo := failoverOptions{lbOptions: f.lbs, killAt: f.killAt, joinAt: f.joinAt}
	fo.iters, fo.partitionBytes = failoverDefaultIters, f.goodput.partitionBytes
	if f.set("iters") {
		fo.iters = f.goodput.iters
	}
	if !f.set("max-bytes") {
		fo.maxBytes = failoverDefaultMaxBytes
	}
	if !f.set("join-at") {
		fo.joinAt = min(fo.killAt+failoverDefaultJoinAfter, fo.iters-failoverJoinTail)
	}
	if fo.killAt < 3 || fo.killAt > fo.iters-failoverJoinTail-2 {
		return usageError("--kill-at %d, --iters %d: want 3 <= kill-at <= iters-%d (iterations before the loss, and after it before and after a join)",
			fo.killAt, fo.iters, failoverJoinTail+2)
	}
	if fo.joinAt < fo.killAt+2 || fo.joinAt > fo.iters-failoverJoinTail {
		return usageError("--join-at %d, --kill-at %d, --iters %d: want kill-at+2 <= join-at <= iters-%d (iterations between the loss and the join, and after the join)",
			fo.joinAt, fo.killAt, fo.iters, failoverJoinTail)
	}
	if err := fo.trainerOptions().Validate(); err != nil {
		return usageError("%v", err)
	}
	if isChild() {
		return runWorker(func(ctx context.Context, w *worker.Worker) error {
			return lbWorker(ctx, w, fo.lbOptions, os.Stdout, os.Stderr)
		})
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	self, err := os.Executable()
	if err != nil {
		return failed(scenarioFailover, err)
	}
	res, err := runFailover(ctx, self, fo, newProgress(os.Stderr))
	if err != nil {
		return failed(scenarioFailover, err)
	}
	if err := writeFailover(os.Stdout, res, f.goodput.jsonOut, f.plot); err != nil {
		return failed("table", err)
	}
	return launch.ExitOK
}

// writeFailover prints res: the iterations around the loss, those around
// the join and the summary as tables, or one JSON line; and draws it with
// plot set.
func writeFailover(w io.Writer, res failoverResult, jsonOut bool, plot string) error {
	return writeWindowed(w, res, failoverHeader, jsonOut, plot, res.lossWindow, res.joinWindow)
}

// writeWindowed prints one result of a run around its events: without
// jsonOut, each window (a table of iterations) then the summary table
// under header; with it, one JSON line. It draws the result with plot
// set.
func writeWindowed(w io.Writer, res tableRow, header []string, jsonOut bool, plot string, windows ...func() ([]string, [][]string)) error {
	if !jsonOut {
		for _, window := range windows {
			cols, rows := window()
			if err := writeTable(w, cols, rows); err != nil {
				return err
			}
			if _, err := fmt.Fprintln(w); err != nil {
				return err
			}
		}
	}
	results := resultWriter{w: w, jsonOut: jsonOut, header: header, plot: plot}
	if err := results.add(res); err != nil {
		return err
	}
	return results.flush()
}

// runFailover runs the baseline, then the run that loses a server and
// has one join, and aggregates them. self is the fpt binary (the cluster's every process).
func runFailover(ctx context.Context, self string, fo failoverOptions, p *progress) (failoverResult, error) {
	res := failoverResult{Scenario: scenarioFailover, Servers: failoverServers, Workers: failoverWorkers,
		Tensors: fo.tensors, Iterations: fo.iters, KillAt: fo.killAt, JoinAt: fo.joinAt}
	for _, n := range fo.trainerOptions().Sizes() {
		res.ModelBytes += int64(n) * 4
	}
	baseline, err := runFailoverCluster(ctx, self, fo, false, p)
	if err != nil {
		return res, fmt.Errorf("baseline: %w", err)
	}
	retry, err := runFailoverCluster(ctx, self, fo, true, p)
	if err != nil {
		return res, fmt.Errorf("server lost: %w", err)
	}
	for _, r := range []lbWorkerReport{baseline.report, retry.report} {
		if r.ModelBytes != res.ModelBytes {
			return res, fmt.Errorf("worker 0 trained %d bytes per iteration, want %d", r.ModelBytes, res.ModelBytes)
		}
	}
	res.LostNode, res.JoinedNode = retry.lost, retry.joined
	return res, res.aggregate(baseline.report.IterMs, retry.report.IterMs, retry.retryFrom, retry.joinFrom)
}

// failoverRun is what one run of an elastic cluster gave.
type failoverRun struct {
	report    lbWorkerReport
	lost      string // the lost node, as the scheduler names it
	retryFrom int
	joined    string // the joined node, as the scheduler names it
	// joinFrom is, for a joined server, the first iteration an LB
	// decision gave it a share of; for a joined worker, the first whose
	// sums count it.
	joinFrom int
	// leftAt and joinedAt are when the bench saw the scheduler's lines
	// for the loss and for the join (zero: not seen).
	leftAt, joinedAt time.Time
	exits            map[string]int    // every process's exit status (-1: killed)
	stderr           map[string]string // every process's stderr, as it left it
}

// elasticRun is one run of a cluster that loses a node, has one join, or
// both: the failover scenario's on loopback and the server-loss,
// server-join and worker-wait scenarios' in an emulated network.
type elasticRun struct {
	// spec is the cluster; runElastic sets its Stderr.
	spec    localcluster.Spec
	label   string // the run's name in progress lines
	iters   int
	workers int
	// victim is the process killed (SIGKILL) once worker rank 0 has
	// verified iteration killAt-1; "" kills none. Its role is its
	// name's, as localcluster names processes ("server1", "worker2").
	victim string
	killAt int
	// joiner is the role of a process started to join the running job
	// ("server" or "worker"; "" starts none): once worker rank 0 has
	// verified iteration joinAt-1 (and the scheduler has taken the victim
	// out, if there is one), or with joinAt 0, as soon as the scheduler
	// has taken the victim out.
	joiner string
	joinAt int
}

// runFailoverCluster runs the failover scenario's cluster on loopback
// once; with kill, under FPT_ON_SERVER_LOSS=retry, failoverVictim killed
// in iteration killAt and a new server started in iteration joinAt.
func runFailoverCluster(ctx context.Context, self string, fo failoverOptions, kill bool, p *progress) (failoverRun, error) {
	args := []string{self, "bench", "--scenario", scenarioFailover, "--iters", strconv.Itoa(fo.iters),
		"--kill-at", strconv.Itoa(fo.killAt), "--join-at", strconv.Itoa(fo.joinAt), "--tensors", strconv.Itoa(fo.tensors),
		"--min-bytes", strconv.Itoa(fo.minBytes), "--max-bytes", strconv.Itoa(fo.maxBytes), "--compute", fo.compute.String()}
	// PS_VERBOSE=1: the scheduler writes every LB decision, the probe that
	// first gives the joined server a share too (parseJoin).
	env := []string{childEnv + "=1", "PS_VERBOSE=1"}
	er := elasticRun{label: "failover, no failure", iters: fo.iters, workers: failoverWorkers}
	if kill {
		env = append(env, "FPT_ON_SERVER_LOSS=retry")
		er.label = fmt.Sprintf("failover, %s killed at iteration %d, a server joins at %d", failoverVictim, fo.killAt, fo.joinAt)
		er.victim, er.killAt, er.joiner, er.joinAt = failoverVictim, fo.killAt, "server", fo.joinAt
	}
	if fo.partitionBytes > 0 {
		env = append(env, "FPT_PARTITION_BYTES="+strconv.FormatInt(fo.partitionBytes, 10))
	}
	er.spec = localcluster.Spec{Servers: failoverServers, Workers: failoverWorkers,
		Scheduler: []string{self}, Server: []string{self}, Worker: args, Env: env}
	return runElastic(ctx, er, p)
}

// runElastic runs er's cluster to its end: it kills the victim and
// starts the joiner when worker rank 0's progress lines and the
// scheduler's log say so, then reads worker rank 0's report and, from the
// scheduler's log, the loss and the join.
func runElastic(ctx context.Context, er elasticRun, p *progress) (failoverRun, error) {
	victimRole, err := node.ParseRole(strings.TrimRight(er.victim, "0123456789"))
	if err != nil && er.victim != "" {
		return failoverRun{}, fmt.Errorf("victim %q: %w", er.victim, err)
	}
	joinerRole, err := node.ParseRole(er.joiner)
	if err != nil && er.joiner != "" {
		return failoverRun{}, fmt.Errorf("joiner: %w", err)
	}
	// Worker rank 0 writes a progress line per verified iteration: the
	// ones before killAt and joinAt are the signals; the scheduler's
	// lines for the loss, that the join may follow, and for the join.
	killAt, joinAt := newSignal(progressMark+fmt.Sprintf("worker 0: iteration %d/", er.killAt-1)),
		newSignal(progressMark+fmt.Sprintf("worker 0: iteration %d/", er.joinAt-1))
	left, joined := newSignal(`msg="membership change: `+victimRole.String()+` left`),
		newSignal(`msg="membership change: `+joinerRole.String()+` joined`)
	p.printf(er.label, "cluster starting")
	er.spec.Stderr = func(proc string) io.Writer {
		switch {
		case proc == "scheduler":
			return &lineWriter{line: func(l string) { left.watch(l); joined.watch(l) }}
		case strings.HasPrefix(proc, "worker"):
			return io.MultiWriter(p.relay(er.label), &lineWriter{line: func(l string) { killAt.watch(l); joinAt.watch(l) }})
		}
		return nil
	}
	c, err := localcluster.Start(er.spec)
	if err != nil {
		return failoverRun{}, err
	}
	defer c.Kill()
	var victim *localcluster.Proc
	seen := true
	if er.victim != "" {
		if victim = c.Proc(er.victim); victim == nil {
			return failoverRun{}, fmt.Errorf("no process %s to kill", er.victim)
		}
		if seen, err = awaitSignals(ctx, c, nil, killAt); err != nil {
			return failoverRun{}, err
		}
		if seen {
			if err := victim.Kill(); err != nil {
				return failoverRun{}, fmt.Errorf("kill %s: %w", er.victim, err)
			}
			p.printf(er.label, "killed %s", er.victim)
			seen, err = awaitSignals(ctx, c, victim, left)
			if err != nil {
				return failoverRun{}, err
			}
		}
	}
	if er.joiner != "" && seen {
		if er.joinAt > 0 {
			if seen, err = awaitSignals(ctx, c, victim, joinAt); err != nil {
				return failoverRun{}, err
			}
		}
		if seen {
			proc, err := c.Add(er.joiner)
			if err != nil {
				return failoverRun{}, err
			}
			p.printf(er.label, "started %s", proc.Name)
		}
	}
	if err := waitSurvivors(ctx, c, victim, 10*time.Minute); err != nil {
		return failoverRun{}, err
	}
	rep, err := rank0Report(c, er.workers)
	if err != nil {
		return failoverRun{}, err
	}
	if len(rep.IterMs) != er.iters {
		return failoverRun{}, fmt.Errorf("worker 0 reported %d iterations, want %d", len(rep.IterMs), er.iters)
	}
	r := failoverRun{report: rep, exits: map[string]int{}, stderr: map[string]string{},
		leftAt: left.seenAt(), joinedAt: joined.seenAt()}
	for _, proc := range c.Procs {
		r.exits[proc.Name], r.stderr[proc.Name] = proc.ExitCode(), proc.Stderr.String()
	}
	sched := c.Proc("scheduler")
	if er.victim != "" {
		if r.lost, r.retryFrom, err = parseLoss(sched.Stderr.String(), victimRole); err != nil {
			return r, err
		}
	}
	switch joinerRole {
	case node.Server:
		r.joined, r.joinFrom, err = parseJoin(sched.Stderr.String(), sched.Stdout.String())
	case node.Worker:
		r.joined, r.joinFrom, err = parseWorkerJoin(sched.Stderr.String())
	}
	return r, err
}

// logSignal is a channel closed once a line containing substr has been
// seen, and when.
type logSignal struct {
	substr string
	ch     chan struct{}
	once   sync.Once
	at     time.Time // set before ch is closed
}

func newSignal(substr string) *logSignal { return &logSignal{substr: substr, ch: make(chan struct{})} }

// watch is a lineWriter's line function, or part of one.
func (s *logSignal) watch(line string) {
	if strings.Contains(line, s.substr) {
		s.once.Do(func() {
			s.at = time.Now()
			close(s.ch)
		})
	}
}

// seenAt is when the line was seen; zero if it was not.
func (s *logSignal) seenAt() time.Time {
	select {
	case <-s.ch:
		return s.at
	default:
		return time.Time{}
	}
}

// awaitSignals waits for every signal and reports whether all came. It
// returns false early once a process of c other than lost has exited
// (the caller's wait for the cluster then says which one and why), and
// an error if ctx ends.
func awaitSignals(ctx context.Context, c *localcluster.Cluster, lost *localcluster.Proc, signals ...*logSignal) (bool, error) {
	exited := anyExited(c, lost)
	for _, s := range signals {
		select {
		case <-s.ch:
		case <-exited:
			return false, nil
		case <-ctx.Done():
			return false, errors.New("interrupted")
		}
	}
	return true, nil
}

// anyExited is closed once some process of c other than lost has exited.
func anyExited(c *localcluster.Cluster, lost *localcluster.Proc) <-chan struct{} {
	ch := make(chan struct{})
	var once sync.Once
	for _, p := range c.Procs {
		if p == lost {
			continue
		}
		go func() {
			<-p.Done()
			once.Do(func() { close(ch) })
		}()
	}
	return ch
}
