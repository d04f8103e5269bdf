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
	"github.com/fptps/fpt/svgplot"
	"github.com/fptps/fpt/worker"
)

// The failover scenario of "fpt bench --scenario failover": what losing a
// server costs a job under FPT_ON_SERVER_LOSS=retry. On loopback (no
// emulated network, no root), 2 servers and 2 workers run the simulated
// trainer twice: without a failure (the baseline), then with
// FPT_ON_SERVER_LOSS=retry and the process server1 killed with SIGKILL
// once worker rank 0 has verified iteration --kill-at minus one, so that
// the loss lands in iteration --kill-at. It prints the iteration times
// around the loss, side by side.
const scenarioFailover = "failover"

// Defaults of the failover scenario: a model of about 9 MB an iteration,
// tens of milliseconds on loopback.
const (
	failoverDefaultIters    = 60
	failoverDefaultKillAt   = 20
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
// and model (the LB scenarios' flags) and when the server is killed.
type failoverOptions struct {
	lbOptions
	killAt int
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
	// LostNode is the server the scheduler took out of the job, as its
	// log names it; RetryFrom the iteration its retry decision took
	// effect from (the first one pushed again).
	LostNode  string `json:"lost_node"`
	RetryFrom int    `json:"retry_from_iteration"`
	// The means are over iterations 2 to RetryFrom-1 (before: the first
	// is a warm-up) and RetryFrom+1 to the last (after), in both runs.
	BaselineBeforeMs float64 `json:"baseline_before_ms"`
	BaselineAfterMs  float64 `json:"baseline_after_ms"`
	RetryBeforeMs    float64 `json:"retry_before_ms"`
	RetryAfterMs     float64 `json:"retry_after_ms"`
	// BeforeRatio and AfterRatio are the retry run's means over the
	// baseline's; RetriedIterMs is the retried iteration's time and
	// RetriedRatio that over the baseline's mean before.
	BeforeRatio     float64   `json:"before_ratio"`
	AfterRatio      float64   `json:"after_ratio"`
	RetriedIterMs   float64   `json:"retried_iter_ms"`
	RetriedRatio    float64   `json:"retried_ratio"`
	BaselineItersMs []float64 `json:"baseline_iters_ms"`
	RetryItersMs    []float64 `json:"retry_iters_ms"`
}

// failoverHeader and row are the summary table without --json.
var failoverHeader = []string{"scenario", "workers", "servers", "iters", "lost", "retry from",
	"baseline before ms", "baseline after ms", "retry before ms", "retry after ms",
	"before ratio", "after ratio", "retried ms", "retried ratio"}

func (r failoverResult) row() []string {
	f := func(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }
	return []string{r.Scenario, strconv.Itoa(r.Workers), strconv.Itoa(r.Servers), strconv.Itoa(r.Iterations),
		r.LostNode, strconv.Itoa(r.RetryFrom), f(r.BaselineBeforeMs), f(r.BaselineAfterMs),
		f(r.RetryBeforeMs), f(r.RetryAfterMs), f(r.BeforeRatio), f(r.AfterRatio), f(r.RetriedIterMs), f(r.RetriedRatio)}
}

// window is the table of the iterations around the retried one: each
// run's time and their ratio.
func (r failoverResult) window() (header []string, rows [][]string) {
	header = []string{"iteration", "baseline ms", "retry ms", "retry/baseline", ""}
	first := max(1, r.RetryFrom-failoverBefore)
	last := min(r.Iterations, r.RetryFrom+failoverAfter, len(r.BaselineItersMs), len(r.RetryItersMs))
	for it := first; it <= last; it++ {
		b, x := r.BaselineItersMs[it-1], r.RetryItersMs[it-1]
		note := ""
		if it == r.RetryFrom {
			note = "<- server lost, retried"
		}
		ratio := "-"
		if b > 0 {
			ratio = fmt.Sprintf("%.2f", x/b)
		}
		rows = append(rows, []string{strconv.Itoa(it), fmt.Sprintf("%.1f", b), fmt.Sprintf("%.1f", x), ratio, note})
	}
	return header, rows
}

// aggregate fills in the means and ratios from both runs' iteration times
// and the iteration the retry took effect from.
func (r *failoverResult) aggregate(baseline, retry []float64, retryFrom int) error {
	switch {
	case len(baseline) != r.Iterations || len(retry) != r.Iterations:
		return fmt.Errorf("%d and %d iteration times, want %d", len(baseline), len(retry), r.Iterations)
	case retryFrom < 3 || retryFrom >= r.Iterations:
		// The means need an iteration before (past the warm-up) and after.
		return fmt.Errorf("the retry took effect from iteration %d: want 3 to %d for a time before and after it", retryFrom, r.Iterations-1)
	}
	r.RetryFrom, r.BaselineItersMs, r.RetryItersMs = retryFrom, baseline, retry
	before, after := func(xs []float64) float64 { return round3(mean(xs[1 : retryFrom-1])) },
		func(xs []float64) float64 { return round3(mean(xs[retryFrom:])) }
	r.BaselineBeforeMs, r.BaselineAfterMs = before(baseline), after(baseline)
	r.RetryBeforeMs, r.RetryAfterMs = before(retry), after(retry)
	r.RetriedIterMs = retry[retryFrom-1]
	if r.BaselineBeforeMs <= 0 || r.BaselineAfterMs <= 0 {
		return fmt.Errorf("non-positive baseline times %v and %v ms", r.BaselineBeforeMs, r.BaselineAfterMs)
	}
	r.BeforeRatio = round3(r.RetryBeforeMs / r.BaselineBeforeMs)
	r.AfterRatio = round3(r.RetryAfterMs / r.BaselineAfterMs)
	r.RetriedRatio = round3(r.RetriedIterMs / r.BaselineBeforeMs)
	return nil
}

// chart is both runs' iteration times, the loss marked where the retry
// took effect.
func (r failoverResult) chart() svgplot.LineChart {
	return svgplot.LineChart{
		Title:  fmt.Sprintf("failover: %d workers, %d servers, %s killed (FPT_ON_SERVER_LOSS=retry)", r.Workers, r.Servers, r.LostNode),
		XLabel: "iteration", YLabel: "iteration time (ms)",
		Series: []svgplot.Series{
			{Name: "no failure", X: xs(len(r.BaselineItersMs)), Y: r.BaselineItersMs},
			{Name: "server lost, retry", X: xs(len(r.RetryItersMs)), Y: r.RetryItersMs},
		},
		Marks: []svgplot.Mark{{X: float64(r.RetryFrom), Label: "loss, retry"}},
	}
}

// membershipRe matches the scheduler's log line for a server that left
// the job under FPT_ON_SERVER_LOSS=retry.
var membershipRe = regexp.MustCompile(`msg="membership change: server left[^"]*".*? node=(\S+).*? retry_from_iteration=(\d+)`)

// parseLoss reads the lost server and the retry's first iteration from a
// scheduler's log.
func parseLoss(log string) (node string, retryFrom int, err error) {
	m := membershipRe.FindStringSubmatch(log)
	if m == nil {
		return "", 0, errors.New(`the scheduler logged no "membership change: server left"`)
	}
	retryFrom, err = strconv.Atoi(m[2])
	return m[1], retryFrom, err
}

// failoverMain runs "fpt bench --scenario failover": in the parent both
// runs and the result; in a worker it starts, the trainer.
func failoverMain(f *flags) int {
	fo := failoverOptions{lbOptions: f.lbs, killAt: f.killAt}
	fo.iters, fo.partitionBytes = failoverDefaultIters, f.goodput.partitionBytes
	if f.set("iters") {
		fo.iters = f.goodput.iters
	}
	if !f.set("max-bytes") {
		fo.maxBytes = failoverDefaultMaxBytes
	}
	if fo.killAt < 3 || fo.killAt > fo.iters-2 {
		return usageError("--kill-at %d, --iters %d: want 3 <= kill-at <= iters-2 (iterations before and after the loss)", fo.killAt, fo.iters)
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

// writeFailover prints res: the iterations around the loss and the
// summary as tables, or one JSON line; and draws it with plot set.
func writeFailover(w io.Writer, res failoverResult, jsonOut bool, plot string) error {
	if !jsonOut {
		header, rows := res.window()
		if err := writeTable(w, header, rows); err != nil {
			return err
		}
		if _, err := fmt.Fprintln(w); err != nil {
			return err
		}
	}
	results := resultWriter{w: w, jsonOut: jsonOut, header: failoverHeader, plot: plot}
	if err := results.add(res); err != nil {
		return err
	}
	return results.flush()
}

// runFailover runs the baseline, then the run that loses a server, and
// aggregates them. self is the fpt binary (the cluster's every process).
func runFailover(ctx context.Context, self string, fo failoverOptions, p *progress) (failoverResult, error) {
	res := failoverResult{Scenario: scenarioFailover, Servers: failoverServers, Workers: failoverWorkers,
		Tensors: fo.tensors, Iterations: fo.iters, KillAt: fo.killAt}
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
	res.LostNode = retry.lost
	return res, res.aggregate(baseline.report.IterMs, retry.report.IterMs, retry.retryFrom)
}

// failoverRun is what one run of the scenario's cluster gave.
type failoverRun struct {
	report    lbWorkerReport
	lost      string // the lost server, as the scheduler names it
	retryFrom int
}

// runFailoverCluster runs the scenario's cluster on loopback once; with
// kill, under FPT_ON_SERVER_LOSS=retry, and kills failoverVictim once
// worker rank 0 has verified iteration killAt-1.
func runFailoverCluster(ctx context.Context, self string, fo failoverOptions, kill bool, p *progress) (failoverRun, error) {
	args := []string{self, "bench", "--scenario", scenarioFailover, "--iters", strconv.Itoa(fo.iters),
		"--kill-at", strconv.Itoa(fo.killAt), "--tensors", strconv.Itoa(fo.tensors),
		"--min-bytes", strconv.Itoa(fo.minBytes), "--max-bytes", strconv.Itoa(fo.maxBytes)}
	env := []string{childEnv + "=1"}
	run := "failover, no failure"
	if kill {
		env = append(env, "FPT_ON_SERVER_LOSS=retry")
		run = fmt.Sprintf("failover, %s killed at iteration %d", failoverVictim, fo.killAt)
	}
	if fo.partitionBytes > 0 {
		env = append(env, "FPT_PARTITION_BYTES="+strconv.FormatInt(fo.partitionBytes, 10))
	}
	// Worker rank 0 writes a progress line per verified iteration: the
	// one before killAt is the signal.
	trigger := progressMark + fmt.Sprintf("worker 0: iteration %d/", fo.killAt-1)
	reached := make(chan struct{})
	var once sync.Once
	p.printf(run, "cluster starting")
	c, err := localcluster.Start(localcluster.Spec{
		Servers: failoverServers, Workers: failoverWorkers,
		Scheduler: []string{self}, Server: []string{self}, Worker: args, Env: env,
		Stderr: func(proc string) io.Writer {
			if !strings.HasPrefix(proc, "worker") {
				return nil
			}
			watch := &lineWriter{line: func(l string) {
				if strings.HasPrefix(l, trigger) {
					once.Do(func() { close(reached) })
				}
			}}
			return io.MultiWriter(p.relay(run), watch)
		},
	})
	if err != nil {
		return failoverRun{}, err
	}
	defer c.Kill()
	var victim *localcluster.Proc
	if kill {
		victim = c.Proc(failoverVictim)
		select {
		case <-reached:
		case <-anyExited(c):
			// Let the wait below say which one and why.
		case <-ctx.Done():
			return failoverRun{}, errors.New("interrupted")
		}
		if err := victim.Kill(); err != nil {
			return failoverRun{}, fmt.Errorf("kill %s: %w", failoverVictim, err)
		}
		p.printf(run, "killed %s", failoverVictim)
	}
	if err := waitSurvivors(ctx, c, victim, 10*time.Minute); err != nil {
		return failoverRun{}, err
	}
	rep, err := rank0Report(c, failoverWorkers)
	if err != nil {
		return failoverRun{}, err
	}
	if len(rep.IterMs) != fo.iters {
		return failoverRun{}, fmt.Errorf("worker 0 reported %d iterations, want %d", len(rep.IterMs), fo.iters)
	}
	r := failoverRun{report: rep}
	if kill {
		if r.lost, r.retryFrom, err = parseLoss(c.Proc("scheduler").Stderr.String()); err != nil {
			return r, err
		}
	}
	return r, nil
}

// anyExited is closed once some process of c has exited.
func anyExited(c *localcluster.Cluster) <-chan struct{} {
	ch := make(chan struct{})
	var once sync.Once
	for _, p := range c.Procs {
		go func() {
			<-p.Done()
			once.Do(func() { close(ch) })
		}()
	}
	return ch
}
