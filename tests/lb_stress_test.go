package tests

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/internal/localcluster"
	"github.com/fptps/fpt/netem"
)

// The LB switching stress tests: a real cluster trains for many iterations
// while the load balancer's decision changes again and again, and every
// pulled value is checked exactly (test_kv_app exits non-zero on any wrong
// value). A decision names the iteration it takes effect at; a node that
// switched at another boundary would misroute a partition, and a worker
// would see a wrong sum or hang.

// lbStressModel is a small model whose largest tensors span several
// partitions (FPT_PARTITION_BYTES=65536): 4 tensors, 4 KiB to 512 KiB.
var lbStressModel = []string{"-tensors", "4", "-min-bytes", "4096", "-max-bytes", "524288"}

// lbDecisionRe matches the scheduler's line for a new LB decision.
var lbDecisionRe = regexp.MustCompile(`msg="lb decision".*?\bversion=(\d+)`)

// lbDecisions returns the distinct decision versions in a scheduler's log,
// in the order they first appear.
func lbDecisions(log string) []string {
	seen := map[string]bool{}
	var versions []string
	for _, m := range lbDecisionRe.FindAllStringSubmatch(log, -1) {
		if !seen[m[1]] {
			seen[m[1]] = true
			versions = append(versions, m[1])
		}
	}
	return versions
}

// checkLBRun checks a finished LB run: every worker passed all iters
// iterations, and the scheduler logged at least minDecisions distinct
// decisions.
func checkLBRun(t *testing.T, c *cluster, workers, iters, minDecisions int) []string {
	t.Helper()
	for i := range workers {
		mustContain(t, fmt.Sprintf("worker%d stdout", i), c.proc(fmt.Sprintf("worker%d", i)).Stdout.String(),
			fmt.Sprintf("PASS: %d iterations", iters))
	}
	versions := lbDecisions(c.proc("scheduler").Stderr.String())
	t.Logf("the scheduler logged %d distinct LB decisions", len(versions))
	if len(versions) < minDecisions {
		t.Errorf("the scheduler logged %d distinct LB decisions (msg=\"lb decision\"), want at least %d: is the LB running?\n%s",
			len(versions), minDecisions, tail(c.proc("scheduler").Stderr.String()))
	}
	return versions
}

// On loopback, no root: 2 servers and 3 workers (with W = 3 a worker
// aggregating saves nothing, so workers and servers both get shares),
// 200 iterations, a new probe every 3 balanced iterations, so the
// decision changes dozens of times.
func TestLBSwitchingStress(t *testing.T) {
	const servers, workers, iters = 2, 3, 200
	c := startCluster(t, spec{servers: servers, workers: workers,
		// FPT_LB_AHEAD=0: iterations this short probe only with the
		// lookahead fixed (lb.Config.MinIteration).
		env:     []string{"FPT_LB=on", "FPT_LB_PROBE_EVERY=3", "FPT_LB_AHEAD=0", "FPT_PARTITION_BYTES=65536"},
		appArgs: append([]string{"-iters", strconv.Itoa(iters), "-quiet"}, lbStressModel...)})
	c.waitAll(5 * time.Minute)
	checkLBRun(t, c, workers, iters, 20)
}

// In an emulated network (root): every node on its own host at 200 Mbit/s;
// once worker0 is 40 iterations in, server rank 1's host drops to 25
// Mbit/s, and at 100 it is back to 200. No forced probes: what makes the
// LB decide again is its own measurements. The rate changes follow the
// training's progress rather than the clock, so that a slow machine still
// sees each phase.
func TestLBSwitchingStressNetem(t *testing.T) {
	needRoot(t)
	const (
		servers, workers, iters = 2, 3, 150
		dropAt, restoreAt       = 40, 100
		// Warm-up, probe and balanced at the start, and at least one new
		// decision after the drop.
		minDecisions = 4
	)
	fast := netem.HostSpec{Up: "200mbit", Down: "200mbit"}
	slow := netem.HostSpec{Up: "25mbit", Down: "25mbit"}
	// Hosts 0 and 1 servers, 2..4 workers, 5 the scheduler's (unlimited).
	// Ranks follow addresses, so server rank 1 is on host 1.
	hosts := []netem.HostSpec{fast, fast, fast, fast, fast, {}}
	const slowHost, schedulerHost = 1, servers + workers
	hostOf := map[string]int{"scheduler": schedulerHost}
	for i := range servers {
		hostOf["server"+strconv.Itoa(i)] = i
	}
	for i := range workers {
		hostOf["worker"+strconv.Itoa(i)] = servers + i
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	net, err := netem.New(ctx, hosts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := net.Close(); err != nil {
			t.Error(err)
		}
	})
	lc, err := localcluster.Start(localcluster.Spec{
		Servers: servers, Workers: workers,
		Scheduler: []string{bin.fpt}, Server: []string{bin.fpt},
		Worker:  append([]string{bin.app, "-iters", strconv.Itoa(iters)}, lbStressModel...),
		RootURI: net.Addr(schedulerHost),
		Env: []string{"PS_VERBOSE=1", "FPT_START_TIMEOUT=60", "DMLC_INTERFACE=" + net.Iface(),
			"FPT_LB=on", "FPT_PARTITION_BYTES=65536"},
		Command: func(name string, argv []string) *exec.Cmd {
			return net.Command(ctx, hostOf[name], argv[0], argv[1:]...)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lc.Kill) // before the network goes
	c := &cluster{Cluster: lc, t: t}
	scheduler := c.proc("scheduler")
	at := func(iteration int, h netem.HostSpec) int {
		t.Helper()
		if _, err := waitOutput(ctx, c.proc("worker0"), regexp.MustCompile(fmt.Sprintf(`iteration %d/`, iteration))); err != nil {
			c.dump()
			t.Fatal(err)
		}
		if err := net.SetRate(ctx, slowHost, h); err != nil {
			t.Fatal(err)
		}
		n := len(lbDecisions(scheduler.Stderr.String()))
		t.Logf("iteration %d: server rank 1's host now %s, after %d LB decisions", iteration, h, n)
		return n
	}
	beforeDrop := at(dropAt, slow)
	beforeRestore := at(restoreAt, fast)
	c.waitAll(4 * time.Minute)
	versions := checkLBRun(t, c, workers, iters, minDecisions)
	if beforeRestore <= beforeDrop {
		t.Errorf("no new LB decision between the drop to %s (iteration %d, after %d decisions) and the restore (iteration %d): the LB did not react",
			slow, dropAt, beforeDrop, restoreAt)
	}
	t.Logf("decision versions: %v", versions)
	for _, line := range strings.Split(c.proc("scheduler").Stdout.String(), "\n") {
		if strings.HasPrefix(line, "lb decision") {
			t.Log(line)
		}
	}
}
