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
	"syscall"
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
// a replacement joins on the same host): the retry re-forms the group
// over the workers left, which sum on their host again from its
// iteration on (its new leader logs its host sums); the joiner joins
// their group from its first iteration on (its log shows the group
// re-formed with it, and the group's leader logs host sums of it); the
// workers left and the joiner verify every value of every iteration
// against the workers its sums add up, and exit 0, leaving no segment in
// /dev/shm.
//
// With the LB on, the balanced split puts every partition on the host's
// workers (the server's host has none), so the member killed aggregates a
// third of them for its own group, and is killed while the leader holds
// host sums for it that it hands over only after it lost it (see
// killAggregating): those hand-overs fail (the notices through the
// segment, or sends over loopback where every result chunk is taken), and
// are left to the retry, as any push to a lost aggregator is, never the
// leader's failure.
func TestLocalAggregationWorkerLoss(t *testing.T) {
	args := append([]string{"-iters", strconv.Itoa(failoverIters), "-compute", "20ms"}, failoverModel...)
	tests := []struct {
		name   string
		policy string
		rank   string // the victim's
		join   bool
		lb     string
		// aggregating: ranks pinned (worker<i> is rank i: the leader
		// worker0, the victim worker1), and the victim killed while the
		// leader holds host sums for it (killAggregating).
		aggregating bool
	}{
		{"continue, leader lost", "continue", "0", false, "off", false},
		{"continue, member lost", "continue", "2", false, "off", false},
		{"wait, member lost and replaced", "wait", "1", true, "off", false},
		// The probe after the join makes the joiner aggregate: it sends
		// its sums to the members too, which push their own.
		{"wait, member lost while it aggregates for its group, and replaced, LB on", "wait", "1", true, "on", true},
	}
	before := len(segments(t))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var perWorker func(i int, cmd *exec.Cmd)
			if tt.aggregating {
				perWorker = func(i int, cmd *exec.Cmd) {
					if i >= 3 {
						return // the joiner takes the rank left
					}
					cmd.Env = append(cmd.Env, "DMLC_WORKER_ID="+strconv.Itoa(i))
					if i == 2 {
						cmd.Args = append(cmd.Args, "-compute", "150ms") // the last one counts
					}
				}
			}
			c := hostClusterWith(t, 1, 3, []string{"a", "a", "a", "a"},
				[]string{"FPT_LB=" + tt.lb, "FPT_LB_AHEAD=0", "FPT_LOCAL_AGGREGATION=on", "FPT_ON_WORKER_LOSS=" + tt.policy, "FPT_PARTITION_BYTES=65536"}, args, perWorker)
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
			if tt.aggregating {
				killAggregating(t, c, victim)
			} else if err := victim.Kill(); err != nil {
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
				// The joiner is in its host's group from its first
				// iteration: its log shows the group re-formed with it,
				// and the group's leader pushed host sums holding it.
				id := workerIDRe.FindStringSubmatch(joiner.Stderr.String())
				if id == nil {
					t.Fatal("the joiner logged no id")
				}
				in := regexp.MustCompile(`msg="local aggregation: group re-formed" .*group="\[[^]]*` + regexp.QuoteMeta(id[1]) + `[^]]*\]"`)
				if !in.MatchString(joiner.Stderr.String()) {
					c.dump()
					t.Errorf("the joiner's log shows no group re-formed with it (%s)", id[1])
				}
				regrouped(t, c, append(slices.Clone(left), joiner.Name))
			} else if err := c.WaitExcept(2*time.Minute, victim); err != nil {
				c.dump()
				t.Fatal(err)
			}
			for _, name := range left {
				p := c.proc(name)
				mustContain(t, name+" stdout", p.Stdout.String(), fmt.Sprintf("iteration %d/%d verified", failoverIters, failoverIters), "PASS")
				mustContain(t, name+" stderr", p.Stderr.String(), "local aggregation: group dissolved", "local aggregation: group re-formed")
			}
			regrouped(t, c, left)
			if err := c.WaitExcept(time.Minute, victim); err != nil {
				c.dump()
				t.Fatal(err)
			}
			if left := segments(t); len(left) > before {
				t.Errorf("segments left in %s: %v", localagg.DefaultDir, left)
			}
		})
	}
}

// reformedRe is a group's leader closing a group re-formed mid-run: the
// iteration it summed from, and its host sums.
var reformedRe = regexp.MustCompile(`msg="local aggregation: group closed" .*group="\[(.*)\]" from_iteration=([1-9]\d*) host_sums=(\d+)`)

// workerIDRe is a worker's id in its log: at its start, or when it joined
// the running job.
var workerIDRe = regexp.MustCompile(`msg=(?:started|"joined the running job") role=worker id=(\S+)`)

