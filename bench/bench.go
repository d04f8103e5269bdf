// Package bench holds the experiments of "fpt bench": the goodput and CPU
// cost of push and pull on loopback against raw TCP (goodput.go), the
// CPU-per-peer table, and the scenarios that run a cluster in an emulated
// network (package netem): flow shaping and priority (scenario.go) and the
// load balancer against its bound (lbscenario.go), a server lost or joined
// and a worker replaced there (netfailover.go), and a server lost and
// joined on loopback (failover.go).
//
// Each experiment starts its cluster with internal/localcluster from the
// same binary ("fpt bench" re-runs itself as the cluster's workers, marked
// by childEnv). Results go to stdout, one JSON object per line with --json,
// else a table; progress goes to stderr while a run lasts.
package bench

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/internal/localcluster"
	"github.com/fptps/fpt/launch"
	"github.com/fptps/fpt/netem"
	"github.com/fptps/fpt/worker"
)

// childEnv marks a process that "fpt bench" started as one of its
// cluster's workers.
const childEnv = "FPT_BENCH_CHILD"

// isChild tells whether this process is a bench cluster's worker.
func isChild() bool { return os.Getenv(childEnv) != "" }

// runWorker runs this process as a worker of the bench's cluster, body
// being the experiment's side of it.
func runWorker(body func(ctx context.Context, w *worker.Worker) error) int {
	return launch.Main("fpt bench", os.LookupEnv, os.Stderr, body)
}

const usageText = `usage: fpt bench [flags]

Runs a cluster on loopback (separate processes), pushes and pulls one tensor, and
reports goodput (bytes pushed plus pulled by one worker per second) against raw TCP
moving the same bytes both ways at once between two Go sockets, measured in the same
run; the bytes that crossed TCP (the van's counters, frame headers included); and the
CPU cost: user+sys seconds of every process of the cluster per GB of tensor pushed and
pulled, next to raw TCP's. The default run is 1 worker x 1 server and 2 workers x
2 servers with the LB off, and 2 x 2 with it on; --workers, --servers and --lb run one
configuration instead, --peers a table of W workers x W servers (LB off) for each W.

With --scenario, runs a cluster in an emulated network (network namespaces, tbf) instead:
  shaping   one worker behind a --rate link queues --iters tensors (default 6 of 16 MiB)
            for two servers with flow weights --weights; byte ratio is what the servers
            received while both flows were backlogged (unshaped ratio: the same run with
            shaping off)
  priority  a low- and a high-priority tensor (default 16 MiB) pushed together; when each
            sum arrived, next to the same push with equal priorities; medians over --iters
            rounds (default 3)
  slow-server, equal, slow-worker
            the simulated trainer with the load balancer off (FPT_LB=off, even split over
            the servers) and on: even_iter_ms, lb_iter_ms and bound_iter_ms (the least
            the configured rates allow); one host is at --slow-rate in slow-server (server
            rank 1 of 2, 2 workers) and slow-worker (worker rank 3 of 4, 2 servers); equal
            has 4 workers and 4 servers
  failover  on loopback (no root): 2 workers, 2 servers, the simulated trainer for --iters
            iterations (default 60) without a failure, then with FPT_ON_SERVER_LOSS=retry,
            server1 killed (kill -9) in iteration --kill-at (default 20) and a new server
            started in iteration --join-at (default kill-at+15); each iteration's time around
            the loss and around the join in both runs, the means before the loss, between it
            and the join and after the join as ratios to the run without a failure, and the
            retried iteration's time
  server-loss, server-join
            the simulated trainer once, LB on: in server-loss, --iters iterations (default 30),
            2 workers and 2 servers at --rate under FPT_ON_SERVER_LOSS=retry, server1 killed
            (kill -9) in iteration --kill-at (default iters/3); in server-join (default 40
            iterations) the slow-server set-up and a third server at --rate started in
            iteration --join-at (default iters/2); --workers (default 2) in either; the median
            iteration time before the event and over the last --tail iterations, next to the
            LB's bound before and after it (bound_before_ms, bound_after_ms), the retry's or
            the joined server's first share's iteration, and every process's exit
  worker-wait
            the simulated trainer once, LB on, --iters iterations (default 30): 3 workers
            (--workers, 3 to 6) and 2 servers at --rate under FPT_ON_WORKER_LOSS=wait, worker2
            killed (kill -9) in iteration --kill-at (default iters/3) and a replacement worker
            started once the scheduler logged the loss; the iterations around both, the
            iteration the workers left held at, the replacement's first (from the scheduler),
            how long the job waited for it, the median iteration time before the kill and over
            the last --tail iterations, and the parameters' checksum, the same on every worker

  hosts     several workers per host (--hosts-workers, default 4,4; one server per host, the
            scheduler on host 0), every link at --rate (default 1gbit), the simulated trainer
            with local aggregation off and on (FPT_LB=off in both): iter_ms, bound_ms (the
            least the links allow in that mode) and host_link_bytes (each host's interface
            counters per iteration) next to model_link_bytes (the traffic model by host)
  channels  one worker and one server on hosts at --rate (default 1gbit) where one TCP
            connection gets at most --flow-cap (default 200mbit), the goodput bench's push
            and pull of one tensor (default 32 MiB, 5 iterations, sums checked) with 1 and
            with 4 connections per pair (FPT_CHANNELS): goodput_gbps of each side by side

  classic   on loopback (no root): ps-lite's classic path (KVWorker ZPush/ZPull into
            KVServerDefaultHandle through include/ps, the C++ program pslite_benchmark)
            next to its FPT path (FPTPush/FPTPull) and raw TCP, --workers x --servers
            (default 2 x 2), --iters iterations (default 5): a dense case (4 keys of
            --tensor-bytes, default 8 MiB) and a sparse one (--sparse-keys keys of one
            float, default 10^7; the FPT path moves them as one tensor); push and pull ms,
            Gbit/s of worker 0 and CPU s/GB of every process; --pslite-program adds the
            same program built against dmlc/ps-lite

Every run prints a table, or with --json one JSON object per result; progress goes to
stderr. --plot FILE also draws the results as an SVG image; --from FILE draws (and
prints) the results a --json run saved, without running anything.

`

