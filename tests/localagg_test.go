package tests

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/internal/localcluster"
	"github.com/fptps/fpt/localagg"
)

// rankRe is test_kv_app's first line, with the worker's rank.
var rankRe = regexp.MustCompile(`(?m)^worker (\d+): `)

// TestLocalAggregationWorkerLoss: kill -9 of a worker of a group of three
// on one host mid-run, under FPT_ON_WORKER_LOSS=continue (the group's
// leader, rank 0 as the lowest id, or a member) and wait (a member, then
// a replacement joins on the same host): the retry dissolves the group,
// and the workers left (and the joiner) verify every value of every
// iteration against the workers its sums add up, and exit 0.
func TestLocalAggregationWorkerLoss(t *testing.T) {
	args := append([]string{"-iters", strconv.Itoa(failoverIters), "-compute", "20ms"}, failoverModel...)
	tests := []struct {
		name   string
		policy string
		rank   string // the victim's
		join   bool
		lb     string
	}{
		{"continue, leader lost", "continue", "0", false, "off"},
		{"continue, member lost", "continue", "2", false, "off"},
		{"wait, member lost and replaced", "wait", "1", true, "off"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := hostClusterOf(t, 1, 3, []string{"a", "a", "a", "a"},
				[]string{"FPT_LB=" + tt.lb, "FPT_LB_AHEAD=0", "FPT_LOCAL_AGGREGATION=on", "FPT_ON_WORKER_LOSS=" + tt.policy, "FPT_PARTITION_BYTES=65536"}, args)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if _, err := waitOutput(ctx, c.proc("worker0"), regexp.MustCompile(fmt.Sprintf(`iteration %d/`, failoverKillAt))); err != nil {
				c.dump()
				t.Fatal(err)
			}
			var victim *localcluster.Proc
			var left []string
			for i := range 3 {
				p := c.proc(fmt.Sprintf("worker%d", i))
				mustContain(t, p.Name+" stderr", p.Stderr.String(), `msg="local aggregation"`)
				if m := rankRe.FindStringSubmatch(p.Stdout.String()); m != nil && m[1] == tt.rank {
					victim = p
				} else {
					left = append(left, p.Name)
				}
			}
			if victim == nil {
				t.Fatalf("no worker printed rank %s", tt.rank)
			}
			if err := victim.Kill(); err != nil {
				t.Fatal(err)
			}
			if _, err := waitOutput(ctx, c.proc("scheduler"), workerLeftRe); err != nil {
				c.dump()
				t.Fatal(err)
			}
			if tt.join {
				joiner, err := c.Add("worker")
				if err != nil {
					t.Fatal(err)
				}
				c.joined(joiner, victim, left)
				mustContain(t, "joiner stderr", joiner.Stderr.String(), "this worker sums alone")
			} else if err := c.WaitExcept(2*time.Minute, victim); err != nil {
				c.dump()
				t.Fatal(err)
			}
			for _, name := range left {
				p := c.proc(name)
				mustContain(t, name+" stdout", p.Stdout.String(), fmt.Sprintf("iteration %d/%d verified", failoverIters, failoverIters), "PASS")
				mustContain(t, name+" stderr", p.Stderr.String(), "group dissolved after a retry")
			}
		})
	}
}

// hostCluster runs a cluster whose workers are placed on emulated hosts
// (FPT_HOST_ID): hosts[i] is the host of the i-th worker process.
func hostCluster(t *testing.T, servers int, hosts []string, env []string, appArgs []string) *cluster {
	t.Helper()
	return hostClusterOf(t, servers, len(hosts), hosts, env, appArgs)
}

