package worker_test

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fptps/fpt/internal/localcluster"
	"github.com/fptps/fpt/internal/memcluster"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/worker"
)

// closedRe is a group's leader closing its group: its workers, the first
// iteration it summed and its host sums.
var closedRe = regexp.MustCompile(`msg="local aggregation: group closed" .*group="\[(.*)\]" from_iteration=(\d+) host_sums=(\d+)`)

// startLocalMem starts an in-memory job of servers and workers whose
// workers all run on one host and sum there (a real segment in a
// directory of the test's own, dir; real notice sockets), with env on
// top; the nodes' log is shown where the test fails.
func startLocalMem(t *testing.T, servers, workers int, env map[string]string) (c *memcluster.Cluster, logs *localcluster.Buffer, dir string) {
	t.Helper()
	logs = &localcluster.Buffer{} // the nodes' goroutines share it
	dir = t.TempDir()
	all := map[string]string{
		"FPT_PARTITION_BYTES":   memPartitionBytes,
		"FPT_LOCAL_AGGREGATION": "on", "FPT_HOST_ID": "a", "FPT_LOCAL_AGGREGATION_DIR": dir,
	}
	maps.Copy(all, env)
	c, err := memcluster.Start(context.Background(), memcluster.Options{Servers: servers, Workers: workers,
		Logger: slog.New(slog.NewTextHandler(logs, nil)), Env: all})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(logs.String())
		}
	})
	return c, logs, dir
}

// TestLocalRegroupAfterRetry: three workers on one host sum locally (a
// real segment in a test directory, real notice sockets, the in-memory
// network); a worker lost under FPT_ON_WORKER_LOSS=continue (the leader,
// or a member), or a server under FPT_ON_SERVER_LOSS=retry, costs a
// retry, after which the workers left sum on their host again, in a group
// re-formed from the retry's iteration on: its leader pushes host sums,
// every value of every iteration stays exact (fptWorker checks them
// against the workers of each iteration) and the job ends cleanly. After
// a server's loss the leader often has a sum of the retry's iteration
// that a member has not read yet: the re-pushed host sum's result must
// still reach that member, or the job stalls.
func TestLocalRegroupAfterRetry(t *testing.T) {
	const iters, killAt = 12, 5
	for _, tt := range []struct {
		name    string
		servers int
		env     map[string]string
		victim  node.ID
		left    string // the re-formed group, as logged
	}{
		{"leader lost", 1, map[string]string{"FPT_LB": "off", "FPT_ON_WORKER_LOSS": "continue"}, node.WorkerID(0), "worker1(11) worker2(13)"},
		{"member lost", 1, map[string]string{"FPT_LB": "off", "FPT_ON_WORKER_LOSS": "continue"}, node.WorkerID(1), "worker0(9) worker2(13)"},
		{"server lost", 2, map[string]string{"FPT_LB": "off", "FPT_ON_SERVER_LOSS": "retry"}, node.ServerID(1), "worker0(9) worker1(11) worker2(13)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, logs, _ := startLocalMem(t, tt.servers, 3, tt.env)
			killed := make(chan error, 1)
			gone := make(chan struct{})
			var once sync.Once
			survive(t, c, iters, hooks{before: func(w *worker.Worker, it int) error {
				if it == killAt {
					once.Do(func() {
						go func() {
							time.Sleep(20 * time.Millisecond) // pushes of killAt on their way
							killed <- c.Kill(tt.victim)
							close(gone)
						}()
					})
				}
				if it == killAt+1 {
					// Without the race detector the iterations left take
					// less than the sleep: the job would end before the
					// loss, with no retry to re-form the group after.
					<-gone
				}
				return nil
			}}, func(id node.ID) bool { return id == tt.victim }, time.Minute)
			if err := <-killed; err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := c.Finish(ctx); err != nil {
				t.Fatalf("the job did not end cleanly: %v", err)
			}
			var regrouped bool
			for _, m := range closedRe.FindAllStringSubmatch(logs.String(), -1) {
				from, _ := strconv.Atoi(m[2])
				sums, _ := strconv.Atoi(m[3])
				if m[1] == tt.left && from > 0 && sums > 0 {
					regrouped = true
				}
			}
			if !regrouped {
				t.Errorf("no group of %s summed on the host after the retry; groups closed: %q", tt.left, closedRe.FindAllString(logs.String(), -1))
			}
		})
	}
}

// TestLocalJoinerInGroup: two workers sum on their host (a real segment,
// real notice sockets, the in-memory network) when a third joins on the
// same host: from its first iteration on it is in its host's group, a
// group of three re-formed in a segment of its own, whose leader pushes
// host sums holding the joiner's contributions; every value of every
// iteration stays exact (trainJoinable checks each sum against the
// workers WorkersAt names, the joiner's pushes included), all end with
// the same parameters, and the job ends cleanly. Under the LB's grants
// alone and under FPT_ON_WORKER_LOSS=continue with the LB off.
func TestLocalJoinerInGroup(t *testing.T) {
	const iters, joinAt = 14, 4
	for _, tt := range []struct {
		name string
		env  map[string]string
	}{
		{"LB on", map[string]string{"FPT_LB": "on"}},
		{"LB off, continue", map[string]string{"FPT_LB": "off", "FPT_ON_WORKER_LOSS": "continue"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, logs, dir := startLocalMem(t, 1, 2, tt.env)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			models := []*model{newModel(), newModel(), newModel()}
			j := trainWithJoiner(t, ctx, cancel, c, models, iters, joinAt)
			if t.Failed() {
				return
			}
			first := j.StartIteration()
			if first <= joinAt || first > iters {
				t.Fatalf("the joiner started at iteration %d, want within (%d, %d]", first, joinAt, iters)
			}
			for i, m := range models[1:] {
				if !slices.Equal(m.params, models[0].params) {
					t.Errorf("worker %d's parameters differ from worker 0's at the end", i+1)
				}
			}
			if err := c.Finish(ctx); err != nil {
				t.Fatalf("the job did not end cleanly: %v", err)
			}
			// The first group summed until the join, the group with the
			// joiner from its first iteration on.
			want := map[string]bool{"worker0(9) worker1(11) from 0": false, fmt.Sprintf("worker0(9) worker1(11) worker2(13) from %d", first): false}
			for _, m := range closedRe.FindAllStringSubmatch(logs.String(), -1) {
				if sums, _ := strconv.Atoi(m[3]); sums > 0 {
					if _, ok := want[m[1]+" from "+m[2]]; ok {
						want[m[1]+" from "+m[2]] = true
					}
				}
			}
			for g, seen := range want {
				if !seen {
					t.Errorf("no host sums of the group %s; groups closed: %q", g, closedRe.FindAllString(logs.String(), -1))
				}
			}
			t.Logf("groups closed: %q", closedRe.FindAllString(logs.String(), -1))
			if left, err := os.ReadDir(dir); err != nil || len(left) != 0 {
				t.Errorf("left in the segments' directory: %v (%v)", left, err)
			}
		})
	}
}