// flags are every flag of "fpt bench"; each experiment reads its own.
type flags struct {
	fs      *flag.FlagSet
	goodput goodputOptions
	vans    string
	lb      string
	peers   string
	scen    scenarioOptions
	weights string
	lbs     lbOptions
	killAt  int    // failover, server-loss, worker-wait: the iteration the node is lost in
	joinAt  int    // failover scenario: the iteration a new server is started in
	plot    string // --plot: an SVG file
	// hostsWorkers is the hosts scenario's workers per host (--hosts-workers).
	hostsWorkers string
	flowCap      string // --flow-cap: the channels scenario's cap on one connection
	from         string // --from: results to print and plot instead of a run
	// The classic scenario's --sparse-keys, --classic-program and
	// --pslite-program.
	sparseKeys     int
	classicProgram string
	psliteProgram  string
}

// set tells whether the command line gave the named flag.
func (f *flags) set(name string) bool {
	found := false
	f.fs.Visit(func(fl *flag.Flag) { found = found || fl.Name == name })
	return found
}

func newFlags(output io.Writer) *flags {
	f := &flags{fs: flag.NewFlagSet("fpt bench", flag.ContinueOnError)}
	fs := f.fs
	fs.SetOutput(output)
	o := &f.goodput
	fs.StringVar(&f.vans, "van", "epoll,netconn", "vans to measure, comma-separated (epoll, netconn)")
	fs.IntVar(&o.workers, "workers", 1, "workers (one configuration instead of the default rows); server-loss, server-join and\nworker-wait: the job's workers, one host each (default 2; 3 in worker-wait)")
	fs.IntVar(&o.servers, "servers", 1, "servers (one configuration instead of the default rows)")
	fs.StringVar(&f.lb, "lb", "off", "the load balancer, on or off (one configuration instead of the default rows)")
	fs.StringVar(&f.peers, "peers", "", "comma-separated peer counts W (as 1,2,4,8): one row of W workers x W servers,\nLB off, for each")
	fs.Int64Var(&o.tensorBytes, "tensor-bytes", 64<<20, "size of the one float32 tensor pushed and pulled; shaping and priority: of each\ntensor (default 16 MiB there)")
	fs.IntVar(&o.iters, "iters", 50, "timed iterations (after init and two warm-up iterations); LB and failover\nscenarios: training iterations per run (default 20 there, 60 in failover, 30 in server-loss, 40 in server-join); shaping: tensors queued at once\n(default 6); priority: rounds (default 3)")
	fs.Int64Var(&o.partitionBytes, "partition-bytes", 0, "FPT_PARTITION_BYTES for the cluster (0: the default, 256 KiB in shaping and\npriority)")
	fs.StringVar(&o.step, "step", "pushpull", "a worker's exchange each iteration: pushpull (one FPTPushPull: the sums land once, in\nplace) or separate (FPTPush, then FPTPull: partitions that come in between are\nstaged and copied)")
	fs.BoolVar(&o.jsonOut, "json", false, "one JSON object per line (else a table)")
	fs.BoolVar(&o.authCompare, "auth-compare", false, "run each goodput row four times, without a cluster secret\n(FPT_CLUSTER_SECRET), with one twice, and without again, and give the\nsecret-on rows' mean goodput and CPU per GB relative to the secret-off rows'")
	fs.StringVar(&f.scen.name, "scenario", "", "run a scenario in an emulated network instead (needs root): shaping, priority,\nor one or more of slow-server, equal, slow-worker (comma-separated), or server-loss,\nserver-join, worker-wait, hosts or channels; or failover or classic, on loopback (no root)")
	fs.StringVar(&f.scen.rate, "rate", "200mbit", "shaping and priority: the worker host's link rate, both ways (tc syntax); LB scenarios:\nevery host's but the slow one's (default 400mbit there)")
	registerLBFlags(fs, &f.lbs)
	fs.IntVar(&f.killAt, "kill-at", failoverDefaultKillAt, "failover and server-loss scenarios: server1 is killed (kill -9) once worker 0 has\nverified the iteration before this one (server-loss: default iters/3); worker-wait: worker2,\nthe same way (default iters/3)")
	fs.IntVar(&f.joinAt, "join-at", 0, "failover and server-join scenarios: a new server is started (failover: after the\nloss) once worker 0 has verified the iteration before this one (default kill-at+15, at\nmost iters-10; server-join: iters/2)")
	fs.StringVar(&f.plot, "plot", "", "also draw the results as an SVG image in this file: LB scenarios' iteration times\n(off, on, bound, decisions), failover's (both runs, the loss, the join), goodput vs raw TCP, CPU per GB by peers")
	fs.StringVar(&f.from, "from", "", "run nothing: read the results a --json run printed from this file (- for stdin),\nprint them and draw them with --plot")
	fs.StringVar(&f.weights, "weights", "3:1", "shaping scenario: the worker's flow weights for server 0 and server 1")
	fs.IntVar(&f.sparseKeys, "sparse-keys", classicSparseKeys, "classic scenario: the sparse case's keys (one float each)")
	fs.StringVar(&f.classicProgram, "classic-program", "", "classic scenario: the C++ program (default: pslite_benchmark beside fpt)")
	fs.StringVar(&f.psliteProgram, "pslite-program", "", "classic scenario: the same program built against dmlc/ps-lite, run as a fourth\npath (scripts/compare-pslite.sh builds it)")
	fs.StringVar(&f.hostsWorkers, "hosts-workers", hostsDefaultWorkers, "hosts scenario: workers per emulated host, comma-separated (one server per host)")
	fs.StringVar(&f.flowCap, "flow-cap", channelsDefaultFlowCap, "channels scenario: the most one TCP connection gets of a host's link (tc syntax)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usageText)
		fs.PrintDefaults()
		// The cluster's nodes inherit the environment.
		fmt.Fprintln(fs.Output())
		config.WriteHelp(fs.Output())
	}
	return f
}

