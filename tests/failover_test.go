package tests

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/internal/localcluster"
)

// failoverIters and failoverKillAt: a run long enough that the kill lands
// well inside it, on a small model that keeps it fast; joinAt is when a
// server joins a job that lost none.
const failoverIters, failoverKillAt, joinAt = 50, 15, 10

// failoverModel is 4 tensors of 4 KiB to 2 MiB over 64 KiB partitions,
// so every tensor but the smallest is cut across both servers.
var failoverModel = []string{"-tensors", "4", "-min-bytes", "4096", "-max-bytes", "2097152", "-classic", "0"}

// membershipRe is the scheduler's line for a server that left under
// FPT_ON_SERVER_LOSS=retry.
var membershipRe = regexp.MustCompile(`msg="membership change: server left.*retry_from_iteration=(\d+)`)

// kill -9 of a server mid-run under FPT_ON_SERVER_LOSS=retry: the job goes
// on over the server left, every worker verifies every value of every
// iteration (test_kv_app exits non-zero on a wrong one), and every process
// left exits 0. Classic rounds are off: Push and Pull address the servers
// by key range, so they cannot survive a server's loss.
func TestKillServerRetry(t *testing.T) {
	for _, lbMode := range []string{"off", "on"} {
		t.Run("LB "+lbMode, func(t *testing.T) {
			c := startCluster(t, spec{servers: 2, workers: 2,
				env:     []string{"FPT_ON_SERVER_LOSS=retry", "FPT_LB=" + lbMode, "FPT_PARTITION_BYTES=65536"},
				appArgs: append([]string{"-iters", strconv.Itoa(failoverIters)}, failoverModel...)})
			c.killRetry("server1", membershipRe)
		})
	}
}

// killRetry kills (kill -9) the named process once worker0 is into
// iteration failoverKillAt, checks that the job goes on without it
// (survived), and returns the iteration the retry started at, from the
// scheduler's line for the membership change (left, with its iteration
// as the first group).
func (c *cluster) killRetry(name string, left *regexp.Regexp) (from int) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	victim := c.proc(name)
	if _, err := waitOutput(ctx, c.proc("worker0"), regexp.MustCompile(fmt.Sprintf(`iteration %d/`, failoverKillAt))); err != nil {
		c.dump()
		c.t.Fatal(err)
	}
	if err := victim.Kill(); err != nil {
		c.t.Fatal(err)
	}
	c.survived(victim)
	log := c.proc("scheduler").Stderr.String()
	m := left.FindStringSubmatch(log)
	if m == nil {
		c.t.Fatalf("the scheduler did not log the membership change:\n%s", tail(log))
	}
	// The retry starts at an iteration the workers had not all finished
	// when the node died: after the kill's trigger.
	from, _ = strconv.Atoi(m[1])
	if from < failoverKillAt || from > failoverIters {
		c.t.Errorf("retry_from_iteration=%d, want within %d..%d", from, failoverKillAt, failoverIters)
	}
	c.t.Logf("scheduler: %s", m[0])
	return from
}

// survived fails the test unless every process but victim (nil: all)
// exits 0 and every worker verified all failoverIters iterations.
func (c *cluster) survived(victim *localcluster.Proc) {
	c.t.Helper()
	if err := c.WaitExcept(2*time.Minute, victim); err != nil {
		c.dump()
		c.t.Fatal(err)
	}
	for _, w := range []string{"worker0", "worker1"} {
		c.t.Log(lastLine(c.proc(w).Stdout.String()))
		mustContain(c.t, w+" stdout", c.proc(w).Stdout.String(),
			fmt.Sprintf("iteration %d/%d verified", failoverIters, failoverIters),
			fmt.Sprintf("PASS: %d iterations", failoverIters))
	}
}

var (
	// joinedRe is the scheduler's line for a server admitted into the
	// running job; startedRe a node's line naming the id it started with.
	joinedRe  = regexp.MustCompile(`msg="membership change: server joined" .*?node=(\S+)@`)
	startedRe = regexp.MustCompile(`msg=(?:started|"joined the running job") .*?id=(\S+)`)
	// decisionRe is the scheduler's line for an LB decision; shareRe an
	// aggregator and its share in that line's split.
	decisionRe = regexp.MustCompile(`msg="lb decision" .*?from_iteration=(\d+) .*?split="([^"]*)"`)
	shareRe    = regexp.MustCompile(`(\S+\(\d+\)) (\d+\.\d)%`)
)

