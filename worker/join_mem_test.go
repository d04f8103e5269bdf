package worker_test

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fptps/fpt/internal/memcluster"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/worker"
)

// model is a worker's simulated model for the join tests: parameters that
// start as Init's values and add every iteration's sums, so that every
// worker, a joiner included, must hold the same ones at the end.
type model struct {
	keys   []uint64
	lens   []int
	offs   map[uint64]int
	params []float32
}

func newModel() *model {
	m := &model{offs: make(map[uint64]int)}
	total := 0
	for _, tn := range memTensors {
		m.keys, m.lens = append(m.keys, tn.key), append(m.lens, tn.elems)
		m.offs[tn.key] = total
		total += tn.elems
	}
	m.params = make([]float32, total)
	return m
}

// source is the model's worker.ParamsSource.
func (m *model) source(_, key uint64, dst []byte) error {
	off, ok := m.offs[key]
	if !ok {
		return fmt.Errorf("no key %d", key)
	}
	copy(dst, worker.AsBytes(m.params[off:off+len(dst)/4]))
	return nil
}

// trainJoinable trains m on w from its start iteration to iters, checking
// every sum against the workers it adds up; a worker that joined gets its
// parameters from Init. There is no barrier between iterations: a joining
// worker takes part in barriers from its admission on, and the others
// would wait at one for a joiner that waits for their next push.
func trainJoinable(ctx context.Context, w *worker.Worker, m *model, iters int, h hooks) error {
	kv := worker.NewKV[float32](w)
	w.SetParamsSource(m.source)
	if err := w.SetTensorsPerIteration(len(m.keys)); err != nil {
		return err
	}
	for i, k := range m.keys {
		if err := kv.Declare(k, m.lens[i], -int32(i)); err != nil {
			return err
		}
	}
	off := 0
	for _, tn := range memTensors {
		for j := range tn.elems {
			m.params[off+j] = grad(0, 0, tn.key, j)
		}
		off += tn.elems
	}
	mine := slices.Clone(m.params)
	if err := kv.Init(ctx, m.keys, m.params, m.lens); err != nil {
		return fmt.Errorf("init: %w", err)
	}
	if !w.Joined() && !slices.Equal(mine, m.params) {
		return fmt.Errorf("init: not worker 0's values")
	}
	grads, sums := make([]float32, len(m.params)), make([]float32, len(m.params))
	for it := int(w.StartIteration()); it <= iters; it++ {
		if h.before != nil {
			if err := h.before(w, it); err != nil {
				return err
			}
		}
		off := 0
		for _, tn := range memTensors {
			for j := range tn.elems {
				grads[off+j] = grad(w.Node().Self().ID.Rank(), it, tn.key, j)
			}
			off += tn.elems
		}
		var reqs []int
		off = 0
		for i := range m.keys {
			ts, err := kv.FPTPush(m.keys[i:i+1], grads[off:off+m.lens[i]], m.lens[i:i+1], -int32(i), nil)
			if err != nil {
				return fmt.Errorf("iteration %d: push: %w", it, err)
			}
			reqs = append(reqs, ts)
			off += m.lens[i]
		}
		ts, err := kv.FPTPull(m.keys, sums, m.lens, nil)
		if err != nil {
			return fmt.Errorf("iteration %d: pull: %w", it, err)
		}
		for _, r := range append(reqs, ts) {
			if err := kv.Wait(r); err != nil {
				return fmt.Errorf("iteration %d: %w", it, err)
			}
		}
		ids := w.WorkersAt(uint64(it))
		off = 0
		for _, tn := range memTensors {
			for j := range tn.elems {
				var want float32
				for _, id := range ids {
					want += grad(id.Rank(), it, tn.key, j)
				}
				if sums[off+j] != want {
					return fmt.Errorf("iteration %d (workers %v): key %d element %d is %v, want %v", it, ids, tn.key, j, sums[off+j], want)
				}
				m.params[off+j] += sums[off+j]
			}
			off += tn.elems
		}
	}
	return nil
}

