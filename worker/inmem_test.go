package worker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fptps/fpt/cluster"
	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/internal/memcluster"
	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/van"
	"github.com/fptps/fpt/worker"
)

// The tests in this file run whole clusters (the real scheduler, servers
// and workers) on the in-memory transports: no socket, no ZeroMQ, and the
// network under the test's control.

func startMem(t *testing.T, servers, workers int, env map[string]string) *memcluster.Cluster {
	t.Helper()
	c, err := memcluster.Start(context.Background(), memcluster.Options{Servers: servers, Workers: workers, Env: env})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// grad is worker rank's gradient element j of key at iteration it: small
// integers, so that float32 sums are exact in any order.
func grad(rank, it int, key uint64, j int) float32 {
	return float32((rank*7+it*13+int(key)*3+j)%61) - 30
}

// memTensors are the keys and their sizes: one empty, one of a single
// element, and several spanning many partitions of FPT_PARTITION_BYTES.
var memTensors = []struct {
	key   uint64
	elems int
}{{0, 1000}, {1, 1}, {2, 0}, {3, 5000}, {7, 333}, {1 << 40, 2048}}

const memPartitionBytes = "1024"

// hooks run on each worker at points of each iteration (nil: none).
type hooks struct {
	before func(w *worker.Worker, it int) error // ahead of the pushes
	pulled func(w *worker.Worker, it int) error // once the sums are checked, ahead of the barrier
}

// fptRounds has every worker push and pull memTensors for iters
// iterations, checking every pulled value exactly: worker 0's after Init,
// the sum of every worker's gradient afterwards.
func fptRounds(t *testing.T, ws []*worker.Worker, iters int, h hooks) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, len(ws))
	for _, w := range ws {
		wg.Go(func() {
			if err := fptWorker(w, len(ws), iters, h); err != nil {
				errs <- fmt.Errorf("worker %d: %w", w.Rank(), err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func fptWorker(w *worker.Worker, workers, iters int, h hooks) error {
	ctx := context.Background()
	kv := worker.NewKV[float32](w)
	if err := w.SetTensorsPerIteration(len(memTensors)); err != nil {
		return err
	}
	keys, lens := make([]uint64, len(memTensors)), make([]int, len(memTensors))
	total := 0
	for i, tn := range memTensors {
		keys[i], lens[i] = tn.key, tn.elems
		total += tn.elems
		if err := kv.Declare(tn.key, tn.elems, -int32(i)); err != nil {
			return err
		}
	}
	vals, sums := make([]float32, total), make([]float32, total)
	fill := func(it int) {
		off := 0
		for _, tn := range memTensors {
			for j := range tn.elems {
				vals[off+j] = grad(w.Rank(), it, tn.key, j)
			}
			off += tn.elems
		}
	}
	verify := func(it int, got []float32) error {
		// The workers whose pushes the sums add up: all of them, unless
		// one was lost under FPT_ON_WORKER_LOSS=continue.
		ids := w.WorkersAt(uint64(it))
		if len(ids) == 0 || len(ids) > workers {
			return fmt.Errorf("iteration %d: summed over workers %v of %d", it, ids, workers)
		}
		off := 0
		for _, tn := range memTensors {
			for j := range tn.elems {
				want := grad(0, 0, tn.key, j)
				if it > 0 {
					want = 0
					for _, id := range ids {
						want += grad(id.Rank(), it, tn.key, j)
					}
				}
				if got[off+j] != want {
					return fmt.Errorf("iteration %d: key %d element %d is %v, want %v", it, tn.key, j, got[off+j], want)
				}
			}
			off += tn.elems
		}
		return nil
	}
	fill(0)
	if err := kv.Init(ctx, keys, vals, lens); err != nil {
		return fmt.Errorf("init: %w", err)
	}
	if err := verify(0, vals); err != nil {
		return err
	}
	for it := 1; it <= iters; it++ {
		if h.before != nil {
			if err := h.before(w, it); err != nil {
				return err
			}
		}
		fill(it)
		// Each tensor on its own, as a backward pass produces them.
		var pushes []int
		off := 0
		for i := range keys {
			ts, err := kv.FPTPush(keys[i:i+1], vals[off:off+lens[i]], lens[i:i+1], -int32(i), nil)
			if err != nil {
				return fmt.Errorf("iteration %d: push: %w", it, err)
			}
			pushes = append(pushes, ts)
			off += lens[i]
		}
		clear(sums)
		ts, err := kv.FPTPull(keys, sums, lens, nil)
		if err != nil {
			return fmt.Errorf("iteration %d: pull: %w", it, err)
		}
		for _, p := range append(pushes, ts) {
			if err := kv.Wait(p); err != nil {
				return fmt.Errorf("iteration %d: %w", it, err)
			}
		}
		if err := verify(it, sums); err != nil {
			return err
		}
		if h.pulled != nil {
			if err := h.pulled(w, it); err != nil {
				return err
			}
		}
		if err := w.Barrier(ctx, node.WorkerGroup); err != nil {
			return err
		}
	}
	return nil
}

func finishMem(t *testing.T, c *memcluster.Cluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Finish(ctx); err != nil {
		t.Fatal(err)
	}
}

// FPTPush and FPTPull on in-memory clusters: every pulled value is the
// exact sum, over several iterations, with the LB off (the even split over
// the servers) and on (its first decisions moving aggregation around).
func TestInMemoryFPTSums(t *testing.T) {
	tests := []struct {
		name             string
		servers, workers int
		env              map[string]string
		lb               bool // then the LB must have decided
	}{
		{"2s2w lb off", 2, 2, map[string]string{"FPT_LB": "off"}, false},
		{"2s2w lb on", 2, 2, map[string]string{"FPT_LB": "on", "FPT_LB_PROBE_EVERY": "2"}, true},
		{"1s3w lb off", 1, 3, map[string]string{"FPT_LB": "off"}, false},
		{"3s1w lb on", 3, 1, map[string]string{"FPT_LB": "on"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.env["FPT_PARTITION_BYTES"] = memPartitionBytes
			c := startMem(t, tt.servers, tt.workers, tt.env)
			fptRounds(t, c.Workers, 12, hooks{})
			for _, w := range c.Workers {
				if v := w.DecisionVersion(); (v > 0) != tt.lb {
					t.Errorf("worker %d is at decision %d with the LB on: %v", w.Rank(), v, tt.lb)
				}
			}
			finishMem(t, c)
		})
	}
}

// A long job's LB decisions do not pile up on the workers: with a probe
// every iteration the LB decides every iteration or two, and each worker
// holds only the decisions of the iterations in flight, while the sums
// stay exact and WorkersAt answers for every iteration.
func TestInMemoryScheduleBounded(t *testing.T) {
	const iters = 600
	c := startMem(t, 2, 2, map[string]string{"FPT_LB": "on", "FPT_LB_PROBE_EVERY": "1", "FPT_PARTITION_BYTES": memPartitionBytes})
	fptRounds(t, c.Workers, iters, hooks{})
	for _, w := range c.Workers {
		if v := w.DecisionVersion(); v < 40 {
			t.Fatalf("worker %d is at decision %d after %d iterations: too few to tell", w.Rank(), v, iters)
		}
		if n := w.ScheduleLen(); n > 8 {
			t.Errorf("worker %d holds %d of its %d decisions", w.Rank(), n, w.DecisionVersion()+1)
		}
		if ids := w.WorkersAt(1); len(ids) != 2 {
			t.Errorf("worker %d: WorkersAt(1) = %v", w.Rank(), ids)
		}
	}
	finishMem(t, c)
}

// forcedDecisions move aggregation of a 2×2 cluster between servers and
// workers at chosen iterations, from the initial even split over the
// servers: both workers, then a mix, one worker, one server, everyone.
func forcedDecisions() []lb.Decision {
	s0, s1 := node.ServerID(0), node.ServerID(1)
	w0, w1 := node.WorkerID(0), node.WorkerID(1)
	return []lb.Decision{
		{Version: 1, Iteration: 2, Aggregators: []node.ID{w0, w1}, Shares: []float64{0.5, 0.5}},
		{Version: 2, Iteration: 3, Aggregators: []node.ID{s0, w1, s1}, Shares: []float64{0.1, 0.6, 0.3}},
		{Version: 3, Iteration: 5, Aggregators: []node.ID{w0}, Shares: []float64{1}},
		{Version: 4, Iteration: 6, Aggregators: []node.ID{s1}, Shares: []float64{1}},
		{Version: 5, Iteration: 8, Aggregators: []node.ID{s1, w0, s0, w1}, Shares: []float64{0.4, 0.2, 0.2, 0.2}},
	}
}

// Decisions forced on every worker at chosen iterations (the LB off, so
// nothing else decides) move aggregation between servers and workers; the
// sums stay exact across each switch, and every worker has applied each.
func TestInMemoryForcedSwitches(t *testing.T) {
	decisions := forcedDecisions()
	c := startMem(t, 2, 2, map[string]string{"FPT_LB": "off", "FPT_PARTITION_BYTES": memPartitionBytes})
	for _, w := range c.Workers {
		for _, d := range decisions {
			if err := w.Follow(lb.Directive{Decision: &d, Shaping: true}); err != nil {
				t.Fatal(err)
			}
		}
	}
	fptRounds(t, c.Workers, 10, hooks{})
	for _, w := range c.Workers {
		if v := w.DecisionVersion(); v != 5 {
			t.Errorf("worker %d is at decision %d, want 5", w.Rank(), v)
		}
	}
	finishMem(t, c)
}

// One worker's sums arrive late: what the servers (every aggregator, with
// the LB off) send it is held from before an iteration's first push until
// the other worker has pulled and checked that iteration's sums. The late
// worker's values are still exact, and later iterations are not disturbed.
func TestInMemoryLateWorker(t *testing.T) {
	c := startMem(t, 2, 2, map[string]string{"FPT_LB": "off", "FPT_PARTITION_BYTES": memPartitionBytes})
	servers, slow := []node.ID{node.ServerID(0), node.ServerID(1)}, node.WorkerID(1)
	const late = 3
	fptRounds(t, c.Workers, 6, hooks{
		before: func(w *worker.Worker, it int) error {
			if it == late && w.Rank() == 0 {
				for _, s := range servers {
					c.Data.Hold(s, slow)
				}
			}
			return nil
		},
		pulled: func(w *worker.Worker, it int) error {
			if it == late && w.Rank() == 0 {
				for _, s := range servers {
					c.Data.Release(s, slow)
				}
			}
			return nil
		},
	})
	finishMem(t, c)
}

// The scheduler's messages to one worker arrive late, with the LB on and
// deciding often: from the moment another worker has checked an
// iteration's sums until it starts the next one, what the scheduler sends
// the slow worker (the barrier's release, decisions, grants) is held.
// Every value stays exact and every worker ends on the same decision.
func TestInMemoryLateControl(t *testing.T) {
	c := startMem(t, 2, 2, map[string]string{"FPT_LB": "on", "FPT_LB_PROBE_EVERY": "2", "FPT_PARTITION_BYTES": memPartitionBytes})
	sched, slow := c.ControlPort(node.SchedulerID), c.ControlPort(node.WorkerID(1))
	held := func(it int) bool { return it%3 == 1 } // and released before the last iteration
	fptRounds(t, c.Workers, 12, hooks{
		pulled: func(w *worker.Worker, it int) error {
			if held(it) && w.Rank() == 0 {
				c.Control.Hold(sched, slow)
			}
			return nil
		},
		before: func(w *worker.Worker, it int) error {
			if held(it-1) && w.Rank() == 0 {
				c.Control.Release(sched, slow)
			}
			return nil
		},
	})
	v0, v1 := c.Workers[0].DecisionVersion(), c.Workers[1].DecisionVersion()
	if v0 == 0 || v0 != v1 {
		t.Errorf("workers at decisions %d and %d; want the same, not 0", v0, v1)
	}
	finishMem(t, c)
}

// A node that vanishes while workers wait on it: a server (its sums held
// from the workers) or a worker (that never pushes its share). Every
// waiting worker's pending pull fails with an error naming that node, no
// call hangs, and the scheduler ends with the same verdict.
func TestInMemoryNodeLost(t *testing.T) {
	tests := []struct {
		name   string
		victim node.ID
	}{
		{"server", node.ServerID(1)},
		{"worker", node.WorkerID(1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := startMem(t, 2, 3, map[string]string{"FPT_LB": "off", "FPT_PARTITION_BYTES": memPartitionBytes})
			fptRounds(t, c.Workers, 2, hooks{})
			keys, lens := make([]uint64, len(memTensors)), make([]int, len(memTensors))
			total := 0
			for i, tn := range memTensors {
				keys[i], lens[i] = tn.key, tn.elems
				total += tn.elems
			}
			type pending struct {
				rank, ts int
				kv       *worker.KV[float32]
			}
			var pulls []pending
			for _, w := range c.Workers {
				self := node.WorkerID(w.Rank())
				if self == tt.victim {
					continue // it never pushes: the others wait for its share
				}
				c.Data.Hold(tt.victim, self) // a server's sums never come
				kv := worker.NewKV[float32](w)
				if _, err := kv.FPTPush(keys, make([]float32, total), lens, 0, nil); err != nil {
					t.Fatal(err)
				}
				// When the failure reaches the callback, the caller may
				// free the buffer: the van must be done with it by then.
				probe := &frame.Message{Header: frame.Header{Type: frame.Push, Recipient: 999}}
				ts, err := kv.FPTPull(keys, make([]float32, total), lens, func(err error) {
					if err == nil {
						return
					}
					if serr := w.Node().Van().Send(probe); !errors.Is(serr, van.ErrClosed) {
						t.Errorf("worker %d: the failed pull's callback ran with the van still open (a Send there: %v)", w.Rank(), serr)
					}
				})
				if err != nil {
					t.Fatal(err)
				}
				pulls = append(pulls, pending{w.Rank(), ts, kv})
			}
			if err := c.Drop(tt.victim); err != nil {
				t.Fatal(err)
			}
			errs := make(chan error, len(pulls))
			for _, p := range pulls {
				go func() {
					err := p.kv.Wait(p.ts)
					if err == nil {
						err = errors.New("Wait returned no error")
					}
					errs <- fmt.Errorf("worker %d: %w", p.rank, err)
				}()
			}
			for range pulls {
				select {
				case err := <-errs:
					if !strings.Contains(err.Error(), tt.victim.String()) {
						t.Errorf("pending pull ended with %v; want an error naming %s", err, tt.victim)
					} else {
						t.Log(err)
					}
				case <-time.After(time.Minute):
					t.Fatalf("a pending pull still waits a minute after %s was lost", tt.victim)
				}
			}
			c.Close()
			ends, err := c.Ends(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			named := false
			for _, e := range ends {
				named = named || strings.HasPrefix(e.Error(), "scheduler: "+tt.victim.String())
			}
			if !named {
				t.Errorf("the scheduler and servers ended with %v; want the scheduler's naming %s", ends, tt.victim)
			}
		})
	}
}

// A worker whose membership is closed without a failure (its van says
// Bye, nothing fails) still settles what is outstanding: a pull waiting for
// a worker that never pushed returns an error rather than waiting for
// ever, and its callback runs.
func TestInMemoryCloseSettlesPending(t *testing.T) {
	c := startMem(t, 1, 2, map[string]string{"FPT_LB": "off", "FPT_PARTITION_BYTES": memPartitionBytes})
	fptRounds(t, c.Workers, 1, hooks{})
	w := c.Workers[0] // worker 1 never pushes this round
	kv := worker.NewKV[float32](w)
	const key, elems = 3, 5000
	if _, err := kv.FPTPush([]uint64{key}, make([]float32, elems), []int{elems}, 0, nil); err != nil {
		t.Fatal(err)
	}
	called := make(chan error, 1)
	ts, err := kv.FPTPull([]uint64{key}, make([]float32, elems), []int{elems}, func(err error) { called <- err })
	if err != nil {
		t.Fatal(err)
	}
	c.Member(w.Node().Self().ID).Close()
	waited := make(chan error, 1)
	go func() { waited <- kv.Wait(ts) }()
	select {
	case err := <-waited:
		if !errors.Is(err, cluster.ErrTerminated) {
			t.Errorf("Wait after Close: %v, want cluster.ErrTerminated", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a pending pull still waits 30 s after its membership was closed")
	}
	if err := <-called; err == nil {
		t.Error("the callback ran with no error")
	}
}