// TestServerJoin starts a new server process, with the job's environment,
// into a running 2 × 2 job under FPT_ON_SERVER_LOSS=retry: after server1
// was killed (kill -9) in iteration failoverKillAt, or into the whole
// cluster in iteration joinAt. Checked: the scheduler admitted it under a
// server id no node had, every process but the killed one exits 0, the
// workers verified every iteration, and the joined server was given a
// share of the tensors within the run (with the LB off, by the decision
// right after the join, equal to the other servers'; with it on, in a
// probe).
func TestServerJoin(t *testing.T) {
	for _, tc := range []struct {
		name string
		lb   string
		kill bool
	}{
		{"after a loss, LB off", "off", true},
		{"after a loss, LB on", "on", true},
		{"no loss, LB off", "off", false},
		{"no loss, LB on", "on", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The pause per iteration leaves the join time to land within
			// the run, also on a loaded machine.
			c := startCluster(t, spec{servers: 2, workers: 2,
				env:     []string{"FPT_ON_SERVER_LOSS=retry", "FPT_LB=" + tc.lb, "FPT_PARTITION_BYTES=65536"},
				appArgs: append([]string{"-iters", strconv.Itoa(failoverIters), "-compute", "20ms"}, failoverModel...)})
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			sched := c.proc("scheduler")
			var victim *localcluster.Proc
			at := joinAt
			if tc.kill {
				victim, at = c.proc("server1"), failoverKillAt
			}
			if _, err := waitOutput(ctx, c.proc("worker0"), regexp.MustCompile(fmt.Sprintf(`iteration %d/`, at))); err != nil {
				c.dump()
				t.Fatal(err)
			}
			if victim != nil {
				if err := victim.Kill(); err != nil {
					t.Fatal(err)
				}
				// The loss first: then the join is one, not a race with it.
				if _, err := waitOutput(ctx, sched, membershipRe); err != nil {
					c.dump()
					t.Fatal(err)
				}
			}
			ids := map[string]string{} // id -> the process that had it
			for _, p := range c.Procs[1:] {
				m, err := waitOutput(ctx, p, startedRe)
				if err != nil {
					c.dump()
					t.Fatal(err)
				}
				ids[m[1]] = p.Name
			}
			joiner, err := c.Add("server")
			if err != nil {
				t.Fatal(err)
			}
			c.survived(victim)

			log := sched.Stderr.String()
			m := joinedRe.FindStringSubmatchIndex(log)
			if m == nil {
				t.Fatalf("the scheduler did not log a server joining:\n%s", tail(log))
			}
			id := log[m[2]:m[3]]
			if had, ok := ids[id]; ok {
				t.Errorf("the joined server has id %s, which %s had", id, had)
			}
			mustContain(t, "the joined server's log", joiner.Stderr.String(), `msg="joined the running job" role=server id=`+id+" ")
			t.Logf("scheduler: %s", strings.SplitN(log[m[0]:], "\n", 2)[0])

			// The servers the joined one's share must be equal to: those
			// left, it included.
			servers := 3
			if tc.kill {
				servers = 2
			}
			given := false
			for _, d := range decisionRe.FindAllStringSubmatch(log[m[1]:], -1) {
				from, _ := strconv.Atoi(d[1])
				shares := map[string]string{}
				for _, s := range shareRe.FindAllStringSubmatch(d[2], -1) {
					shares[s[1]] = s[2]
				}
				if tc.lb == "off" {
					// The decision right after the join: an even split over
					// the servers, the joined one included.
					even := fmt.Sprintf("%.1f", 100/float64(servers))
					if len(shares) != servers || shares[id] != even || from > failoverIters {
						t.Errorf("first decision after the join: from iteration %d, split %q; want %d servers at %s%%, %s among them, within %d iterations",
							from, d[2], servers, even, id, failoverIters)
					}
					for s, share := range shares {
						if share != even {
							t.Errorf("%s has %s%%, want %s%%", s, share, even)
						}
					}
					given = true
					t.Logf("decision after the join: from iteration %d: %s", from, d[2])
					break
				}
				if strings.Contains(d[2], "; probe") && shares[id] != "" && shares[id] != "0.0" && from <= failoverIters {
					given = true
					t.Logf("probe after the join: from iteration %d: %s", from, d[2])
					break
				}
			}
			if !given {
				t.Errorf("no decision after the join gave %s a share within the run:\n%s", id, tail(log))
			}
		})
	}
}

// workerLeftRe is the scheduler's line for a worker that left under
// FPT_ON_WORKER_LOSS=continue.
var workerLeftRe = regexp.MustCompile(`msg="membership change: worker left.*retry_from_iteration=(\d+)`)

// kill -9 of worker 2 of a 2 × 3 job mid-run under
// FPT_ON_WORKER_LOSS=continue: the two workers left finish every
// iteration, verifying every value against the workers each iteration's
// sums add up (all three before the retry, the two left from its
// iteration on: test_kv_app asks the library and exits non-zero on a
// wrong value), say from which iteration on the sums are over two, and
// every process left exits 0.
func TestKillWorkerContinue(t *testing.T) {
	for _, lbMode := range []string{"off", "on"} {
		t.Run("LB "+lbMode, func(t *testing.T) {
			c := startCluster(t, spec{servers: 2, workers: 3,
				env:     []string{"FPT_ON_WORKER_LOSS=continue", "FPT_LB=" + lbMode, "FPT_PARTITION_BYTES=65536"},
				appArgs: append([]string{"-iters", strconv.Itoa(failoverIters)}, failoverModel...)})
			victim := c.proc("worker2")
			from := c.killRetry("worker2", workerLeftRe)
			// Ranks come with registration, not with process names: the
			// two left are those the killed one's does not name.
			vm := regexp.MustCompile(`(?m)^worker (\d): `).FindStringSubmatch(victim.Stdout.String())
			if vm == nil {
				t.Fatalf("worker2 printed no rank:\n%s", tail(victim.Stdout.String()))
			}
			var left []string
			for r := range 3 {
				if strconv.Itoa(r) != vm[1] {
					left = append(left, strconv.Itoa(r))
				}
			}
			// Each says so, with its dense rank among the two.
			dense := map[string]bool{}
			for _, w := range []string{"worker0", "worker1"} {
				out := c.proc(w).Stdout.String()
				mustContain(t, w+" stdout", out, fmt.Sprintf("iteration %d on: sums over 2 of 3 workers [%s]", from, strings.Join(left, " ")))
				if m := regexp.MustCompile(`this worker is now rank (\d) of 2`).FindStringSubmatch(out); m != nil {
					dense[m[1]] = true
				}
			}
			if !dense["0"] || !dense["1"] {
				t.Errorf("the workers left are not ranks 0 and 1 of 2 now: %v", dense)
			}
		})
	}
}
