package worker_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/worker"
)

// TestServerLossRetry kills a server in the middle of an iteration of a
// 2×2 job under FPT_ON_SERVER_LOSS=retry: the job finishes every
// iteration over the server left, with every pulled value exact. In
// "one worker has the sum", the killed server's sums reach worker 0 but
// not worker 1 before it dies: worker 0 must push its values again
// although its own pull is complete (its push's buffer is still held),
// and ignore the second copy of the sums it has. The pull buffers are
// not the push buffers here; TestServerLossRetryInPlace covers those.
func TestServerLossRetry(t *testing.T) {
	const iters, killAt = 12, 5
	victim := node.ServerID(0)
	for _, tt := range []struct {
		name string
		lb   string
		// oneHasSum: only server 0's frames to worker 1 are held from
		// killAt on, so worker 0 completes that iteration and worker 1
		// does not; else both are held.
		oneHasSum bool
	}{
		{"LB off", "off", false},
		{"LB off, one worker has the sum", "off", true},
		{"LB on", "on", false},
		{"LB on, one worker has the sum", "on", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := startMem(t, 2, 2, map[string]string{
				"FPT_PARTITION_BYTES": memPartitionBytes, "FPT_LB": tt.lb, "FPT_ON_SERVER_LOSS": "retry",
			})
			killed := make(chan error, 1)
			fptRounds(t, c.Workers, iters, hooks{before: func(w *worker.Worker, it int) error {
				if w.Rank() != 0 || it != killAt {
					return nil
				}
				// Nobody can finish iteration killAt until the kill: its
				// pushes are on their way, and some sums held back.
				c.Data.Hold(victim, node.WorkerID(1))
				if !tt.oneHasSum {
					c.Data.Hold(victim, node.WorkerID(0))
				}
				time.AfterFunc(20*time.Millisecond, func() { killed <- c.Kill(victim) })
				return nil
			}})
			if err := <-killed; err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := c.Finish(ctx); err != nil {
				t.Fatalf("the job did not end cleanly after losing %s: %v", victim, err)
			}
			for _, w := range c.Workers {
				if got := w.Node().Servers(); len(got) != 1 || got[0] != node.ServerID(1) {
					t.Errorf("worker %d: servers %v after the loss, want [%s]", w.Rank(), got, node.ServerID(1))
				}
			}
		})
	}
}

