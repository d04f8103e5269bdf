package trainer

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/internal/memcluster"
	"github.com/fptps/fpt/worker"
)

func TestSizes(t *testing.T) {
	tests := []struct {
		o    Options
		want []int
	}{
		{Options{Tensors: 3, MinBytes: 4096, MaxBytes: 16384, DType: frame.Float32}, []int{1024, 2048, 4096}},
		{Options{Tensors: 1, MinBytes: 800, MaxBytes: 800, DType: frame.Float64}, []int{100}},
		{Options{Tensors: 3, MinBytes: 0, MaxBytes: 80, DType: frame.Float64}, []int{0, 5, 10}},
	}
	for _, tt := range tests {
		got := tt.o.Sizes()
		if len(got) != len(tt.want) {
			t.Fatalf("%+v: %v", tt.o, got)
		}
		for i := range got {
			if got[i] != tt.want[i] {
				t.Errorf("%+v: Sizes() = %v, want %v", tt.o, got, tt.want)
				break
			}
		}
	}
}

func TestExpected(t *testing.T) {
	for _, k := range []uint64{0, 5, 1 << 60} {
		for _, j := range []int{0, 1, 1000, 1 << 28} {
			if got, want := Expected([]int{0, 1, 2, 3}, 0, k, j), Value(0, 0, k, j); got != want {
				t.Errorf("init: Expected = %v, want worker 0's %v", got, want)
			}
			sum := Value(0, 3, k, j) + Value(1, 3, k, j) + Value(2, 3, k, j)
			if got := Expected([]int{0, 1, 2}, 3, k, j); got != sum {
				t.Errorf("Expected(ranks 0-2, 3, %d, %d) = %v, want %v", k, j, got, sum)
			}
			// Small integers: every float32 sum is exact, whatever the order.
			if v := Value(7, 1<<20, k, j); v < 0 || v > 60 || v != float64(float32(v)) {
				t.Errorf("Value out of the exact range: %v", v)
			}
		}
	}
}

func TestValidate(t *testing.T) {
	good := DefaultOptions()
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []func(o *Options){
		func(o *Options) { o.Tensors = 0 },
		func(o *Options) { o.MaxBytes = o.MinBytes - 1 },
		func(o *Options) { o.DType = frame.Float16 },
		func(o *Options) { o.Iterations = -1 },
		func(o *Options) { o.Compute = -time.Millisecond },
	} {
		o := DefaultOptions()
		bad(&o)
		if o.Validate() == nil {
			t.Errorf("accepted %+v", o)
		}
	}
}

// The model's parameters: Init's values plus each iteration's sums, handed
// to a joiner key by key in T's bytes, and a checksum that sees any change.
func TestModel(t *testing.T) {
	t.Run("float32", func(t *testing.T) { testModel[float32](t) })
	t.Run("float64", func(t *testing.T) { testModel[float64](t) })
}

func testModel[T worker.Float](t *testing.T) {
	keys, sizes := []uint64{0, 1, 2}, []int{3, 0, 2}
	m := newModel[T](keys, sizes)
	fill(m.params, sizes, keys, 0, 0)
	before := m.checksum()
	sums := make([]T, len(m.params))
	fill(sums, sizes, keys, 1, 4)
	want := make([]T, len(m.params))
	for j := range want {
		want[j] = m.params[j] + sums[j]
	}
	m.apply(sums)
	if !slices.Equal(m.params, want) {
		t.Fatalf("after apply: %v, want %v", m.params, want)
	}
	if m.checksum() == before {
		t.Error("the checksum did not change with the parameters")
	}
	if m2 := newModel[T](keys, sizes); copy(m2.params, m.params) > 0 && m2.checksum() != m.checksum() {
		t.Error("equal parameters, different checksums")
	}
	size := int(unsafe.Sizeof(T(0)))
	tests := []struct {
		name string
		key  uint64
		dst  int // bytes
		want []T // nil: an error
		msg  string
	}{
		{"first key", 0, 3 * size, want[:3], ""},
		{"last key", 2, 2 * size, want[3:], ""},
		{"empty key", 1, 0, []T{}, ""},
		{"unknown key", 7, 8, nil, "key 7 is not one of the model's 3"},
		{"wrong size", 2, 3 * size, nil, "asks for"},
	}
	for _, tt := range tests {
		dst := make([]byte, tt.dst)
		err := m.source(9, tt.key, dst)
		if tt.want == nil {
			if err == nil || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("%s: source: %v, want an error containing %q", tt.name, err, tt.msg)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: source: %v", tt.name, err)
			continue
		}
		got := unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(dst))), len(dst)/size)
		if !slices.Equal(got, tt.want) {
			t.Errorf("%s: source gave %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestWorkersChange(t *testing.T) {
	tests := []struct {
		prev, ranks []int
		started     int
		change      string
		workers     int
		handedBy    int
	}{
		{[]int{0, 1, 2}, []int{0, 2}, 3, "a worker left the job", 3, 0},
		{[]int{0, 1, 2}, []int{0, 1, 2, 3}, 3, "a worker joined the job", 4, 0},
		{[]int{0, 2}, []int{0, 2, 3}, 3, "a worker joined the job", 4, 0},
		{[]int{1, 2}, []int{1, 2, 4}, 3, "a worker joined the job", 5, 1},
		{[]int{0, 1}, []int{0, 2}, 3, "a worker left the job and another joined it", 3, 0},
	}
	for _, tt := range tests {
		if got := change(tt.prev, tt.ranks); got != tt.change {
			t.Errorf("change(%v, %v) = %q, want %q", tt.prev, tt.ranks, got, tt.change)
		}
		if got := jobWorkers(tt.started, tt.ranks); got != tt.workers {
			t.Errorf("jobWorkers(%d, %v) = %d, want %d", tt.started, tt.ranks, got, tt.workers)
		}
		joiner := tt.ranks[len(tt.ranks)-1]
		if got := handedBy(tt.ranks, joiner); got != tt.handedBy {
			t.Errorf("handedBy(%v, %d) = %d, want %d", tt.ranks, joiner, got, tt.handedBy)
		}
		// A joiner's rank beyond DMLC_NUM_WORKER counts in the sums.
		if got, want := Expected(tt.ranks, 3, 5, 1), Value(joiner, 3, 5, 1); got < want {
			t.Errorf("Expected(%v) = %v, less than the joiner's own value %v", tt.ranks, got, want)
		}
	}
}

// watch is a trainer's output that runs f once a line contains s.
type watch struct {
	mu   sync.Mutex
	buf  strings.Builder
	s    string
	f    func()
	done bool
}

func (w *watch) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if w.f != nil && !w.done && strings.Contains(w.buf.String(), w.s) {
		w.done = true
		go w.f()
	}
	return len(p), nil
}

