// Package trainer is fpt's simulated trainer: it drives a worker the way a
// data-parallel training loop does (declare the model's tensors, init them,
// then each iteration push every gradient and pull every sum) with values
// that are a pure function of (worker rank, iteration, key, element), so
// that every value pulled can be checked exactly against the expected sum.
//
// Values are small integers, so float sums are exact whatever the order of
// addition: a mismatch is a real routing, aggregation or iteration bug.
//
// It also keeps a model's parameters, as a real trainer does: Init's
// values, plus each iteration's sums once verified. A worker that joins the
// running job starts from the parameters the others hand over (its
// ParamsSource), and every worker ends with the same parameters, which it
// prints as a checksum.
package trainer

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"slices"
	"time"
	"unsafe"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/worker"
)

// Options shapes a simulated model and run.
type Options struct {
	Iterations int         // FPT iterations after init
	Tensors    int         // tensors per iteration
	MinBytes   int         // smallest tensor
	MaxBytes   int         // largest tensor; sizes are spaced geometrically between
	DType      frame.DType // Float32 or Float64
	Classic    int         // rounds of classic Push/Pull/PushPull after the FPT iterations
	Quiet      bool        // no per-iteration lines
	// ClassicFirst also runs Classic rounds of classic Push and Pull
	// before the FPT iterations, right after Init, by the job's initial
	// workers: the servers' stores then hold classic values while the job
	// trains (and a server may join), and the rounds after training
	// expect sums that include them. A worker that joins the running job
	// skips them (its Init has no barrier); none may join while they run,
	// as their barriers would count it.
	ClassicFirst bool
	// Compute is a pause before each iteration's pushes, standing for the
	// forward and backward pass: it stretches a run in time without CPU.
	Compute time.Duration
}

// DefaultOptions is a small model of mixed tensor sizes (4 KiB to 16 MiB).
func DefaultOptions() Options {
	return Options{Iterations: 10, Tensors: 8, MinBytes: 4 << 10, MaxBytes: 16 << 20, DType: frame.Float32, Classic: 2}
}

// Validate checks the options.
func (o Options) Validate() error {
	switch {
	case o.Iterations < 0 || o.Classic < 0:
		return errors.New("trainer: iterations must not be negative")
	case o.Compute < 0:
		return fmt.Errorf("trainer: compute time %s is negative", o.Compute)
	case o.Tensors < 1:
		return errors.New("trainer: at least one tensor")
	case o.MinBytes < 0 || o.MaxBytes < o.MinBytes:
		return fmt.Errorf("trainer: sizes %d..%d bytes are not a range", o.MinBytes, o.MaxBytes)
	case o.DType != frame.Float32 && o.DType != frame.Float64:
		return fmt.Errorf("trainer: dtype %s (want float32 or float64)", o.DType)
	}
	return nil
}

// Summary is what one worker measured.
type Summary struct {
	Rank       int
	Iterations int
	Tensors    int
	ModelBytes int64         // bytes of one iteration's tensors
	Elapsed    time.Duration // pushing and pulling in the FPT iterations (after init)
	// IterTimes is each FPT iteration's communication time, from its
	// first push until every pull and push was done (IterTimes[0] is
	// iteration 1); they add up to Elapsed. Synchronous training makes an
	// iteration take about as long on every worker.
	IterTimes []time.Duration
	Values    int64 // values checked
	// Start is the first FPT iteration this worker pushed: 1, or the
	// iteration it joined the running job at. Iterations counts from it.
	Start int
	// Checksum is FNV-64a of the parameters' bytes after the last
	// iteration: the same on every worker of a job.
	Checksum uint64
}

// addIteration records one more iteration's communication time d.
func (s *Summary) addIteration(d time.Duration) {
	s.Elapsed += d
	s.IterTimes = append(s.IterTimes, d)
	s.Iterations++
}

// GoodputGbps is bytes pushed plus bytes pulled per second, in Gbit/s.
func (s Summary) GoodputGbps() float64 {
	if s.Elapsed <= 0 {
		return 0
	}
	return float64(2*s.ModelBytes*int64(s.Iterations)) * 8 / s.Elapsed.Seconds() / 1e9
}

