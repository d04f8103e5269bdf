package worker_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/internal/localcluster"
	"github.com/fptps/fpt/launch"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/trainer"
	"github.com/fptps/fpt/worker"
)

// inProcess is a whole cluster in this process (every node with its own
// sockets on loopback), so that the race detector sees the worker, the
// server and the cluster code together.
type inProcess struct {
	workers []*worker.Worker
	// servers serve their metrics on a port of their own: the test reads
	// a server's van figures there, as a scrape would.
	servers []*launch.Node
	errs    chan error // from the scheduler and servers
	nodes   int
	// addWorker starts one more worker with the job's environment, into
	// the running job.
	addWorker func() (*worker.Worker, error)
}

func startInProcess(servers, workers int, extra map[string]string) (*inProcess, error) {
	port, err := localcluster.FreePort()
	if err != nil {
		return nil, err
	}
	env := map[string]string{
		"DMLC_PS_ROOT_URI":  "127.0.0.1",
		"DMLC_PS_ROOT_PORT": strconv.Itoa(port),
		"DMLC_NUM_SERVER":   strconv.Itoa(servers),
		"DMLC_NUM_WORKER":   strconv.Itoa(workers),
		"FPT_START_TIMEOUT": "30",
	}
	for k, v := range extra {
		env[k] = v
	}
	cfgFor := func(role string) config.Config {
		env["DMLC_ROLE"] = role
		cfg, err := config.FromEnv(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
		if err != nil {
			panic(err) // the test's own settings are wrong
		}
		return cfg
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx := context.Background()
	c := &inProcess{errs: make(chan error, servers+1), nodes: servers + 1}
	deps := launch.Deps{Log: log}
	sched, err := launch.Start(ctx, cfgFor("scheduler"), deps)
	if err != nil {
		return nil, err
	}
	go func() { c.errs <- sched.Finalize(ctx) }()
	// Every node starts as a real one does; servers and workers start at
	// once, since each returns only when the whole cluster has.
	started := make(chan *launch.Node, servers+workers)
	failed := make(chan error, servers+workers)
	start := func(cfg config.Config) {
		n, err := launch.Start(ctx, cfg, deps)
		if err != nil {
			failed <- err
			return
		}
		started <- n
	}
	scfg := cfgFor("server")
	scfg.MetricsAddr = "127.0.0.1:0"
	for range servers {
		go start(scfg)
	}
	wcfg := cfgFor("worker")
	for range workers {
		go start(wcfg)
	}
	c.addWorker = func() (*worker.Worker, error) {
		n, err := launch.Start(ctx, wcfg, deps)
		if err != nil {
			return nil, err
		}
		return n.Worker(), nil
	}
	for range servers + workers {
		select {
		case n := <-started:
			if w := n.Worker(); w != nil {
				c.workers = append(c.workers, w)
				continue
			}
			c.servers = append(c.servers, n)
			go func() { c.errs <- n.Finalize(ctx) }()
		case err := <-failed:
			return nil, err
		case <-time.After(30 * time.Second):
			return nil, fmt.Errorf("cluster did not start")
		}
	}
	return c, nil
}

func mustStart(t *testing.T, servers, workers int, extra map[string]string) *inProcess {
	t.Helper()
	c, err := startInProcess(servers, workers, extra)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// train runs the simulated trainer on every worker at once; it fails the
// test on the first error (a wrong value included) and checks each
// worker's summary: every iteration run, one positive time each, adding up
// to Elapsed.
func (c *inProcess) train(t *testing.T, o trainer.Options) {
	t.Helper()
	err := c.each(func(w *worker.Worker) error {
		s, err := trainer.Run(context.Background(), w, o, io.Discard)
		if err != nil {
			return err
		}
		if s.Iterations != o.Iterations || len(s.IterTimes) != o.Iterations {
			return fmt.Errorf("%d iterations, %d times; want %d", s.Iterations, len(s.IterTimes), o.Iterations)
		}
		var total time.Duration
		for i, d := range s.IterTimes {
			if d <= 0 {
				return fmt.Errorf("iteration %d took %v", i+1, d)
			}
			total += d
		}
		if total != s.Elapsed {
			return fmt.Errorf("iteration times add up to %v, Elapsed is %v", total, s.Elapsed)
		}
		if s.Values == 0 || (o.Iterations > 0 && s.GoodputGbps() <= 0) {
			return fmt.Errorf("summary %+v", s)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// each runs f on every worker at once and returns the first error.
func (c *inProcess) each(f func(w *worker.Worker) error) error {
	var wg sync.WaitGroup
	errs := make(chan error, len(c.workers))
	for _, w := range c.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(w); err != nil {
				errs <- fmt.Errorf("worker %d: %w", w.Rank(), err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// finish finalizes every worker and checks that every node left cleanly.
func (c *inProcess) finish() error {
	if err := c.each(func(w *worker.Worker) error { return w.Finalize(context.Background()) }); err != nil {
		return err
	}
	for range c.nodes {
		select {
		case err := <-c.errs:
			if err != nil {
				return err
			}
		case <-time.After(30 * time.Second):
			return fmt.Errorf("a server or the scheduler did not exit")
		}
	}
	return nil
}

func mustFinish(t *testing.T, c *inProcess) {
	t.Helper()
	if err := c.finish(); err != nil {
		t.Fatal(err)
	}
}

// The simulated trainer on an in-process cluster, under the race detector:
// every pulled value is checked exactly, FPT and classic.
func TestTrainerInProcess(t *testing.T) {
	tests := []struct {
		name             string
		servers, workers int
		env              map[string]string
		o                trainer.Options
	}{
		{"2s3w-float32", 2, 3, map[string]string{"FPT_PARTITION_BYTES": "16384"},
			trainer.Options{Iterations: 4, Tensors: 6, MinBytes: 0, MaxBytes: 300 << 10, DType: frame.Float32, Classic: 2, Quiet: true}},
		{"1s2w-float64-netconn", 1, 2, map[string]string{"FPT_VAN": "netconn"},
			trainer.Options{Iterations: 3, Tensors: 4, MinBytes: 8, MaxBytes: 1 << 20, DType: frame.Float64, Classic: 1, Quiet: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustStart(t, tt.servers, tt.workers, tt.env)
			c.train(t, tt.o)
			mustFinish(t, c)
		})
	}
}

// Many iterations of small tensors, each value checked exactly: the stress
// run for the iteration bookkeeping (results that arrive before their pull,
// buffers reused across iterations, partitions of many sizes), once on the
// even split and once with the LB probing again every 2 balanced
// iterations, so that the split changes every few iterations (workers
// aggregating too), under the race detector.
func TestStressManyIterations(t *testing.T) {
	iters := 200
	if testing.Short() {
		iters = 40
	}
	tests := []struct {
		name             string
		servers, workers int
		env              map[string]string
		minDecisions     uint32
	}{
		{"even split", 2, 2, map[string]string{"FPT_LB": "off", "FPT_PARTITION_BYTES": "4096"}, 0},
		// Warm-up 2, probe 2, then a probe every 2 balanced iterations:
		// a switch every 4 to 8 iterations. Grants two iterations ahead
		// (FPT_LB_AHEAD=0): iterations of a millisecond probe then.
		{"lb switching", 2, 3, map[string]string{"FPT_LB_PROBE_EVERY": "2", "FPT_LB_AHEAD": "0", "FPT_PARTITION_BYTES": "8192"}, uint32(iters / 10)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustStart(t, tt.servers, tt.workers, tt.env)
			c.train(t, trainer.Options{Iterations: iters, Tensors: 5, MinBytes: 4, MaxBytes: 200 << 10, DType: frame.Float32, Quiet: true})
			var versions []uint32
			for _, w := range c.workers {
				versions = append(versions, w.DecisionVersion())
			}
			mustFinish(t, c)
			t.Logf("%d decisions in %d iterations", versions[0], iters)
			for i, v := range versions {
				if v < tt.minDecisions {
					t.Errorf("worker %d saw %d decisions in %d iterations, want at least %d", i, v, iters, tt.minDecisions)
				}
				if v != versions[0] {
					t.Errorf("workers saw different decisions: %v", versions)
				}
			}
		})
	}
}

// Bad calls get clear errors and leave the worker usable.
func TestWorkerRejectsBadCalls(t *testing.T) {
	c := mustStart(t, 2, 1, nil)
	w := c.workers[0]
	kv := worker.NewKV[float32](w)
	kv64 := worker.NewKV[float64](w)
	if err := w.SetTensorsPerIteration(2); err != nil {
		t.Fatal(err)
	}
	if err := kv.Declare(1, 4, 0); err != nil {
		t.Fatal(err)
	}
	if err := kv.Declare(2, 2, -1); err != nil {
		t.Fatal(err)
	}
	four := []float32{1, 2, 3, 4}
	calls := []struct {
		name string
		call func() error
	}{
		{"third tensor beyond SetTensorsPerIteration", func() error { return kv.Declare(3, 1, 0) }},
		{"redeclare with another size", func() error { return kv.Declare(1, 5, 0) }},
		{"undeclared key", func() error { _, err := kv.FPTPush([]uint64{9}, four, nil, 0, nil); return err }},
		{"wrong size", func() error { _, err := kv.FPTPush([]uint64{1}, four[:3], nil, 0, nil); return err }},
		{"wrong dtype", func() error { _, err := kv64.FPTPush([]uint64{1}, []float64{1, 2, 3, 4}, nil, 0, nil); return err }},
		{"lens do not add up", func() error { _, err := kv.FPTPush([]uint64{1, 2}, four, []int{4, 1}, 0, nil); return err }},
		{"key twice", func() error { _, err := kv.FPTPush([]uint64{2, 2}, four, []int{2, 2}, 0, nil); return err }},
		{"pull before push", func() error { _, err := kv.FPTPull([]uint64{1}, four, nil, nil); return err }},
		{"wait on unknown request", func() error { return kv.Wait(12345) }},
		{"classic keys unsorted", func() error { _, err := kv.Push([]uint64{5, 3}, four, nil, nil); return err }},
		{"pushpull outputs short", func() error { _, err := kv.PushPull([]uint64{5}, four, four[:2], nil, nil); return err }},
	}
	for _, cl := range calls {
		if err := cl.call(); err == nil {
			t.Errorf("%s: no error", cl.name)
		} else {
			t.Logf("%s: %v", cl.name, err)
		}
	}
	// A pull of a key no one pushed is refused by its server; the request
	// fails, the server carries on.
	ts, err := kv.Pull([]uint64{77}, four, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Wait(ts); err == nil {
		t.Error("pull of a never-pushed key succeeded")
	}
	// The worker still works: init, then one FPT round.
	if err := kv.Init(context.Background(), []uint64{1}, four, nil); err != nil {
		t.Fatal(err)
	}
	if err := kv.Init(context.Background(), []uint64{1}, four, nil); err == nil {
		t.Error("second Init of a key accepted")
	}
	ts, err = kv.FPTPush([]uint64{1}, []float32{10, 20, 30, 40}, nil, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]float32, 4)
	pull, err := kv.FPTPull([]uint64{1}, got, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Wait(pull); err != nil {
		t.Fatal(err)
	}
	if err := kv.Wait(ts); err != nil {
		t.Fatal(err)
	}
	if got[0] != 10 || got[3] != 40 {
		t.Errorf("FPTPull = %v; want the one worker's push", got)
	}
	mustFinish(t, c)
}

// Two workers push; each gets the sum by itself.
func ExampleKV_FPTPush() {
	c, err := startInProcess(1, 2, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	err = c.each(func(w *worker.Worker) error {
		kv := worker.NewKV[float32](w)
		if err := kv.Declare(7, 3, 0); err != nil {
			return err
		}
		if err := kv.Init(context.Background(), []uint64{7}, make([]float32, 3), nil); err != nil {
			return err
		}
		r := float32(w.Rank() + 1)
		grad := []float32{r, 10 * r, 100 * r}
		if _, err := kv.FPTPush([]uint64{7}, grad, nil, 0, nil); err != nil {
			return err
		}
		sum := make([]float32, 3)
		ts, err := kv.FPTPull([]uint64{7}, sum, nil, nil)
		if err != nil {
			return err
		}
		if err := kv.Wait(ts); err != nil {
			return err
		}
		if w.Rank() == 0 {
			fmt.Println(sum)
		}
		return w.Barrier(context.Background(), node.WorkerGroup)
	})
	if err == nil {
		err = c.finish()
	}
	if err != nil {
		fmt.Println(err)
	}
	// Output: [3 30 300]
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// A cluster that shuts down releases every goroutine, socket and fd: a
// second whole cluster in the same process ends where the first ended (the
// first pays for ZeroMQ's process-wide context, which stays).
func TestShutdownReleasesEverything(t *testing.T) {
	o := trainer.Options{Iterations: 2, Tensors: 3, MinBytes: 4, MaxBytes: 64 << 10, DType: frame.Float32, Classic: 1, Quiet: true}
	run := func() {
		c := mustStart(t, 2, 2, nil)
		c.train(t, o)
		mustFinish(t, c)
	}
	settle := func(want func() bool) {
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && !want(); {
			time.Sleep(20 * time.Millisecond)
		}
	}
	run()
	goroutines, fds := runtime.NumGoroutine(), openFDs(t)
	for i := range 2 {
		run()
		settle(func() bool { return runtime.NumGoroutine() <= goroutines && openFDs(t) <= fds })
		if g, f := runtime.NumGoroutine(), openFDs(t); g > goroutines || f > fds {
			buf := make([]byte, 1<<20)
			t.Fatalf("after run %d: %d goroutines (was %d), %d fds (was %d)\n%s", i+2, g, goroutines, f, fds, buf[:runtime.Stack(buf, true)])
		}
	}
}

// Callbacks run once per request, before Wait returns (ps-lite's order),
// and may call back into the worker.
func TestCallbacks(t *testing.T) {
	c := mustStart(t, 2, 1, nil)
	w := c.workers[0]
	kv := worker.NewKV[float64](w)
	if err := kv.Declare(3, 1000, 0); err != nil {
		t.Fatal(err)
	}
	vals := make([]float64, 1000)
	for i := range vals {
		vals[i] = float64(i)
	}
	if err := kv.Init(context.Background(), []uint64{3}, vals, nil); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	count := func(err error) {
		if err != nil {
			t.Errorf("callback of a successful request: %v", err)
		}
		calls.Add(1)
	}
	sum := make([]float64, 1000)
	// A push whose callback pulls: it runs off the van's goroutines.
	pulled := make(chan int, 1)
	push, err := kv.FPTPush([]uint64{3}, vals, nil, 0, func(error) {
		calls.Add(1)
		ts, err := kv.FPTPull([]uint64{3}, sum, nil, count)
		if err != nil {
			t.Error(err)
		}
		pulled <- ts
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Wait(push); err != nil {
		t.Fatal(err)
	}
	if n := calls.Load(); n < 1 {
		t.Fatalf("Wait returned before the push's callback ran (%d calls)", n)
	}
	if err := kv.Wait(<-pulled); err != nil {
		t.Fatal(err)
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("%d callbacks ran, want 2", n)
	}
	if sum[999] != 999 {
		t.Errorf("sum[999] = %v", sum[999])
	}
	// Classic calls too.
	keys := []uint64{1, 1 << 63}
	ts, err := kv.Push(keys, vals, []int{400, 600}, count)
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Wait(ts); err != nil || calls.Load() != 3 {
		t.Fatalf("classic push: %v, %d callbacks", err, calls.Load())
	}
	got := make([]float64, 1000)
	if ts, err = kv.Pull(keys, got, []int{400, 600}, count); err != nil {
		t.Fatal(err)
	}
	if err := kv.Wait(ts); err != nil || calls.Load() != 4 {
		t.Fatalf("classic pull: %v, %d callbacks", err, calls.Load())
	}
	if got[0] != 0 || got[999] != 999 {
		t.Errorf("classic pull got %v .. %v", got[0], got[999])
	}
	mustFinish(t, c)
}

// A node's failure completes every outstanding request with it: the
// waiting pull's callback gets the error, Wait returns it once, new calls
// are refused, and Finalize returns the failure only after the callback
// returned.
func TestFailureCompletesRequests(t *testing.T) {
	c := mustStart(t, 1, 2, map[string]string{"FPT_LB": "off"})
	err := c.each(func(w *worker.Worker) error {
		kv := worker.NewKV[float32](w)
		if err := kv.Declare(5, 16, 0); err != nil {
			return err
		}
		return kv.Init(context.Background(), []uint64{5}, make([]float32, 16), nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	w0 := c.workers[0]
	if w0.Rank() != 0 {
		w0 = c.workers[1]
	}
	kv := worker.NewKV[float32](w0)
	// Worker 1 never pushes iteration 1: the pull waits until the failure.
	if _, err := kv.FPTPush([]uint64{5}, make([]float32, 16), nil, 0, nil); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	var returned atomic.Bool
	ts, err := kv.FPTPull([]uint64{5}, make([]float32, 16), nil, func(err error) {
		got <- err
		time.Sleep(50 * time.Millisecond) // Finalize must wait for this
		returned.Store(true)
	})
	if err != nil {
		t.Fatal(err)
	}
	cause := errors.New("test: worker 0 gives up")
	w0.Node().Fail(cause)
	select {
	case err := <-got:
		if !errors.Is(err, cause) {
			t.Errorf("callback: %v, want the node's failure", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the pull's callback never ran after the node failed")
	}
	if err := kv.Wait(ts); !errors.Is(err, cause) || !returned.Load() {
		t.Errorf("Wait: %v (callback returned: %v), want the failure after the callback", err, returned.Load())
	}
	if err := kv.Wait(ts); err != nil {
		t.Errorf("second Wait: %v, want nil (the first took the error)", err)
	}
	if _, err := kv.FPTPush([]uint64{5}, make([]float32, 16), nil, 0, nil); err == nil {
		t.Error("push after the failure accepted")
	}
	if err := w0.Finalize(context.Background()); !errors.Is(err, cause) {
		t.Errorf("Finalize: %v, want the failure", err)
	}
	// The rest of the cluster learns of the failure and leaves too.
	for _, w := range c.workers {
		if w != w0 {
			_ = w.Finalize(context.Background())
		}
	}
	for range c.nodes {
		select {
		case <-c.errs:
		case <-time.After(60 * time.Second):
			t.Fatal("a server or the scheduler did not exit after the failure")
		}
	}
}