func (w *watch) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// wantChecksum is the parameters' checksum after iters iterations whose
// sums add up the workers of ranksAt(it): Init's values plus every sum.
func wantChecksum(o Options, ranksAt func(it int) []int) uint64 {
	sizes := o.Sizes()
	keys := make([]uint64, len(sizes))
	for i := range keys {
		keys[i] = uint64(i)
	}
	m := newModel[float32](keys, sizes)
	fill(m.params, sizes, keys, 0, 0)
	sums := make([]float32, len(m.params))
	for it := 1; it <= o.Iterations; it++ {
		off := 0
		for i, n := range sizes {
			for j := range n {
				sums[off+j] = float32(Expected(ranksAt(it), it, keys[i], j))
			}
			off += n
		}
		m.apply(sums)
	}
	return m.checksum()
}

// Whole jobs in memory (the real scheduler, servers and workers): every
// worker ends with the parameters Init's values and every iteration's sums
// make, and says so in the same checksum; the classic rounds count the
// workers that are left. With one killed under FPT_ON_WORKER_LOSS=continue
// and no barrier per iteration, the two left run on, the sums over them
// from the iteration the loss took effect at, and both pass the classic
// rounds (whose barriers and stored sums count the two).
func TestRunJob(t *testing.T) {
	o := Options{Iterations: 8, Tensors: 3, MinBytes: 4, MaxBytes: 64 << 10, DType: frame.Float32, Classic: 2}
	tests := []struct {
		name    string
		workers int
		env     map[string]string
		kill    int  // rank to kill after its iteration 3, or -1
		first   bool // ClassicFirst
	}{
		{"two workers", 2, nil, -1, false},
		{"a worker lost", 3, map[string]string{"FPT_ON_WORKER_LOSS": "continue"}, 2, false},
		{"classic first", 2, nil, -1, true},
		{"classic first, a worker lost", 3, map[string]string{"FPT_ON_WORKER_LOSS": "continue"}, 2, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := memcluster.Start(context.Background(), memcluster.Options{Servers: 2, Workers: tt.workers, Env: tt.env})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			o := o
			o.ClassicFirst = tt.first
			outs := make([]*watch, tt.workers)
			sums := make([]Summary, tt.workers)
			errs := make([]error, tt.workers)
			var wg sync.WaitGroup
			for r, w := range c.Workers {
				outs[r] = &watch{s: "iteration 3/", f: func() {}}
				if r == tt.kill {
					outs[r].f = func() {
						if err := c.Kill(w.Node().Self().ID); err != nil {
							t.Error(err)
						}
					}
				}
				wg.Go(func() { sums[r], errs[r] = Run(context.Background(), w, o, outs[r]) })
			}
			wg.Wait()
			ranks := func(it int) []int { return ranksAt(c.Workers[0], it) }
			want := wantChecksum(o, ranks)
			for r := range c.Workers {
				if r == tt.kill {
					continue
				}
				if errs[r] != nil {
					t.Fatalf("worker %d: %v\n%s", r, errs[r], outs[r])
				}
				s, out := sums[r], outs[r].String()
				if s.Start != 1 || s.Iterations != o.Iterations || s.Checksum != want {
					t.Errorf("worker %d: start %d, %d iterations, checksum %#x; want 1, %d, %#x", r, s.Start, s.Iterations, s.Checksum, o.Iterations, want)
				}
				lines := []string{fmt.Sprintf("parameters checksum 0x%016x", want), "classic Push/Pull/PushPull over 2 servers verified", "PASS"}
				if tt.first {
					lines = append(lines, "classic Push/Pull before training over 2 servers verified")
				}
				for _, line := range lines {
					if !strings.Contains(out, line) {
						t.Errorf("worker %d printed no %q:\n%s", r, line, out)
					}
				}
				if tt.kill >= 0 && !strings.Contains(out, "of 3 workers [0 1] (a worker left the job)") {
					t.Errorf("worker %d did not say the sums are over the two left:\n%s", r, out)
				}
			}
			if tt.kill >= 0 && len(ranks(o.Iterations)) != 2 {
				t.Errorf("the last iteration summed %v, want the two left", ranks(o.Iterations))
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := c.Finish(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A third worker joins a 2×2 job while it trains (memcluster.AddWorker once
// worker 0 verified iteration 3): test_kv_app's model hands the joiner the
// parameters, the joiner trains from its start iteration to the end and
// counts only those iterations, the others say a worker joined, and all
// three end with the parameters every iteration's sums make (one
// checksum) and pass the classic rounds together, whose barriers the
// joiner counts in: the barrier per iteration is gone, or this would
// deadlock.
func TestRunJoin(t *testing.T) {
	o := Options{Iterations: 14, Tensors: 3, MinBytes: 4, MaxBytes: 64 << 10, DType: frame.Float32, Classic: 2,
		Compute: 5 * time.Millisecond}
	for _, tt := range []struct {
		name  string
		env   map[string]string
		first bool // ClassicFirst: the joiner skips those rounds, and counts them in
	}{
		{"LB on", map[string]string{"FPT_LB": "on"}, false},
		{"LB off, continue", map[string]string{"FPT_LB": "off", "FPT_ON_WORKER_LOSS": "continue"}, false},
		{"LB on, classic first", map[string]string{"FPT_LB": "on"}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := o
			o.ClassicFirst = tt.first
			c, err := memcluster.Start(context.Background(), memcluster.Options{Servers: 2, Workers: 2, Env: tt.env})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			old := slices.Clone(c.Workers)
			outs := make([]*watch, 3)
			sums := make([]Summary, 3)
			errs := make([]error, 3)
			var joiner *worker.Worker
			var wg sync.WaitGroup
			for r, w := range old {
				outs[r] = &watch{s: "iteration 3/", f: func() {}}
				if r == 0 {
					outs[r].f = func() {
						wg.Go(func() {
							j, err := c.AddWorker()
							if err != nil {
								errs[2] = fmt.Errorf("joining: %w", err)
								cancel()
								return
							}
							joiner = j
							outs[2] = &watch{}
							sums[2], errs[2] = Run(ctx, j, o, outs[2])
						})
					}
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					sums[r], errs[r] = Run(ctx, w, o, outs[r])
				}()
			}
			wg.Wait()
			for r, err := range errs {
				if err != nil {
					out := ""
					if outs[r] != nil {
						out = outs[r].String()
					}
					t.Errorf("worker %d: %v\n%s", r, err, out)
				}
			}
			if t.Failed() {
				t.FailNow()
			}
			want := wantChecksum(o, func(it int) []int { return ranksAt(old[0], it) })
			start := sums[2].Start
			if rank := joiner.Rank(); rank != 2 || !joiner.Joined() || old[0].Joined() {
				t.Errorf("the joiner has rank %d, joined %v (worker 0: %v); want 2, true (false)", rank, joiner.Joined(), old[0].Joined())
			}
			if start <= 1 || start > o.Iterations || sums[2].Iterations != o.Iterations-start+1 {
				t.Errorf("the joiner started at iteration %d and ran %d; want one in 2..%d, and the rest", start, sums[2].Iterations, o.Iterations)
			}
			if got := ranksAt(old[0], start); !slices.Equal(got, []int{0, 1, 2}) || len(ranksAt(old[0], start-1)) != 2 {
				t.Errorf("iteration %d summed %v, %d summed %v; want workers 0 and 1, then 0, 1 and 2", start-1, ranksAt(old[0], start-1), start, got)
			}
			for r, s := range sums {
				out := outs[r].String()
				if s.Checksum != want {
					t.Errorf("worker %d: parameters checksum %#x, want %#x\n%s", r, s.Checksum, want, out)
				}
				lines := []string{fmt.Sprintf("parameters checksum 0x%016x", want), "classic Push/Pull/PushPull over 2 servers verified", "PASS"}
				if r == 2 {
					lines = append(lines, fmt.Sprintf("worker 2: joined the running job at iteration %d with worker 0's parameters; sums now over 3 workers [0 1 2]", start))
				} else {
					lines = append(lines, fmt.Sprintf("iteration %d on: sums over 3 of 3 workers [0 1 2] (a worker joined the job)", start))
				}
				for _, line := range lines {
					if !strings.Contains(out, line) {
						t.Errorf("worker %d printed no %q:\n%s", r, line, out)
					}
				}
			}
			if err := c.Finish(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}