// Sizes returns the tensors' sizes in elements: geometric from MinBytes to
// MaxBytes, largest last, as in a network whose later layers are wider.
func (o Options) Sizes() []int {
	es := o.DType.Size()
	sizes := make([]int, o.Tensors)
	for i := range sizes {
		b := float64(o.MinBytes)
		if o.Tensors > 1 && o.MinBytes > 0 {
			b *= math.Pow(float64(o.MaxBytes)/float64(o.MinBytes), float64(i)/float64(o.Tensors-1))
		} else if o.MinBytes == 0 {
			b = float64(o.MaxBytes) * float64(i) / float64(max(o.Tensors-1, 1))
		}
		sizes[i] = int(b) / es
	}
	return sizes
}

// pause waits d, or until ctx ends.
func pause(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("trainer: %w", ctx.Err())
	}
}

// Value is the gradient element j of key on worker rank at iteration iter.
func Value(rank, iter int, key uint64, j int) float64 {
	return float64((rank*7 + iter*13 + int(key%97)*3 + j) % 61)
}

// Expected is the sum the workers' FPTPull must return: the sum over the
// workers of the given ranks (those whose pushes the iteration's sums add
// up: all W, unless one was lost under FPT_ON_WORKER_LOSS=continue),
// except iteration 0, where every worker gets worker 0's value.
func Expected(ranks []int, iter int, key uint64, j int) float64 {
	if iter == 0 {
		return Value(0, 0, key, j)
	}
	s := 0.0
	for _, r := range ranks {
		s += Value(r, iter, key, j)
	}
	return s
}

// ranksAt is the ranks of the workers whose pushes the sums of iteration
// iter add up.
func ranksAt(w *worker.Worker, iter int) []int {
	ids := w.WorkersAt(uint64(iter))
	ranks := make([]int, len(ids))
	for i, id := range ids {
		ranks[i] = id.Rank()
	}
	return ranks
}

// Run trains on w and writes progress to out. It returns an error on the
// first iteration with a wrong value.
func Run(ctx context.Context, w *worker.Worker, o Options, out io.Writer) (Summary, error) {
	if err := o.Validate(); err != nil {
		return Summary{}, err
	}
	if o.DType == frame.Float64 {
		return run[float64](ctx, w, o, out)
	}
	return run[float32](ctx, w, o, out)
}