// regrouped checks that the workers left, the processes named, summed
// on their host again after the retry (or a join): one of them led the
// re-formed group of them all and pushed host sums from its iteration on.
func regrouped(t *testing.T, c *cluster, left []string) {
	t.Helper()
	var ids []string
	for _, name := range left {
		m := workerIDRe.FindStringSubmatch(c.proc(name).Stderr.String())
		if m == nil {
			t.Fatalf("%s logged no id", name)
		}
		ids = append(ids, m[1])
	}
	slices.Sort(ids)
	for _, name := range left {
		for _, m := range reformedRe.FindAllStringSubmatch(c.proc(name).Stderr.String(), -1) {
			if sums, _ := strconv.Atoi(m[3]); m[1] == strings.Join(ids, " ") && sums > 0 {
				return
			}
		}
	}
	c.dump()
	t.Errorf("no leader of the workers left %v logged host sums of their group re-formed after the retry", ids)
}

// killAggregating kills victim, worker1 (rank 1), while it aggregates
// partitions whose host sums its group's leader, worker0, has yet to
// hand it, and has them handed over only once the leader lost it (its
// notice socket gone, its van's connection too): worker2, the group's
// last member to push (its compute pause is the longest), is stopped
// once it printed an iteration, and so is the scheduler (whose verdict on
// the loss would dissolve the group first); victim and the leader push
// the next iteration into the host sums and victim is killed; once the
// leader logged the loss, worker2 resumes and pushes its share, which
// completes the host sums, some of them victim's, which the leader drops
// (logged); then the scheduler resumes. The test passes whatever the
// timing; the pause below only makes it meet the case it is for (a victim
// killed before it pushed meets no host sum).
func killAggregating(t *testing.T, c *cluster, victim *localcluster.Proc) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	last, sched, leader := c.proc("worker2"), c.proc("scheduler"), c.proc("worker0")
	at := failoverKillAt + 1
	if _, err := waitOutput(ctx, last, regexp.MustCompile(fmt.Sprintf(`iteration %d/`, at))); err != nil {
		c.dump()
		t.Fatal(err)
	}
	for _, p := range []*localcluster.Proc{last, sched} {
		if err := syscall.Kill(p.Cmd.Process.Pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		defer syscall.Kill(p.Cmd.Process.Pid, syscall.SIGCONT)
	}
	// The split in force for the next iteration gives victim a share.
	var split string
	for _, m := range decisionRe.FindAllStringSubmatch(sched.Stderr.String(), -1) {
		if from, _ := strconv.Atoi(m[1]); from <= at+1 {
			split = m[2]
		}
	}
	if share := regexp.MustCompile(`worker1\(11\) ([0-9.]+)%`).FindStringSubmatch(split); share == nil || share[1] == "0.0" {
		c.dump()
		t.Fatalf("worker1 aggregates nothing in iteration %d: split %q", at+1, split)
	}
	time.Sleep(500 * time.Millisecond) // victim's and the leader's pushes; see above
	if err := victim.Kill(); err != nil {
		t.Fatal(err)
	}
	<-victim.Done()
	if _, err := waitOutput(ctx, leader, regexp.MustCompile(`msg="van: peer lost" .*peer=worker1\(11\)`)); err != nil {
		c.dump()
		t.Fatal(err)
	}
	if err := syscall.Kill(last.Cmd.Process.Pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// The leader's host sums complete with worker2's push, and those to
	// victim fail, before the scheduler's verdict on victim.
	if _, err := waitOutput(ctx, leader, regexp.MustCompile(`host sums to a lost aggregator dropped|notice to a lost group member dropped`)); err != nil {
		c.dump()
		t.Fatal(err)
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
	return hostClusterWith(t, servers, workers, hosts, env, appArgs, nil)
}

// hostClusterWith is hostClusterOf where perWorker, if not nil, may add to
// the i-th worker process's command (its environment, its arguments).
func hostClusterWith(t *testing.T, servers, workers int, hosts []string, env []string, appArgs []string, perWorker func(i int, cmd *exec.Cmd)) *cluster {
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
				if perWorker != nil {
					perWorker(i, cmd)
				}
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
		// oneHost: the servers (and the scheduler) on the workers' host
		// too: no probe, every partition on the group's leader.
		oneHost bool
	}{
		{"a group of 2", []string{"a", "a"}, false},
		{"uneven 3,1", []string{"a", "b", "a", "a"}, false},
		{"one host", []string{"a", "a", "a"}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			env := []string{"FPT_LB=on", "FPT_LB_AHEAD=0", "FPT_LOCAL_AGGREGATION=on", "FPT_PARTITION_BYTES=131072"}
			if tt.oneHost {
				env = append(env, "FPT_HOST_ID=a")
			}
			c := hostCluster(t, 2, tt.hosts, env, args)
			c.waitAll(2 * time.Minute)
			for i := range tt.hosts {
				p := c.proc(fmt.Sprintf("worker%d", i))
				mustContain(t, p.Name+" stdout", p.Stdout.String(), fmt.Sprintf("iteration %d/%d verified", iters, iters), "PASS")
			}
			mustContain(t, "worker0 stderr", c.proc("worker0").Stderr.String(), `msg="local aggregation"`)
			sched := c.proc("scheduler").Stdout.String()
			switch {
			case tt.oneHost && (!strings.Contains(sched, "one host: every partition on its group's leader worker0(9)") || strings.Contains(sched, "probe:")):
				t.Errorf("not every partition on the leader, or a probe:\n%s", tail(sched))
			case !tt.oneHost && !probeWithWorkerRe.MatchString(sched):
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
