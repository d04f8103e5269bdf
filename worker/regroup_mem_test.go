package worker_test

import (
	"context"
	"log/slog"
	"regexp"
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
		{"leader lost", 1, map[string]string{"FPT_ON_WORKER_LOSS": "continue"}, node.WorkerID(0), "worker1(11) worker2(13)"},
		{"member lost", 1, map[string]string{"FPT_ON_WORKER_LOSS": "continue"}, node.WorkerID(1), "worker0(9) worker2(13)"},
		{"server lost", 2, map[string]string{"FPT_ON_SERVER_LOSS": "retry"}, node.ServerID(1), "worker0(9) worker1(11) worker2(13)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			logs := &localcluster.Buffer{} // the nodes' goroutines share it
			env := map[string]string{
				"FPT_PARTITION_BYTES": memPartitionBytes, "FPT_LB": "off",
				"FPT_LOCAL_AGGREGATION": "on", "FPT_HOST_ID": "a", "FPT_LOCAL_AGGREGATION_DIR": t.TempDir(),
			}
			for k, v := range tt.env {
				env[k] = v
			}
			c, err := memcluster.Start(context.Background(), memcluster.Options{Servers: tt.servers, Workers: 3,
				Logger: slog.New(slog.NewTextHandler(logs, nil)), Env: env})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Close)
			t.Cleanup(func() {
				if t.Failed() {
					t.Log(logs.String())
				}
			})
			killed := make(chan error, 1)
			var once sync.Once
			survive(t, c, iters, hooks{before: func(w *worker.Worker, it int) error {
				if it == killAt {
					once.Do(func() {
						go func() {
							time.Sleep(20 * time.Millisecond) // pushes of killAt on their way
							killed <- c.Kill(tt.victim)
						}()
					})
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