func run[T worker.Float](ctx context.Context, w *worker.Worker, o Options, out io.Writer) (Summary, error) {
	kv := worker.NewKV[T](w)
	rank := w.Rank()
	sizes := o.Sizes()
	keys := make([]uint64, len(sizes))
	for i := range keys {
		keys[i] = uint64(i)
	}
	m := newModel[T](keys, sizes)
	if err := w.SetTensorsPerIteration(len(keys)); err != nil {
		return Summary{}, err
	}
	for i, k := range keys {
		// Earlier layers are needed first by the next forward pass.
		if err := kv.Declare(k, sizes[i], -int32(i)); err != nil {
			return Summary{}, err
		}
	}
	// Called, if this worker hands the parameters to a joiner, during its
	// first push of the join iteration: on this goroutine, before that
	// iteration's sums are added, so m.params are the start of it.
	w.SetParamsSource(m.source)
	model := m.bytes()
	grads := make([]T, len(m.params))
	sums := make([]T, len(m.params))
	sum := Summary{Rank: rank, Tensors: len(keys), ModelBytes: model, IterTimes: make([]time.Duration, 0, o.Iterations)}
	label := fmt.Sprintf("worker %d", rank)

	// The parameters start as Init's values: worker 0's, or on a worker
	// that joins the running job, the parameters the others have then.
	fill(m.params, sizes, keys, rank, 0)
	if err := kv.Init(ctx, keys, m.params, sizes); err != nil {
		return sum, fmt.Errorf("init: %w", err)
	}
	start := int(w.StartIteration())
	if start < 1 {
		return sum, fmt.Errorf("%s: start iteration %d after Init (want 1 or later)", label, start)
	}
	sum.Start = start
	var prev []int // the ranks the latest sums added up; nil: none yet
	if w.Joined() {
		// The parameters are the sums of iterations before this worker
		// came: the checksum at the end checks them against the others'.
		prev = ranksAt(w, start)
		fmt.Fprintf(out, "%s: joined the running job at iteration %d with worker %d's parameters; sums now over %d workers %v\n",
			label, start, handedBy(prev, rank), len(prev), prev)
	} else {
		n, err := check(m.params, sizes, keys, nil, 0)
		if err != nil {
			return sum, fmt.Errorf("%s: init: %w", label, err)
		}
		sum.Values += n
		prev = ranksAt(w, 0)
		if !o.Quiet {
			fmt.Fprintf(out, "%s: init: %d tensors, %s, every value is worker 0's\n", label, len(keys), human(model))
		}
	}
	// The classic rounds pushed before training: by the job's initial
	// workers, those of iteration 0 (a joiner's schedule may not go back
	// that far: they are ranks 0..NumWorkers-1, a joiner's is beyond).
	var early []classicRound
	if o.ClassicFirst {
		first := prev
		if w.Joined() {
			first = make([]int, w.NumWorkers())
			for r := range first {
				first[r] = r
			}
			for r := range o.Classic {
				early = append(early, classicRound{r, first})
			}
		} else {
			var n int64
			var err error
			early, n, err = classic(ctx, kv, o, keys, sizes, first, nil, false, out)
			sum.Values += n
			if err != nil {
				return sum, fmt.Errorf("%s: classic before training: %w", label, err)
			}
		}
	}

	// No barrier per iteration: a worker joining the job counts in the
	// job's barriers from its admission, while its first push is of an
	// iteration the others push only after that barrier, so they would
	// wait for it there as it waits for their push. The sums keep the
	// workers in step anyway (a pull completes once every worker pushed).
	for it := start; it <= o.Iterations; it++ {
		if err := pause(ctx, o.Compute); err != nil {
			return sum, err
		}
		fill(grads, sizes, keys, rank, it)
		// Only the communication is timed: generating and checking the
		// values would otherwise dominate on a small machine.
		t0 := time.Now()
		// Push every tensor on its own, like a backward pass producing
		// gradients layer by layer, then pull them all.
		var pushes []int
		off := 0
		for i := range keys {
			ts, err := kv.FPTPush(keys[i:i+1], grads[off:off+sizes[i]], sizes[i:i+1], -int32(i), nil)
			if err != nil {
				return sum, err
			}
			pushes = append(pushes, ts)
			off += sizes[i]
		}
		ts, err := kv.FPTPull(keys, sums, sizes, nil)
		if err != nil {
			return sum, err
		}
		if err := kv.Wait(ts); err != nil {
			return sum, fmt.Errorf("%s: iteration %d: %w", label, it, err)
		}
		for _, p := range pushes {
			if err := kv.Wait(p); err != nil {
				return sum, fmt.Errorf("%s: iteration %d: %w", label, it, err)
			}
		}
		d := time.Since(t0)
		ranks := ranksAt(w, it)
		n, err := check(sums, sizes, keys, ranks, it)
		if err != nil {
			return sum, fmt.Errorf("%s: iteration %d (summed over workers %v): %w", label, it, ranks, err)
		}
		m.apply(sums)
		if !slices.Equal(ranks, prev) && !o.Quiet {
			fmt.Fprintf(out, "%s: iteration %d on: sums over %d of %d workers %v (%s); this worker is now rank %d of %d\n",
				label, it, len(ranks), jobWorkers(w.NumWorkers(), ranks), ranks, change(prev, ranks), w.RankAt(uint64(it)), len(ranks))
		}
		prev = ranks
		sum.Values += n
		sum.addIteration(d)
		if !o.Quiet {
			fmt.Fprintf(out, "%s: iteration %d/%d verified: %d tensors, %s pushed and pulled in %s (%.2f Gbit/s)\n",
				label, it, o.Iterations, len(keys), human(2*model), d.Round(time.Millisecond), float64(2*model)*8/d.Seconds()/1e9)
		}
	}
	sum.Checksum = m.checksum()
	fmt.Fprintf(out, "%s: parameters checksum 0x%016x\n", label, sum.Checksum)
	_, n, err := classic(ctx, kv, o, keys, sizes, ranksAt(w, o.Iterations), early, true, out)
	sum.Values += n
	if err != nil {
		return sum, fmt.Errorf("%s: classic: %w", label, err)
	}
	fmt.Fprintf(out, "%s: PASS: %d iterations x %d tensors (%s per iteration) and %d classic rounds, %d values checked exactly; goodput %.2f Gbit/s\n",
		label, sum.Iterations, len(keys), human(model), o.Classic, sum.Values, sum.GoodputGbps())
	return sum, nil
}