// TestServerLossRetryInPlace is TestServerLossRetry with every pull into
// its own push's buffer, as MXNet's kvstore and in-place all-reduce do:
// worker 0 has the killed server's sums of iteration killAt in that
// buffer before the retry needs its gradients again. Its pull is deferred
// until every worker has the sums (the values stay its push's until
// then); were they overwritten, the retry would push sums as gradients.
// The job then outlives the 2 s a node gives a lost peer before failing
// on its own account: the peer left the job, nobody fails.
func TestServerLossRetryInPlace(t *testing.T) {
	const iters, killAt, elems = 10, 4, 5000
	victim := node.ServerID(0)
	c := startMem(t, 2, 2, map[string]string{
		"FPT_PARTITION_BYTES": memPartitionBytes, "FPT_LB": "off", "FPT_ON_SERVER_LOSS": "retry",
	})
	killed := make(chan error, 1)
	errs := make(chan error, 2)
	for _, w := range c.Workers {
		go func() {
			errs <- inPlaceRounds(w, iters, elems, killAt, func() {
				c.Data.Hold(victim, node.WorkerID(1))
				time.AfterFunc(20*time.Millisecond, func() { killed <- c.Kill(victim) })
			})
		}()
	}
	for range c.Workers {
		if err := <-errs; err != nil {
			t.Fatal(err) // the cleanup closes the cluster: the other worker's waits end
		}
	}
	if err := <-killed; err != nil {
		t.Fatal(err)
	}
	// A node that lost a peer fails on its own account after a grace of
	// 2 s unless the peer has left the job meanwhile: outlive it.
	time.Sleep(2500 * time.Millisecond)
	for _, w := range c.Workers {
		if err := w.Node().Err(); err != nil {
			t.Fatalf("worker %d failed after the server left: %v", w.Rank(), err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Finish(ctx); err != nil {
		t.Fatal(err)
	}
}

// inPlaceRounds pushes one key and pulls its sum into the same buffer,
// iters times, checking every value; worker 0 calls kill as iteration
// killAt begins.
func inPlaceRounds(w *worker.Worker, iters, elems, killAt int, kill func()) error {
	ctx := context.Background()
	kv := worker.NewKV[float32](w)
	if err := kv.Declare(3, elems, 0); err != nil {
		return err
	}
	buf := make([]float32, elems)
	for j := range buf {
		buf[j] = grad(w.Rank(), 0, 3, j)
	}
	if err := kv.Init(ctx, []uint64{3}, buf, []int{elems}); err != nil {
		return err
	}
	for it := 1; it <= iters; it++ {
		if it == killAt && w.Rank() == 0 {
			kill()
		}
		for j := range buf {
			buf[j] = grad(w.Rank(), it, 3, j)
		}
		push, err := kv.FPTPush([]uint64{3}, buf, []int{elems}, 0, nil)
		if err != nil {
			return err
		}
		pull, err := kv.FPTPull([]uint64{3}, buf, []int{elems}, nil)
		if err != nil {
			return err
		}
		if err := errors.Join(kv.Wait(push), kv.Wait(pull)); err != nil {
			return fmt.Errorf("worker %d iteration %d: %w", w.Rank(), it, err)
		}
		for j, got := range buf {
			if want := grad(0, it, 3, j) + grad(1, it, 3, j); got != want {
				return fmt.Errorf("worker %d iteration %d: element %d is %v, want %v", w.Rank(), it, j, got, want)
			}
		}
	}
	return nil
}

// TestServerJoins starts a second server while a 1×2 job trains: it gets
// an id no node had, every member adds it, and the LB gives it a share
// (at once with the LB off; after a probe of its links with the LB on):
// its aggregator then receives pushes. Every value stays exact.
func TestServerJoins(t *testing.T) {
	const iters, joinAt = 30, 3
	for _, lbMode := range []string{"off", "on"} {
		t.Run("LB "+lbMode, func(t *testing.T) {
			c := startMem(t, 1, 2, map[string]string{
				"FPT_PARTITION_BYTES": memPartitionBytes, "FPT_LB": lbMode, "FPT_ON_SERVER_LOSS": "retry",
			})
			joined := make(chan node.ID, 1)
			fptRounds(t, c.Workers, iters, hooks{before: func(w *worker.Worker, it int) error {
				if it > joinAt && lbMode == "on" {
					// Iterations of 40 ms: the LB probes the joined
					// server once it has been measured for
					// lb.Config.JoinSettle (500 ms).
					time.Sleep(40 * time.Millisecond)
				}
				if w.Rank() != 0 || it != joinAt {
					return nil
				}
				id, err := c.AddServer()
				joined <- id
				return err
			}})
			id := <-joined
			if id != node.ServerID(1) {
				t.Errorf("the joining server got id %s, want %s (the next server id)", id, node.ServerID(1))
			}
			for _, w := range c.Workers {
				if got := w.Node().Servers(); !slices.Equal(got, []node.ID{node.ServerID(0), id}) {
					t.Errorf("worker %d: servers %v", w.Rank(), got)
				}
			}
			var received uint64
			for _, p := range c.Member(id).Van().Stats() {
				received += p.ReceivedBytes
			}
			if received < 1<<10 {
				t.Errorf("the joined server received %d bytes: the LB gave it no share", received)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := c.Finish(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestMembershipStress runs 500 iterations of a 2×2 job through 50
// membership events, one every 10 iterations: a random live server
// killed (while another remains), or a new one started. Every pulled
// value is checked exactly, and no id is ever given twice.
func TestMembershipStress(t *testing.T) {
	const events, every = 50, 10
	for _, lbMode := range []string{"off", "on"} {
		t.Run("LB "+lbMode, func(t *testing.T) {
			c := startMem(t, 2, 2, map[string]string{
				"FPT_PARTITION_BYTES": memPartitionBytes, "FPT_LB": lbMode, "FPT_ON_SERVER_LOSS": "retry",
			})
			rng := rand.New(rand.NewPCG(14, uint64(len(lbMode))))
			ids := []node.ID{node.ServerID(0), node.ServerID(1)}
			var kills, joins int
			fptRounds(t, c.Workers, events*every, hooks{before: func(w *worker.Worker, it int) error {
				if w.Rank() != 0 || it%every != 0 {
					return nil
				}
				live := w.Node().Servers()
				if len(live) > 1 && rng.IntN(2) == 0 {
					kills++
					return c.Kill(live[rng.IntN(len(live))])
				}
				var err error
				if ids, err = joinServer(c, ids, it); err != nil {
					return err
				}
				joins++
				return nil
			}})
			t.Logf("%d kills, %d joins; server ids %v", kills, joins, ids)
			if kills < 10 || joins < 10 {
				t.Errorf("%d kills and %d joins: the stress did not exercise both", kills, joins)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := c.Finish(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestWorkerLossContinue kills worker 2 of a 2×3 job in the middle of
// iteration killAt under FPT_ON_WORKER_LOSS=continue: the two workers
// left finish every iteration, and every sum from killAt on adds up
// exactly their two pushes, as WorkersAt says (fptWorker checks every
// value against it). "Pushes half sent": the killed worker's frames to
// server 0 are held, so server 1's partial sums of killAt include its
// values and server 0's do not; both must be dropped. "One worker has
// the sum": it pushes everything, and the sums reach worker 0 but not
// worker 1 before it dies; worker 0's pull of killAt must not complete
// with the sum over three workers while worker 1's adds up two.
func TestWorkerLossContinue(t *testing.T) {
	const iters, killAt = 12, 5
	victim := node.WorkerID(2)
	for _, tt := range []struct {
		name      string
		lb        string
		oneHasSum bool
	}{
		{"LB off, pushes half sent", "off", false},
		{"LB off, one worker has the sum", "off", true},
		{"LB on, pushes half sent", "on", false},
		{"LB on, one worker has the sum", "on", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := startMem(t, 2, 3, map[string]string{
				"FPT_PARTITION_BYTES": memPartitionBytes, "FPT_LB": tt.lb, "FPT_ON_WORKER_LOSS": "continue",
			})
			held := []struct{ from, to node.ID }{{victim, node.ServerID(0)}}
			if tt.oneHasSum {
				held = []struct{ from, to node.ID }{{node.ServerID(0), node.WorkerID(1)}, {node.ServerID(1), node.WorkerID(1)}}
			}
			killed := make(chan error, 1)
			reached := make(chan struct{}) // closed once the victim reaches killAt
			survive(t, c, iters, hooks{before: func(w *worker.Worker, it int) error {
				if w.Node().Self().ID != victim || it != killAt {
					return nil
				}
				close(reached)
				for _, h := range held {
					c.Data.Hold(h.from, h.to)
				}
				go func() {
					time.Sleep(30 * time.Millisecond) // its pushes of killAt are out
					if err := c.Kill(victim); err != nil {
						killed <- err
						return
					}
					// Once worker 1 follows the retry, the old sums held
					// on their way to it may arrive: it must drop them.
					for c.Workers[1].NumWorkersAt(killAt) != 2 {
						time.Sleep(time.Millisecond)
					}
					for _, h := range held {
						c.Data.Release(h.from, h.to)
					}
					killed <- nil
				}()
				return nil
			}}, func(id node.ID) bool { return id == victim }, time.Minute)
			select {
			case <-reached:
			default:
				// Its error is the loss survive expects of it: the
				// others finished without it, and nothing would kill it.
				t.Fatalf("%s's training ended before iteration %d, where it was to be killed", victim, killAt)
			}
			if err := <-killed; err != nil {
				t.Fatal(err)
			}
			for _, w := range c.Workers[:2] {
				if r := w.RankAt(killAt); r != w.Rank() {
					t.Errorf("worker %d: rank %d at iteration %d, want %d", w.Rank(), r, killAt, w.Rank())
				}
				before, after := w.WorkersAt(killAt-1), w.WorkersAt(killAt)
				if len(before) != 3 || !slices.Equal(after, []node.ID{node.WorkerID(0), node.WorkerID(1)}) {
					t.Errorf("worker %d: iteration %d summed over %v, %d over %v; want all three, then workers 0 and 1",
						w.Rank(), killAt-1, before, killAt, after)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := c.Finish(ctx); err != nil {
				t.Fatalf("the job did not end cleanly after losing %s: %v", victim, err)
			}
		})
	}
}
