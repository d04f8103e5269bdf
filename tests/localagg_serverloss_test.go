package tests

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/fptps/fpt/internal/localcluster"
)

// TestLocalAggregationServerLoss: local aggregation under
// FPT_ON_SERVER_LOSS=retry, workers 0 and 1 a group on host a, worker 2
// alone on host b, two servers. Server 1 killed (kill -9) or sent
// SIGTERM (it leaves in order) mid-run: the retry re-forms the group in
// a segment of its own, which sums again from the retry's iteration on,
// and a new server joins the job after. Or a server joins while the group
// sums, none lost: the even split sends it host sums, which it counts for
// the group the scheduler formed (a joining node's table names the
// nodes' hosts). Every worker verifies every value of every iteration
// and exits 0.
func TestLocalAggregationServerLoss(t *testing.T) {
	args := append([]string{"-iters", strconv.Itoa(failoverIters), "-compute", "20ms"}, failoverModel...)
	for _, tt := range []struct {
		name string
		lose func(*localcluster.Proc) error // server1's end; nil: none
	}{
		{"server killed and replaced", (*localcluster.Proc).Kill},
		{"server leaves and is replaced", (*localcluster.Proc).Terminate},
		{"server joins the groups' sums", nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := hostCluster(t, 2, []string{"a", "a", "b"},
				[]string{"FPT_LB=off", "FPT_LOCAL_AGGREGATION=on", "FPT_ON_SERVER_LOSS=retry", "FPT_PARTITION_BYTES=65536"}, args)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var victim *localcluster.Proc
			at := joinAt
			if tt.lose != nil {
				victim, at = c.proc("server1"), failoverKillAt
			}
			if _, err := waitOutput(ctx, c.proc("worker0"), regexp.MustCompile(fmt.Sprintf(`iteration %d/`, at))); err != nil {
				c.dump()
				t.Fatal(err)
			}
			for _, w := range []string{"worker0", "worker1"} {
				mustContain(t, w+" stderr", c.proc(w).Stderr.String(), `msg="local aggregation"`)
			}
			if victim != nil {
				if err := tt.lose(victim); err != nil {
					t.Fatal(err)
				}
				// The loss first: then the join is one, not a race with it.
				if _, err := waitOutput(ctx, c.proc("scheduler"), membershipRe); err != nil {
					c.dump()
					t.Fatal(err)
				}
			}
			joiner, err := c.Add("server")
			if err != nil {
				t.Fatal(err)
			}
			c.survived(victim)
			mustContain(t, "worker2 stdout", c.proc("worker2").Stdout.String(),
				fmt.Sprintf("iteration %d/%d verified", failoverIters, failoverIters), fmt.Sprintf("PASS: %d iterations", failoverIters))
			mustContain(t, "the joined server's log", joiner.Stderr.String(), `msg="joined the running job" role=server`)
			if sched := c.proc("scheduler").Stderr.String(); !joinedRe.MatchString(sched) {
				t.Errorf("the scheduler did not log the server's join:\n%s", tail(sched))
			}
			if victim != nil {
				for _, w := range []string{"worker0", "worker1"} {
					mustContain(t, w+" stderr", c.proc(w).Stderr.String(), "local aggregation: group dissolved", "local aggregation: group re-formed")
				}
				regrouped(t, c, []string{"worker0", "worker1"})
			}
		})
	}
}