// hostClusterOf is hostCluster starting the first workers of hosts: the
// others are the hosts of workers added later (cluster.Add).
func hostClusterOf(t *testing.T, servers, workers int, hosts []string, env []string, appArgs []string) *cluster {
	t.Helper()
	lc, err := localcluster.Start(localcluster.Spec{
		Servers: servers, Workers: workers,
		Scheduler: []string{bin.fpt}, Server: []string{bin.fpt},
		Worker: append([]string{bin.app}, appArgs...),
		Env:    append([]string{"PS_VERBOSE=1", "FPT_START_TIMEOUT=60"}, env...),
		Command: func(name string, argv []string) *exec.Cmd {
			cmd := exec.Command(argv[0], argv[1:]...)
			var i int
			if _, err := fmt.Sscanf(name, "worker%d", &i); err == nil && i < len(hosts) {
				cmd.Env = []string{"FPT_HOST_ID=" + hosts[i]}
			}
			return cmd
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lc.Kill)
	return &cluster{Cluster: lc, t: t}
}

// segments lists this job's local-aggregation segments left in /dev/shm.
func segments(t *testing.T) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(localagg.DefaultDir, localagg.Prefix+"*"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestLocalAggregation: workers on one host (FPT_HOST_ID) sum their
// pushes in shared memory and send one sum per host; every worker gets
// the exact sums (test_kv_app checks each against what every worker
// pushed), in groups of 1, 2 and 3 and uneven hosts, and nothing is left
// in /dev/shm after.
func TestLocalAggregation(t *testing.T) {
	if _, err := os.Stat(localagg.DefaultDir); err != nil {
		t.Skip("no /dev/shm:", err)
	}
	before := len(segments(t))
	small := []string{"-iters", "4", "-max-bytes", "1048576", "-classic", "1"}
	tests := []struct {
		name  string
		hosts []string
		args  []string
		env   []string
	}{
		{"groups of 1", []string{"a", "b"}, small, nil},
		{"a group of 2", []string{"a", "a"}, small, nil},
		{"a group of 3 and 1", []string{"a", "b", "a", "a"}, small, nil},
		{"uneven 2,1,2", []string{"a", "b", "c", "a", "c"}, small, nil},
		// More notices in flight than a socket queues (net.unix.max_dgram_qlen,
		// 10 by default): no notice loop may block on a peer's.
		{"a group of 3, many partitions in flight", []string{"a", "a", "a"},
			[]string{"-iters", "4", "-tensors", "4", "-min-bytes", "4194304", "-max-bytes", "4194304", "-classic", "0"}, []string{"FPT_PARTITION_BYTES=65536"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := append([]string{"FPT_LB=off", "FPT_LOCAL_AGGREGATION=on", "FPT_PARTITION_BYTES=262144"}, tt.env...)
			c := hostCluster(t, 2, tt.hosts, env, tt.args)
			c.waitAll(2 * time.Minute)
			groups := map[string]int{}
			for _, h := range tt.hosts {
				groups[h]++
			}
			for i, h := range tt.hosts {
				p := c.proc(fmt.Sprintf("worker%d", i))
				mustContain(t, p.Name+" stdout", p.Stdout.String(), "iteration 4/4 verified", "PASS")
				// Alone on its host, a worker sums nothing locally.
				if want := groups[h] > 1; strings.Contains(p.Stderr.String(), `msg="local aggregation"`) != want {
					t.Errorf("%s on host %s (of %d workers): local aggregation logged %v, want %v:\n%s", p.Name, h, groups[h], !want, want, tail(p.Stderr.String()))
				}
			}
			if left := segments(t); len(left) > before {
				t.Errorf("segments left in %s: %v", localagg.DefaultDir, left)
			}
		})
	}
}

// TestLocalAggregationNoSharedMemory: workers whose segment directory
// (FPT_LOCAL_AGGREGATION_DIR) is missing each sum alone, over the network,
// saying why, instead of failing the job: every value stays exact.
func TestLocalAggregationNoSharedMemory(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing")
	hosts := []string{"a", "a", "b"}
	c := hostCluster(t, 1, hosts, []string{"FPT_LB=off", "FPT_LOCAL_AGGREGATION=on", "FPT_LOCAL_AGGREGATION_DIR=" + missing},
		[]string{"-iters", "3", "-max-bytes", "1048576", "-classic", "0"})
	c.waitAll(2 * time.Minute)
	for i := range hosts {
		p := c.proc(fmt.Sprintf("worker%d", i))
		mustContain(t, p.Name+" stdout", p.Stdout.String(), "iteration 3/3 verified", "PASS")
		mustContain(t, p.Name+" stderr", p.Stderr.String(), "no shared memory for a group's segment here, so this worker sums alone", missing)
		if strings.Contains(p.Stderr.String(), `msg="local aggregation"`) {
			t.Errorf("%s summed in a group:\n%s", p.Name, tail(p.Stderr.String()))
		}
	}
}

// probeWithWorkerRe is a decision line of a probe that makes workers
// aggregate (every node takes an equal share).
var probeWithWorkerRe = regexp.MustCompile(`(?m)^.*lb decision v\d+ from iteration \d+: .*worker\d+\(\d+\) [0-9.]+%.*; probe`)

// TestLocalAggregationLB: local aggregation with the LB on. Its probe
// makes every worker aggregate a share, a group's leader and its members
// alike: the host's group sums into one host sum for each, on the host,
// and the aggregator's sum comes back to the whole group through it; the
// split after the probe is balanced by host. test_kv_app checks every
// value of every iteration against what every worker pushed.
func TestLocalAggregationLB(t *testing.T) {
	if _, err := os.Stat(localagg.DefaultDir); err != nil {
		t.Skip("no /dev/shm:", err)
	}
	const iters = 14
	args := []string{"-iters", strconv.Itoa(iters), "-max-bytes", "1048576", "-classic", "0"}
	for _, tt := range []struct {
		name  string
		hosts []string
	}{
		{"a group of 2", []string{"a", "a"}},
		{"uneven 3,1", []string{"a", "b", "a", "a"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			env := []string{"FPT_LB=on", "FPT_LB_AHEAD=0", "FPT_LOCAL_AGGREGATION=on", "FPT_PARTITION_BYTES=131072"}
			c := hostCluster(t, 2, tt.hosts, env, args)
			c.waitAll(2 * time.Minute)
			for i := range tt.hosts {
				p := c.proc(fmt.Sprintf("worker%d", i))
				mustContain(t, p.Name+" stdout", p.Stdout.String(), fmt.Sprintf("iteration %d/%d verified", iters, iters), "PASS")
			}
			mustContain(t, "worker0 stderr", c.proc("worker0").Stderr.String(), `msg="local aggregation"`)
			if sched := c.proc("scheduler").Stdout.String(); !probeWithWorkerRe.MatchString(sched) {
				t.Errorf("no probe made workers aggregate:\n%s", tail(sched))
			}
		})
	}
}

// TestLocalAggregationKill: kill -9 of a group's member or of its leader
// mid-run, under FPT_ON_WORKER_LOSS=fail: every other process exits 1
// within 30 s, and no segment is left in /dev/shm.
func TestLocalAggregationKill(t *testing.T) {
	before := len(segments(t))
	// worker0 and worker1 share host a; which one leads is the
	// scheduler's ranking: both cases are covered.
	for _, victimName := range []string{"worker0", "worker1"} {
		t.Run(victimName, func(t *testing.T) {
			c := hostCluster(t, 1, []string{"a", "a", "b"}, []string{"FPT_LB=off", "FPT_LOCAL_AGGREGATION=on"},
				[]string{"-iters", "100000", "-max-bytes", "1048576"})
			_, killed := c.killMidRun(victimName)
			for _, p := range c.Procs {
				if p.Name != victimName {
					c.awaitFailed(killed, p.Name)
				}
			}
			if left := segments(t); len(left) > before {
				t.Errorf("segments left in %s: %v", localagg.DefaultDir, left)
			}
		})
	}
}

// TestLocalAggregationDisagree: two workers of one host that declare
// different tensors (test_kv_app's sizes from -max-bytes) fail the job,
// naming the key's size, before any wrong sum: no worker verifies an
// iteration. (The init round's values reach a member through its group,
// and its own declaration refuses them.)
func TestLocalAggregationDisagree(t *testing.T) {
	lc, err := localcluster.Start(localcluster.Spec{
		Servers: 1, Workers: 2,
		Scheduler: []string{bin.fpt}, Server: []string{bin.fpt},
		Worker: []string{bin.app, "-iters", "3", "-tensors", "2", "-max-bytes", "1048576", "-classic", "0"},
		Env:    []string{"PS_VERBOSE=1", "FPT_START_TIMEOUT=60", "FPT_LB=off", "FPT_LOCAL_AGGREGATION=on", "FPT_HOST_ID=a"},
		Command: func(name string, argv []string) *exec.Cmd {
			if name == "worker1" {
				argv = append(slices.Clone(argv), "-max-bytes", "524288") // the last one counts
			}
			return exec.Command(argv[0], argv[1:]...)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lc.Kill)
	c := &cluster{Cluster: lc, t: t}
	if err := c.Wait(time.Minute); err == nil {
		t.Fatal("a job whose workers of one host declared different tensors ran to its end")
	}
	// The worker that found the sizes differ says so (the scheduler's
	// verdict names it too when the worker's notice beats its silence).
	if w1 := c.proc("worker1").Stderr.String(); !regexp.MustCompile(`key is \d+ bytes`).MatchString(w1) {
		c.dump()
		t.Error("worker1's error does not name the key's size")
	}
	for _, w := range []string{"worker0", "worker1"} {
		if p := c.proc(w); strings.Contains(p.Stdout.String(), "verified") {
			t.Errorf("%s verified an iteration:\n%s", w, tail(p.Stdout.String()))
		}
	}
}