// Main runs "fpt bench" with args (those after "bench") and returns the
// exit status. In a process the bench started as its cluster's worker
// (childEnv set), it runs that worker instead.
func Main(args []string) int {
	f := newFlags(os.Stderr)
	if err := f.fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return launch.ExitOK
		}
		return launch.ExitUsage
	}
	name := f.scen.name
	switch {
	case f.from != "":
		return plotMain(f)
	case name == scenarioFailover:
		return failoverMain(f)
	case name == scenarioHosts:
		return hostsMain(f)
	case name == scenarioChannels:
		return channelsMain(f)
	case name == scenarioClassic:
		return classicMain(f)
	case isElasticScenario(name):
		return elasticMain(f)
	case name != "" && isLBScenario(name):
		return lbScenarioMain(f)
	case name != "":
		return scenarioMain(f)
	}
	return goodputMain(f)
}

// runOnHosts starts spec's processes on net's hosts, each on the host
// hostOf gives its name, relays the progress lines of the workers to p
// under run (only worker rank 0 writes them; which process that is is the
// scheduler's to say), and waits, at most timeout, for every process to
// exit. The caller kills the cluster (Kill) once it has read its output.
func runOnHosts(ctx context.Context, net *netem.Network, spec localcluster.Spec, hostOf func(proc string) int, p *progress, run string, timeout time.Duration) (*localcluster.Cluster, error) {
	spec.Command = func(proc string, argv []string) *exec.Cmd {
		return net.Command(ctx, hostOf(proc), argv[0], argv[1:]...)
	}
	spec.Stderr = func(proc string) io.Writer {
		if strings.HasPrefix(proc, "worker") {
			return p.relay(run)
		}
		return nil
	}
	c, err := localcluster.Start(spec)
	if err != nil {
		return nil, err
	}
	p.printf(run, "cluster started")
	if err := waitCluster(ctx, c, timeout); err != nil {
		c.Kill()
		return nil, err
	}
	return c, nil
}