// TestWorkerJoins starts a third worker while a 2×2 job trains: it is
// admitted with the next worker id, gets the parameters the others have
// at the start of its first iteration, and every sum from then on adds
// up its pushes, exactly, as WorkersAt says; all three end with the same
// parameters.
func TestWorkerJoins(t *testing.T) {
	const iters, joinAt = 30, 4
	for _, tt := range []struct {
		name string
		env  map[string]string
	}{
		{"LB on", map[string]string{"FPT_LB": "on"}},
		{"LB off, continue", map[string]string{"FPT_LB": "off", "FPT_ON_WORKER_LOSS": "continue"}},
		{"LB on, retry", map[string]string{"FPT_LB": "on", "FPT_ON_SERVER_LOSS": "retry"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			env := map[string]string{"FPT_PARTITION_BYTES": memPartitionBytes}
			for k, v := range tt.env {
				env[k] = v
			}
			c := startMem(t, 2, 2, env)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			models := []*model{newModel(), newModel(), newModel()}
			old := slices.Clone(c.Workers)
			j := trainWithJoiner(t, ctx, cancel, c, models, iters, joinAt)
			if t.Failed() {
				return
			}
			if id := j.Node().Self().ID; id != node.WorkerID(2) || !j.Joined() {
				t.Errorf("the joiner is %s (joined %v), want %s", id, j.Joined(), node.WorkerID(2))
			}
			cloned, kept := j.JoinCopies()
			t.Logf("the joiner's parameters: %d bytes kept where they were read, %d copied out of the van's buffer", kept, cloned)
			first := j.StartIteration()
			if first <= joinAt || first > iters {
				t.Fatalf("the joiner started at iteration %d, want within (%d, %d]", first, joinAt, iters)
			}
			for _, w := range append(old, j) {
				if got := w.WorkersAt(first - 1); w != j && len(got) != 2 {
					t.Errorf("%s: iteration %d summed over %v, want the 2 first workers", w.Node().Self().ID, first-1, got)
				}
				if got := w.WorkersAt(iters); !slices.Equal(got, []node.ID{node.WorkerID(0), node.WorkerID(1), node.WorkerID(2)}) {
					t.Errorf("%s: iteration %d summed over %v, want all 3", w.Node().Self().ID, iters, got)
				}
			}
			for i, m := range models[1:] {
				if !slices.Equal(m.params, models[0].params) {
					t.Errorf("worker %d's parameters differ from worker 0's at the end", i+1)
				}
			}
			if err := c.Finish(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestWorkerJoinsTooLate: a worker that joins once the others have
// trained their last iteration has nothing to train: when they finish,
// it is told so (its Init fails, saying why) instead of waiting for
// parameters no worker will hand over, and the job ends cleanly.
func TestWorkerJoinsTooLate(t *testing.T) {
	const iters = 3
	c := startMem(t, 1, 2, map[string]string{"FPT_PARTITION_BYTES": memPartitionBytes, "FPT_LB": "on"})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	old := slices.Clone(c.Workers)
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for _, w := range old {
		wg.Go(func() {
			if err := trainJoinable(ctx, w, newModel(), iters, hooks{}); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	j, err := c.AddWorker()
	if err != nil {
		t.Fatal(err)
	}
	joinerErr := make(chan error, 1)
	go func() { joinerErr <- trainJoinable(ctx, j, newModel(), iters, hooks{}) }()
	for _, w := range old {
		wg.Go(func() {
			if err := w.Finalize(ctx); err != nil {
				errs <- fmt.Errorf("finalize: %w", err)
			}
		})
	}
	report(t, &wg, errs)
	if err := <-joinerErr; err == nil || !strings.Contains(err.Error(), "joined too late to train") {
		t.Errorf("the late joiner's training: %v, want it told it joined too late", err)
	}
	ends, err := c.Ends(ctx)
	if err != nil || len(ends) != 0 {
		t.Fatalf("the scheduler and server ended with %v, %v", ends, err)
	}
}

// TestWorkerLossWait kills worker 2 of a 2×3 job under
// FPT_ON_WORKER_LOSS=wait, then starts a replacement: the two left sum
// the iterations granted over themselves, then hold until it joins; it
// gets a new id and the parameters, and the sums count it from its first
// iteration; all three end with the same parameters.
func TestWorkerLossWait(t *testing.T) {
	const iters, killAt = 30, 5
	for _, lbMode := range []string{"off", "on"} {
		t.Run("LB "+lbMode, func(t *testing.T) {
			c := startMem(t, 2, 3, map[string]string{
				"FPT_PARTITION_BYTES": memPartitionBytes, "FPT_LB": lbMode, "FPT_ON_WORKER_LOSS": "wait",
			})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			victim := node.WorkerID(2)
			old := slices.Clone(c.Workers)
			models := []*model{newModel(), newModel(), newModel(), newModel()}
			errs := make(chan error, 8)
			var wg sync.WaitGroup
			killed := make(chan struct{})
			victimEnded := make(chan error, 1)
			for i, w := range old {
				wg.Go(func() {
					err := trainJoinable(ctx, w, models[i], iters, hooks{before: func(w *worker.Worker, it int) error {
						if w.Node().Self().ID == victim && it == killAt {
							defer close(killed)
							return c.Kill(victim)
						}
						return nil
					}})
					switch {
					case w.Node().Self().ID == victim:
						victimEnded <- err
					case err != nil:
						errs <- fmt.Errorf("%s: %w", w.Node().Self().ID, err)
					}
				})
			}
			select {
			case <-killed:
			case err := <-victimEnded:
				t.Fatalf("%s's training ended before it was killed: %v", victim, err)
			case <-ctx.Done():
				t.Fatalf("%s never reached iteration %d", victim, killAt)
			}
			j, err := c.AddWorker()
			if err != nil {
				t.Fatal(err)
			}
			wg.Go(func() {
				if err := trainJoinable(ctx, j, models[3], iters, hooks{}); err != nil {
					errs <- fmt.Errorf("replacement: %w", err)
				}
			})
			report(t, &wg, errs)
			if t.Failed() {
				return
			}
			if id := j.Node().Self().ID; id != node.WorkerID(3) {
				t.Errorf("the replacement is %s, want %s: an id no node had", id, node.WorkerID(3))
			}
			first := j.StartIteration()
			w0 := old[0]
			three := []node.ID{node.WorkerID(0), node.WorkerID(1), node.WorkerID(3)}
			if got := w0.WorkersAt(first); !slices.Equal(got, three) {
				t.Errorf("iteration %d (the replacement's first) summed over %v, want %v", first, got, three)
			}
			if got := w0.WorkersAt(first - 1); len(got) != 2 {
				t.Errorf("iteration %d summed over %v, want the 2 workers left", first-1, got)
			}
			for i, m := range []*model{models[1], models[3]} {
				if !slices.Equal(m.params, models[0].params) {
					t.Errorf("worker %d's parameters differ from worker 0's at the end", []int{1, 3}[i])
				}
			}
			if err := c.Finish(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestMembershipStressJoins runs 500 iterations of a 2×3 job under
// FPT_ON_SERVER_LOSS=retry and FPT_ON_WORKER_LOSS=continue through 50
// membership events, one every 10 iterations, drawn by worker 0 (never
// killed): a worker killed (while two others live), a worker started, a
// server killed (while another lives) or a server started. A loss waits
// while a joiner's first iteration is still ahead (the job would refuse
// it). Every pulled value is checked exactly against WorkersAt, ids are
// never reused, and every worker alive at the end holds the same
// parameters, joiners included.
func TestMembershipStressJoins(t *testing.T) {
	const events, every, iters = 50, 10, 500
	driver := node.WorkerID(0)
	for _, lbMode := range []string{"off", "on"} {
		t.Run("LB "+lbMode, func(t *testing.T) {
			c := startMem(t, 2, 3, map[string]string{
				"FPT_PARTITION_BYTES": memPartitionBytes, "FPT_LB": lbMode,
				"FPT_ON_SERVER_LOSS": "retry", "FPT_ON_WORKER_LOSS": "continue",
			})
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			rng := rand.New(rand.NewPCG(23, uint64(len(lbMode))))
			var (
				mu      sync.Mutex
				wg      sync.WaitGroup
				errs    = make(chan error, 64)
				models  = map[node.ID]*model{}
				dead    = map[node.ID]bool{}
				joiners []*worker.Worker
				ids     = []node.ID{node.ServerID(0), node.ServerID(1), node.WorkerID(0), node.WorkerID(1), node.WorkerID(2)}
				counts  = map[string]int{}
			)
			var h hooks
			train := func(w *worker.Worker) {
				id := w.Node().Self().ID
				m := newModel()
				mu.Lock()
				models[id] = m
				mu.Unlock()
				wg.Go(func() {
					err := trainJoinable(ctx, w, m, iters, h)
					mu.Lock()
					killed := dead[id]
					mu.Unlock()
					if err != nil && !killed {
						errs <- fmt.Errorf("%s: %w", id, err)
						cancel()
					}
				})
			}
			newID := func(id node.ID) error {
				if slices.Contains(ids, id) {
					return fmt.Errorf("id %s given twice (ids so far %v)", id, ids)
				}
				ids = append(ids, id)
				return nil
			}
			h.before = func(w *worker.Worker, it int) error {
				if w.Node().Self().ID != driver || it%every != 0 || it/every > events {
					return nil
				}
				mu.Lock()
				defer mu.Unlock()
				pending := slices.ContainsFunc(joiners, func(j *worker.Worker) bool {
					first := j.StartIteration()
					return !dead[j.Node().Self().ID] && (first == 0 || int(first) > it)
				})
				var live []node.ID
				for id := range models {
					if id != driver && !dead[id] {
						live = append(live, id)
					}
				}
				slices.Sort(live)
				servers := w.Node().Servers()
				switch r := rng.IntN(4); {
				case !pending && r == 0 && len(live) > 1:
					victim := live[rng.IntN(len(live))]
					dead[victim] = true
					counts["worker kills"]++
					return c.Kill(victim)
				case !pending && r == 1 && len(servers) > 1:
					counts["server kills"]++
					return c.Kill(servers[rng.IntN(len(servers))])
				case r == 2 || len(live) < 2:
					j, err := c.AddWorker()
					if err != nil {
						return fmt.Errorf("iteration %d: a worker joining: %w", it, err)
					}
					counts["worker joins"]++
					joiners = append(joiners, j)
					mu.Unlock()
					train(j)
					mu.Lock()
					return newID(j.Node().Self().ID)
				default:
					id, err := c.AddServer()
					if err != nil {
						return fmt.Errorf("iteration %d: a server joining: %w", it, err)
					}
					counts["server joins"]++
					return newID(id)
				}
			}
			for _, w := range slices.Clone(c.Workers) {
				train(w)
			}
			report(t, &wg, errs)
			if t.Failed() {
				return
			}
			t.Logf("events %v; ids %v", counts, ids)
			for _, kind := range []string{"worker kills", "server kills", "worker joins", "server joins"} {
				if counts[kind] < 5 {
					t.Errorf("%d %s: the stress did not exercise it (want 5)", counts[kind], kind)
				}
			}
			want := models[driver].params
			for id, m := range models {
				if !dead[id] && !slices.Equal(m.params, want) {
					t.Errorf("%s's parameters differ from worker 0's at the end", id)
				}
			}
			if err := c.Finish(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// trainWithJoiner trains c's workers for iters iterations (trainJoinable,
// worker i into models[i]) while a worker joins once worker 0 begins
// iteration joinAt; the joiner trains into the model after theirs. It
// returns the joiner once all are done, errors reported on t (nil, the
// test failed, where none joined); cancel ends the others' training where
// the join fails.
func trainWithJoiner(t *testing.T, ctx context.Context, cancel context.CancelFunc, c *memcluster.Cluster, models []*model, iters, joinAt int) *worker.Worker {
	t.Helper()
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	joined := make(chan *worker.Worker, 1)
	old := slices.Clone(c.Workers)
	for i, w := range old {
		wg.Go(func() {
			errs <- trainJoinable(ctx, w, models[i], iters, hooks{before: func(w *worker.Worker, it int) error {
				if w.Rank() == 0 && it == joinAt {
					go func() {
						j, err := c.AddWorker()
						if err != nil {
							errs <- fmt.Errorf("joining: %w", err)
							cancel()
							close(joined)
							return
						}
						joined <- j
					}()
				}
				return nil
			}})
		})
	}
	j, ok := <-joined
	if ok {
		wg.Go(func() {
			if err := trainJoinable(ctx, j, models[len(old)], iters, hooks{}); err != nil {
				errs <- fmt.Errorf("joiner: %w", err)
			}
		})
	}
	report(t, &wg, errs)
	return j
}

// report fails t with every error sent on errs, once wg's goroutines are
// done.
func report(t *testing.T, wg *sync.WaitGroup, errs chan error) {
	t.Helper()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// TestWorkerJoinRefused: a job whose program registered no parameters
// source cannot be joined: the joiner's Init fails saying so, and under
// FPT_ON_WORKER_LOSS=continue the others go on without it. Over the real
// van with partitions of 8 bytes (the least there is), the refusal is cut
// to what a Params frame may carry: a longer one is a frame too large for
// the joiner's van, which ends the connection and loses the reason.
func TestWorkerJoinRefused(t *testing.T) {
	const iters = 30
	env := map[string]string{"FPT_LB": "on", "FPT_ON_WORKER_LOSS": "continue"}
	for _, tt := range []struct {
		name  string
		part  string
		start func(env map[string]string) (ws []*worker.Worker, add func() (*worker.Worker, error), finish func() error)
	}{
		{"in memory", memPartitionBytes, func(env map[string]string) ([]*worker.Worker, func() (*worker.Worker, error), func() error) {
			c := startMem(t, 1, 2, env)
			return slices.Clone(c.Workers), c.AddWorker, func() error { return nil }
		}},
		{"sockets, partitions of 8 bytes", "8", func(env map[string]string) ([]*worker.Worker, func() (*worker.Worker, error), func() error) {
			c := mustStart(t, 1, 2, env)
			finish := func() error {
				for range c.nodes {
					if err := <-c.errs; err != nil {
						return err
					}
				}
				return nil
			}
			return c.workers, c.addWorker, finish
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			env := maps.Clone(env)
			env["FPT_PARTITION_BYTES"] = tt.part
			ws, add, finish := tt.start(env)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var wg sync.WaitGroup
			errs := make(chan error, 4)
			joinerErr := make(chan error, 1)
			for _, w := range ws {
				wg.Go(func() {
					err := trainJoinable(ctx, w, newModel(), iters, hooks{before: func(w *worker.Worker, it int) error {
						w.SetParamsSource(nil) // as a program that registers none
						if w.Rank() == 0 && it == 3 {
							go func() {
								j, err := add()
								if err != nil {
									joinerErr <- err
									return
								}
								joinerErr <- trainJoinable(ctx, j, newModel(), iters, hooks{})
							}()
						}
						return nil
					}})
					if err == nil {
						err = w.Finalize(ctx)
					}
					errs <- err
				})
			}
			report(t, &wg, errs)
			if err := <-joinerErr; err == nil || !strings.Contains(err.Error(), "cannot hand over the parameters") {
				t.Fatalf("the joiner's training: %v, want the refusal", err)
			}
			if err := finish(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