// handedBy is the worker that handed a joiner its parameters: the lowest
// rank among the join iteration's workers other than the joiner (the
// others' ids are all lower than a joiner's, which is new).
func handedBy(ranks []int, self int) int {
	for _, r := range ranks {
		if r != self {
			return r
		}
	}
	return -1
}

// jobWorkers is how many workers the job has had: those it started with,
// and those that joined it (a joiner's rank is the next no worker had).
func jobWorkers(started int, ranks []int) int {
	n := started
	for _, r := range ranks {
		n = max(n, r+1)
	}
	return n
}

// change says how the workers of the sums changed from prev to ranks.
func change(prev, ranks []int) string {
	switch {
	case len(ranks) > len(prev):
		return "a worker joined the job"
	case len(ranks) < len(prev):
		return "a worker left the job"
	}
	return "a worker left the job and another joined it"
}

// model is a simulated model's parameters: the keys' tensors end to end,
// Init's values plus every verified iteration's sums.
type model[T worker.Float] struct {
	keys   []uint64
	offs   []int // offs[i]: where keys[i]'s elements start in params
	sizes  []int
	params []T
}

func newModel[T worker.Float](keys []uint64, sizes []int) *model[T] {
	m := &model[T]{keys: keys, sizes: sizes, offs: make([]int, len(keys))}
	total := 0
	for i, n := range sizes {
		m.offs[i] = total
		total += n
	}
	m.params = make([]T, total)
	return m
}

// bytes is the size of one copy of the parameters.
func (m *model[T]) bytes() int64 {
	return int64(len(m.params)) * int64(unsafe.Sizeof(T(0)))
}

// apply adds an iteration's sums (every key's, end to end) to the
// parameters, as an optimizer step would.
func (m *model[T]) apply(sums []T) {
	for j, s := range sums {
		m.params[j] += s
	}
}

// source is the model's worker.ParamsSource: key's parameters as the
// worker lays them out on the wire (T's bytes in this machine's order, as
// KV sends them).
func (m *model[T]) source(_, key uint64, dst []byte) error {
	i := slices.Index(m.keys, key)
	if i < 0 {
		return fmt.Errorf("trainer: key %d is not one of the model's %d", key, len(m.keys))
	}
	src := worker.AsBytes(m.params[m.offs[i] : m.offs[i]+m.sizes[i]])
	if len(dst) != len(src) {
		return fmt.Errorf("trainer: key %d has %d bytes of parameters, the worker asks for %d", key, len(src), len(dst))
	}
	copy(dst, src)
	return nil
}

// checksum is FNV-64a of the parameters' bytes.
func (m *model[T]) checksum() uint64 {
	h := fnv.New64a()
	h.Write(worker.AsBytes(m.params))
	return h.Sum64()
}

// classicRound is a round of classic pushes: its values are those of
// iteration 1000+n, pushed by the workers of ranks.
type classicRound struct {
	n     int
	ranks []int
}