// waitCluster waits, at most timeout, for every process of c to exit;
// ctx's end (an interrupt) ends the wait early.
func waitCluster(ctx context.Context, c *localcluster.Cluster, timeout time.Duration) error {
	return waitSurvivors(ctx, c, nil, timeout)
}

// waitSurvivors is waitCluster for every process but lost (one the bench
// killed; nil: none).
func waitSurvivors(ctx context.Context, c *localcluster.Cluster, lost *localcluster.Proc, timeout time.Duration) error {
	waited := make(chan error, 1)
	go func() { waited <- c.WaitExcept(timeout, lost) }()
	select {
	case err := <-waited:
		return err
	case <-ctx.Done():
		return fmt.Errorf("interrupted while waiting for the processes to end%s", stillRunning(c, lost))
	}
}

// stillRunning names the processes of c other than lost that have not
// exited, each with the end of its log: what a run that never ended was
// waiting for.
func stillRunning(c *localcluster.Cluster, lost *localcluster.Proc) string {
	var b strings.Builder
	for _, p := range c.Procs {
		select {
		case <-p.Done():
			continue
		default:
		}
		if p == lost {
			continue
		}
		lines := strings.Split(strings.TrimRight(p.Stderr.String(), "\n"), "\n")
		fmt.Fprintf(&b, "\n%s still running; its last log lines:\n  %s", p.Name, strings.Join(lines[max(0, len(lines)-12):], "\n  "))
	}
	return b.String()
}

// decodeReport decodes the JSON line a bench worker printed on its stdout
// (writeJSONLine) into v.
func decodeReport(proc *localcluster.Proc, v any) error {
	out := strings.TrimSpace(proc.Stdout.String())
	if out == "" {
		return fmt.Errorf("%s printed no report", proc.Name)
	}
	if err := json.Unmarshal([]byte(out), v); err != nil {
		return fmt.Errorf("%s printed %q: %w", proc.Name, out, err)
	}
	return nil
}

// usageError reports a bad flag and returns the usage status.
func usageError(format string, args ...any) int {
	fmt.Fprintf(os.Stderr, "fpt bench: "+format+"\n", args...)
	return launch.ExitUsage
}

// failed reports a failed run and returns the failure status.
func failed(what string, err error) int {
	fmt.Fprintf(os.Stderr, "fpt bench: %s: %v\n", what, err)
	return launch.ExitFailed
}

// splitList is a comma-separated flag's items, without empty ones.
func splitList(s string) []string {
	var items []string
	for it := range strings.SplitSeq(s, ",") {
		if it = strings.TrimSpace(it); it != "" {
			items = append(items, it)
		}
	}
	return items
}
