package tests

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// failoverIters and failoverKillAt: a run long enough that the kill lands
// well inside it, on a small model that keeps it fast.
const failoverIters, failoverKillAt = 50, 15

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
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			victim := c.proc("server1")
			if _, err := waitOutput(ctx, c.proc("worker0"), regexp.MustCompile(fmt.Sprintf(`iteration %d/`, failoverKillAt))); err != nil {
				c.dump()
				t.Fatal(err)
			}
			if err := victim.Kill(); err != nil {
				t.Fatal(err)
			}
			for _, p := range c.Procs {
				if p == victim {
					continue
				}
				if !p.Wait(2 * time.Minute) {
					c.dump()
					t.Fatalf("%s still running 2 min after server1 was killed", p.Name)
				}
				if p.ExitCode() != 0 {
					c.dump()
					t.Fatalf("%s exited %d after server1 was killed, want 0", p.Name, p.ExitCode())
				}
			}
			for _, w := range []string{"worker0", "worker1"} {
				t.Log(lastLine(c.proc(w).Stdout.String()))
				mustContain(t, w+" stdout", c.proc(w).Stdout.String(),
					fmt.Sprintf("iteration %d/%d verified", failoverIters, failoverIters),
					fmt.Sprintf("PASS: %d iterations", failoverIters))
			}
			log := c.proc("scheduler").Stderr.String()
			m := membershipRe.FindStringSubmatch(log)
			if m == nil {
				t.Fatalf("the scheduler did not log the membership change:\n%s", tail(log))
			}
			// The retry starts at an iteration the workers had not all
			// finished when the server died: after the kill's trigger.
			if from, _ := strconv.Atoi(m[1]); from < failoverKillAt || from > failoverIters {
				t.Errorf("retry_from_iteration=%d, want within %d..%d", from, failoverKillAt, failoverIters)
			}
			t.Logf("scheduler: %s", m[0])
		})
	}
}