// classic exercises ps-lite's Push, Pull and PushPull: o.Classic rounds
// pushed by the workers of ranks, after the rounds earlier (pushed before
// in the job: the servers' stores hold them too), then, if after (the
// rounds after training, not ClassicFirst's before it), PushPull. It
// returns the rounds pushed so far. The servers' stored values accumulate
// every push, so each round is fenced by barriers and the expected values
// are sums over all rounds so far. Its barriers are the job's only ones
// after Init: every worker, a joiner too, reaches them in step. The
// rounds before training are the initial workers' alone: a joiner skips
// them, and none may join while they run.
func classic[T worker.Float](ctx context.Context, kv *worker.KV[T], o Options, keys []uint64, sizes []int, ranks []int, earlier []classicRound, after bool, out io.Writer) ([]classicRound, int64, error) {
	w := kv.Worker()
	// After training, the workers that push are those of the last
	// iteration: a worker lost before it is out of the job, a joiner is in
	// (after the joiner's first pull the answer is final on every worker).
	// A worker not among them (one whose join took effect after the last
	// iteration) only follows: it checks the pulls and passes the barriers.
	rank := w.Rank()
	pushes := slices.Contains(ranks, rank)
	done := slices.Clone(earlier)
	// Keys far apart in the key space, so that range slicing spreads them
	// over the servers.
	ckeys := make([]uint64, len(keys))
	for i := range keys {
		ckeys[i] = uint64(i) * (math.MaxUint64 / uint64(len(keys)))
	}
	total := 0
	for _, n := range sizes {
		total += n
	}
	vals := make([]T, total)
	got := make([]T, total)
	var checked int64
	for round := 0; round < o.Classic; round++ {
		cur := classicRound{len(done), ranks}
		if pushes {
			fill(vals, sizes, ckeys, rank, 1000+cur.n)
			ts, err := kv.Push(ckeys, vals, sizes, nil)
			if err != nil {
				return done, checked, err
			}
			if err := kv.Wait(ts); err != nil {
				return done, checked, err
			}
		}
		done = append(done, cur)
		if err := w.Barrier(ctx, node.WorkerGroup); err != nil {
			return done, checked, err
		}
		ts, err := kv.Pull(ckeys, got, sizes, nil)
		if err != nil {
			return done, checked, err
		}
		if err := kv.Wait(ts); err != nil {
			return done, checked, err
		}
		n, err := verify(got, sizes, ckeys, func(key uint64, j int) float64 {
			s := 0.0
			for _, d := range done {
				for _, r := range d.ranks {
					s += Value(r, 1000+d.n, key, j)
				}
			}
			return s
		})
		checked += n
		if err != nil {
			return done, checked, fmt.Errorf("round %d: pull: %w", cur.n, err)
		}
		if err := w.Barrier(ctx, node.WorkerGroup); err != nil {
			return done, checked, err
		}
	}
	if !after {
		if o.Classic > 0 {
			fmt.Fprintf(out, "worker %d: classic Push/Pull before training over %d servers verified\n", rank, w.NumServers())
		}
		return done, checked, nil
	}
	if o.Classic > 0 {
		// PushPull by one worker at a time has an exact answer: the stored
		// value plus its own push.
		fill(vals, sizes, ckeys, rank, 2000)
		for _, turn := range ranks {
			if turn == rank {
				before := append([]T(nil), got...)
				ts, err := kv.PushPull(ckeys, vals, got, sizes, nil)
				if err != nil {
					return done, checked, err
				}
				if err := kv.Wait(ts); err != nil {
					return done, checked, err
				}
				for j := range got {
					if got[j] != before[j]+vals[j] {
						return done, checked, fmt.Errorf("pushpull: element %d = %v, want %v", j, got[j], before[j]+vals[j])
					}
				}
				checked += int64(len(got))
			}
			if err := w.Barrier(ctx, node.WorkerGroup); err != nil {
				return done, checked, err
			}
			if turn != rank {
				// Follow the other worker's push in the local copy.
				other := make([]T, len(vals))
				fill(other, sizes, ckeys, turn, 2000)
				for j := range got {
					got[j] += other[j]
				}
			}
		}
		fmt.Fprintf(out, "worker %d: classic Push/Pull/PushPull over %d servers verified\n", rank, w.NumServers())
	}
	return done, checked, nil
}

func fill[T worker.Float](vals []T, sizes []int, keys []uint64, rank, iter int) {
	off := 0
	for i, n := range sizes {
		k := keys[i]
		for j := range n {
			vals[off+j] = T(Value(rank, iter, k, j))
		}
		off += n
	}
}

func check[T worker.Float](vals []T, sizes []int, keys []uint64, ranks []int, iter int) (int64, error) {
	return verify(vals, sizes, keys, func(key uint64, j int) float64 { return Expected(ranks, iter, key, j) })
}

// verify compares every value with want and reports the first mismatches.
func verify[T worker.Float](vals []T, sizes []int, keys []uint64, want func(key uint64, j int) float64) (int64, error) {
	off := 0
	var bad []string
	mismatches := 0
	for i, n := range sizes {
		k := keys[i]
		for j := range n {
			if w := T(want(k, j)); vals[off+j] != w {
				mismatches++
				if len(bad) < 5 {
					bad = append(bad, fmt.Sprintf("key %d element %d = %v, want %v", k, j, vals[off+j], w))
				}
			}
		}
		off += n
	}
	if mismatches > 0 {
		return int64(off), fmt.Errorf("%d of %d values wrong: %v", mismatches, off, bad)
	}
	return int64(off), nil
}

func human(b int64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%d B", b)
}
