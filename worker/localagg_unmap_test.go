package worker_test

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/worker"
)

// TestLocalRetiredGroupUnmapped: three workers on one host sum locally
// (a real segment in a test directory, real notice sockets, the
// in-memory network); after the retry for a lost server or member, once
// the LB's Done passed the dissolved group's iterations, every worker
// left has unmapped its segment while the job still runs, keeping only
// the re-formed group's; every value stays exact (fptWorker checks them)
// and the job ends cleanly.
func TestLocalRetiredGroupUnmapped(t *testing.T) {
	const iters, killAt = 12, 4
	for _, tt := range []struct {
		name    string
		servers int
		env     map[string]string
		victim  node.ID
	}{
		{"server lost", 2, map[string]string{"FPT_LB": "off", "FPT_ON_SERVER_LOSS": "retry"}, node.ServerID(1)},
		{"member lost", 1, map[string]string{"FPT_LB": "off", "FPT_ON_WORKER_LOSS": "continue"}, node.WorkerID(2)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, logs, dir := startLocalMem(t, tt.servers, 3, tt.env)
			killed := make(chan error, 1)
			var once sync.Once
			survive(t, c, iters, hooks{before: func(w *worker.Worker, it int) error {
				if it == killAt {
					once.Do(func() {
						go func() { killed <- c.Kill(tt.victim) }()
					})
				}
				return nil
			}}, func(id node.ID) bool { return id == tt.victim }, time.Minute)
			if err := <-killed; err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(logs.String(), `msg="local aggregation: group re-formed"`) {
				t.Fatal("no group re-formed after the loss")
			}
			// Done passes the retry's iteration a few iterations after
			// it; the unmapping follows it on a goroutine of its own.
			deadline := time.Now().Add(30 * time.Second)
			for _, w := range c.Workers {
				if w.Node().Self().ID == tt.victim {
					continue
				}
				for w.MappedSegments() > 1 && time.Now().Before(deadline) {
					time.Sleep(5 * time.Millisecond)
				}
				if n := w.MappedSegments(); n != 1 {
					t.Errorf("%s has %d segments mapped at the end of training, want the re-formed group's only", w.Node().Self().ID, n)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := c.Finish(ctx); err != nil {
				t.Fatalf("the job did not end cleanly: %v", err)
			}
			for _, w := range c.Workers {
				if n := w.MappedSegments(); n != 0 {
					t.Errorf("%s has %d segments mapped after the job ended", w.Node().Self().ID, n)
				}
			}
			if left, err := os.ReadDir(dir); err != nil || len(left) != 0 {
				t.Errorf("left in the segments' directory: %v (%v)", left, err)
			}
		})
	}
}
