package worker_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/worker"
)

// stallEnv makes a stall show within seconds: heartbeats (which carry a
// worker's progress) every 0.2 s, FPT_STALL_TIMEOUT 2 s.
var stallEnv = map[string]string{
	"FPT_PARTITION_BYTES":   memPartitionBytes,
	"PS_HEARTBEAT_INTERVAL": "0.2",
	"PS_HEARTBEAT_TIMEOUT":  "30",
	"FPT_STALL_TIMEOUT":     "2",
}

// A live worker that stops pushing fails every node, naming it and the
// iteration it did not push, instead of leaving everyone waiting: with the
// LB on or off, since the progress rides on heartbeats, not LB samples.
func TestStalledWorkerFailsTheJob(t *testing.T) {
	for _, lbMode := range []string{"on", "off"} {
		t.Run("lb "+lbMode, func(t *testing.T) { stalledWorker(t, lbMode) })
	}
}

func stalledWorker(t *testing.T, lbMode string) {
	env := maps.Clone(stallEnv)
	env["FPT_LB"] = lbMode
	c := startMem(t, 1, 3, env)
	const stopAt = 3
	errStopped := errors.New("stopped on purpose")
	var wg sync.WaitGroup
	errs := make([]error, len(c.Workers))
	for i, w := range c.Workers {
		wg.Go(func() {
			errs[i] = fptWorker(w, len(c.Workers), 10, hooks{before: func(w *worker.Worker, it int) error {
				if w.Rank() == 1 && it == stopAt {
					// Alive and heartbeating, but pushing nothing more.
					<-w.Node().Done()
					return errStopped
				}
				return nil
			}})
		})
	}
	wg.Wait()
	// Iteration 0 is the init round, so before iteration stopAt the worker
	// has pushed stopAt iterations: the one it did not push is stopAt.
	want := "worker 1 (id 11) has pushed nothing for iteration 3 for"
	for rank, err := range errs {
		if rank == 1 {
			if !errors.Is(err, errStopped) {
				t.Errorf("worker 1: %v, want its own stop", err)
			}
			if nerr := c.Workers[1].Node().Err(); nerr == nil || !strings.Contains(nerr.Error(), want) {
				t.Errorf("worker 1's node error: %v, want %q", nerr, want)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "FPT_STALL_TIMEOUT") {
			t.Errorf("worker %d: %v, want an error containing %q", rank, err, want)
		}
	}
}

// A worker that is slow but keeps pushing is not stalled, even though it is
// behind the others for longer than FPT_STALL_TIMEOUT in all. The timeout
// is 3 times the worker's lag per iteration: with 2 times, a loaded
// machine running the race detector once stretched a 1 s lag past it.
func TestSlowWorkerIsNotStalled(t *testing.T) {
	env := maps.Clone(stallEnv)
	env["FPT_STALL_TIMEOUT"] = "3"
	c := startMem(t, 1, 3, env)
	fptRounds(t, c.Workers, 5, hooks{before: func(w *worker.Worker, it int) error {
		if w.Rank() == 1 {
			time.Sleep(time.Second) // 5 s behind in all
		}
		return nil
	}})
	for _, w := range c.Workers {
		if err := w.Node().Err(); err != nil {
			t.Fatalf("worker %d failed: %v", w.Rank(), err)
		}
	}
}

// Under FPT_ON_WORKER_LOSS=continue a stalled worker is lost like a dead
// one: it is told why (its node fails naming it), and the two others
// finish every iteration, summed over both of them from the retry on.
func TestStalledWorkerLeavesUnderContinue(t *testing.T) {
	env := maps.Clone(stallEnv)
	env["FPT_ON_WORKER_LOSS"] = "continue"
	c := startMem(t, 1, 3, env)
	const stopAt, iters = 3, 10
	stalled := node.WorkerID(1)
	survive(t, c, iters, hooks{before: func(w *worker.Worker, it int) error {
		if w.Node().Self().ID == stalled && it == stopAt {
			// Alive and heartbeating, but pushing nothing more.
			<-w.Node().Done()
			return errors.New("stopped on purpose")
		}
		return nil
	}}, func(id node.ID) bool { return id == stalled }, time.Minute)
	want := "worker 1 (id 11) has pushed nothing for iteration 3 for"
	if err := c.Workers[1].Node().Err(); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("the stalled worker's node error: %v, want %q", err, want)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for _, w := range []*worker.Worker{c.Workers[0], c.Workers[2]} {
		if got := w.WorkersAt(iters); !slices.Equal(got, []node.ID{node.WorkerID(0), node.WorkerID(2)}) {
			t.Errorf("worker %d: the last iteration summed over %v, want workers 0 and 2", w.Rank(), got)
		}
		// Together: each waits for the other at the final barrier.
		wg.Go(func() {
			if err := w.Finalize(ctx); err != nil {
				t.Errorf("worker %d: %v", w.Rank(), err)
			}
		})
	}
	wg.Wait()
	if errs, err := c.Ends(ctx); err != nil || len(errs) > 0 {
		t.Errorf("the scheduler and the server ended with %v, %v", errs, err)
	}
}
