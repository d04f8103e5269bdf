package worker_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fptps/fpt/internal/memcluster"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/worker"
)

// TestMembershipStressWorkers runs 500 iterations of a 2×5 job under
// FPT_ON_SERVER_LOSS=retry and FPT_ON_WORKER_LOSS=continue through 50
// membership events, one every 10 iterations: a live server killed (while
// another remains), a new server started, or a worker killed (while more
// than two remain; never worker 0, which draws the events). Every pulled
// value is checked exactly against WorkersAt; a killed worker's own loop
// just stops, the others never fail. At the end every survivor has seen
// each iteration summed over exactly the workers alive at it: all five
// until a worker's kill, without it from the iteration it was killed in
// on (every worker had the sums of the one before, and none can have that
// iteration's without the killer's pushes, made after the kill).
func TestMembershipStressWorkers(t *testing.T) {
	const events, every, workers = 50, 10, 5
	const iters = events * every
	driver := node.WorkerID(0)
	for _, lbMode := range []string{"off", "on"} {
		t.Run("LB "+lbMode, func(t *testing.T) {
			c := startMem(t, 2, workers, map[string]string{
				"FPT_PARTITION_BYTES": memPartitionBytes, "FPT_LB": lbMode,
				"FPT_ON_SERVER_LOSS": "retry", "FPT_ON_WORKER_LOSS": "continue",
			})
			rng := rand.New(rand.NewPCG(14, uint64(len(lbMode))))
			ids := []node.ID{node.ServerID(0), node.ServerID(1)}
			var serverKills, joins int
			// killedAt: each killed worker, with the iteration the driver
			// killed it in; read by the victims' goroutines.
			var mu sync.Mutex
			killedAt := map[node.ID]int{}
			killed := func(id node.ID) (int, bool) {
				mu.Lock()
				defer mu.Unlock()
				it, ok := killedAt[id]
				return it, ok
			}
			event := func(w *worker.Worker, it int) error {
				if w.Node().Self().ID != driver || it%every != 0 {
					return nil
				}
				var candidates []node.ID // the workers it may kill
				for r := range workers {
					if id := node.WorkerID(r); id != driver {
						if _, dead := killed(id); !dead {
							candidates = append(candidates, id)
						}
					}
				}
				switch live := w.Node().Servers(); {
				case len(candidates) > 1 && rng.IntN(6) == 0:
					victim := candidates[rng.IntN(len(candidates))]
					mu.Lock()
					killedAt[victim] = it
					mu.Unlock()
					return c.Kill(victim)
				case len(live) > 1 && rng.IntN(2) == 0:
					serverKills++
					return c.Kill(live[rng.IntN(len(live))])
				}
				var err error
				ids, err = joinServer(c, ids, it)
				joins++
				return err
			}
			// seen[rank][it] is WorkersAt(it) as the worker saw it once its
			// pull of it completed: final from then on.
			seen := make([][][]node.ID, workers)
			for r := range seen {
				seen[r] = make([][]node.ID, iters+1)
			}
			h := hooks{
				before: event,
				pulled: func(w *worker.Worker, it int) error {
					seen[w.Rank()][it] = w.WorkersAt(uint64(it))
					return nil
				},
			}
			survive(t, c, iters, h, func(id node.ID) bool { _, dead := killed(id); return dead }, 3*time.Minute)
			t.Logf("%d server kills, %d joins, workers killed at %v; server ids %v", serverKills, joins, killedAt, ids)
			if serverKills < 10 || joins < 10 || len(killedAt) != workers-2 {
				t.Errorf("%d server kills, %d joins and %d worker kills: the stress did not exercise each (want 10, 10, %d)",
					serverKills, joins, len(killedAt), workers-2)
			}
			// alive is the workers whose pushes iteration it adds up.
			alive := func(it int) []node.ID {
				var out []node.ID
				for r := range workers {
					if at, dead := killedAt[node.WorkerID(r)]; !dead || it < at {
						out = append(out, node.WorkerID(r))
					}
				}
				return out
			}
			for _, w := range c.Workers {
				id := w.Node().Self().ID
				if _, dead := killedAt[id]; dead {
					continue
				}
				seen[w.Rank()][0] = w.WorkersAt(0)
				for it, got := range seen[w.Rank()] {
					if it > 0 && !isSubset(got, seen[w.Rank()][it-1]) {
						t.Errorf("worker %d: iteration %d summed over %v, %d over %v: a worker came back",
							w.Rank(), it-1, seen[w.Rank()][it-1], it, got)
					}
					if want := alive(it); !slices.Equal(got, want) {
						t.Errorf("worker %d: iteration %d summed over %v, want %v (workers killed at %v)", w.Rank(), it, got, want, killedAt)
					}
					if now := w.WorkersAt(uint64(it)); !slices.Equal(now, got) {
						t.Errorf("worker %d: iteration %d was summed over %v when its pull completed, WorkersAt now says %v",
							w.Rank(), it, got, now)
					}
				}
				if got, want := w.Node().Servers(), c.Workers[0].Node().Servers(); !slices.Equal(got, want) {
					t.Errorf("worker %d ends with servers %v, worker 0 with %v", w.Rank(), got, want)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := c.Finish(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestServerJoinsAfterWorkerLoss: under FPT_ON_WORKER_LOSS=continue and
// FPT_ON_SERVER_LOSS=retry, a server started after a worker left joins
// the job, and the sums stay exact. The joiner's node table lists fewer
// workers than DMLC_NUM_WORKER, and it must sum over the workers left, not
// wait for the lost one's pushes.
func TestServerJoinsAfterWorkerLoss(t *testing.T) {
	const iters, killAt, joinAt = 10, 3, 6
	victim := node.WorkerID(2)
	c := startMem(t, 1, 3, map[string]string{
		"FPT_PARTITION_BYTES": memPartitionBytes, "FPT_LB": "off",
		"FPT_ON_SERVER_LOSS": "retry", "FPT_ON_WORKER_LOSS": "continue",
	})
	var joined node.ID // written by worker 0's goroutine, read after survive
	survive(t, c, iters, hooks{before: func(w *worker.Worker, it int) error {
		if w.Rank() != 0 {
			return nil
		}
		switch it {
		case killAt:
			return c.Kill(victim)
		case joinAt:
			id, err := c.AddServer()
			if err != nil {
				return fmt.Errorf("a server joining after %s left: %w", victim, err)
			}
			joined = id
		}
		return nil
	}}, func(id node.ID) bool { return id == victim }, time.Minute)
	for _, w := range c.Workers[:2] {
		if got := w.Node().Servers(); !slices.Equal(got, []node.ID{node.ServerID(0), joined}) {
			t.Errorf("worker %d: servers %v, want %s and the joined server", w.Rank(), got, node.ServerID(0))
		}
		if got := w.WorkersAt(iters); !slices.Equal(got, []node.ID{node.WorkerID(0), node.WorkerID(1)}) {
			t.Errorf("worker %d: iteration %d summed over %v, want workers 0 and 1", w.Rank(), iters, got)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Finish(ctx); err != nil {
		t.Fatal(err)
	}
}

// joinServer starts a server in c at iteration it, and returns ids (the
// server ids given so far) with its id added: an id no node had, larger
// than every one before it.
func joinServer(c *memcluster.Cluster, ids []node.ID, it int) ([]node.ID, error) {
	id, err := c.AddServer()
	if err != nil {
		return ids, fmt.Errorf("iteration %d: a server joining: %w", it, err)
	}
	if slices.Contains(ids, id) || id < slices.Max(ids) {
		return ids, fmt.Errorf("iteration %d: a joining server got %s; ids given so far: %v", it, id, ids)
	}
	return append(ids, id), nil
}

// survive runs fptWorker on every worker of c for iters iterations with
// hooks h. A worker for which killed is true once its loop ends was killed:
// its error is expected. Any other worker's error fails the test and ends
// the cluster, as does a loop still running after limit (a survivor
// waiting for a sum that never comes): the test fails fast, not at its
// timeout.
func survive(t *testing.T, c *memcluster.Cluster, iters int, h hooks, killed func(node.ID) bool, limit time.Duration) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, len(c.Workers))
	for _, w := range c.Workers {
		wg.Go(func() {
			err := fptWorker(w, len(c.Workers), iters, h)
			if err == nil || killed(w.Node().Self().ID) {
				return
			}
			errs <- fmt.Errorf("worker %d: %w", w.Rank(), err)
			// The others would wait for it at their next barrier for
			// ever.
			go c.Close()
		})
	}
	stuck := time.AfterFunc(limit, func() {
		t.Errorf("the workers did not finish within %s", limit)
		c.Close()
	})
	wg.Wait()
	stuck.Stop()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}
}

// isSubset reports whether every id of sub is in set.
func isSubset(sub, set []node.ID) bool {
	for _, id := range sub {
		if !slices.Contains(set, id) {
			return false
		}
	}
	return true
}
