package capi

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/fptps/fpt/cluster"
	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/internal/localcluster"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/worker"
)

func TestView(t *testing.T) {
	keys := []uint64{7, 8}
	lens := []uint64{4, 8}
	vals := make([]byte, 12)
	zero := []uint64{0, 0}
	over := []uint64{math.MaxInt64, 1}
	p := func(s []uint64) unsafe.Pointer { return unsafe.Pointer(unsafe.SliceData(s)) }
	tests := []struct {
		name             string
		keys, vals, lens unsafe.Pointer
		n                uint64
		code             Code
		msg              string
		total            int
	}{
		{"nothing", nil, nil, nil, 0, CodeOK, "", 0},
		{"two keys", p(keys), unsafe.Pointer(&vals[0]), p(lens), 2, CodeOK, "", 12},
		{"empty tensors, no vals", p(keys), nil, p(zero), 2, CodeOK, "", 0},
		{"keys NULL", nil, unsafe.Pointer(&vals[0]), p(lens), 2, CodeArg, "keys is NULL", 0},
		{"lens NULL", p(keys), unsafe.Pointer(&vals[0]), nil, 2, CodeArg, "lens is NULL", 0},
		{"vals NULL", p(keys), nil, p(lens), 2, CodeArg, "vals is NULL", 0},
		{"too many keys", p(keys), unsafe.Pointer(&vals[0]), p(lens), maxKeys + 1, CodeArg, "keys in one call", 0},
		{"total overflows", p(keys), unsafe.Pointer(&vals[0]), p(over), 2, CodeSize, "overflows", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := View("op", tt.keys, tt.n, tt.vals, tt.lens)
			if c := CodeOf(err); c != tt.code || (err != nil && !strings.Contains(err.Error(), tt.msg)) {
				t.Fatalf("View: code %d, err %v; want code %d containing %q", c, err, tt.code, tt.msg)
			}
			if err != nil {
				return
			}
			if len(got.Data) != tt.total || len(got.Keys) != len(got.Lens) {
				t.Fatalf("View: %d keys, %d lens, %d bytes; want %d bytes", len(got.Keys), len(got.Lens), len(got.Data), tt.total)
			}
			if tt.total > 0 {
				// A view, not a copy: the caller's memory is the tensor.
				got.Data[11] = 42
				if vals[11] != 42 || &got.Keys[1] != &keys[1] {
					t.Fatal("View copied the caller's memory")
				}
			}
		})
	}
}

func TestCodes(t *testing.T) {
	tests := []struct {
		name string
		err  error
		code Code
	}{
		{"nil", nil, CodeOK},
		{"plain error", errors.New("x"), CodeInternal},
		{"wrapped Error", fmt.Errorf("outer: %w", &Error{Code: CodeKey, Err: errors.New("x")}), CodeKey},
	}
	for _, tt := range tests {
		if got := CodeOf(tt.err); got != tt.code {
			t.Errorf("%s: CodeOf = %d, want %d", tt.name, got, tt.code)
		}
	}
	classes := []struct {
		name string
		err  error
		code Code
	}{
		{"undeclared", fmt.Errorf("w: %w", worker.ErrNotDeclared), CodeKey},
		{"size", fmt.Errorf("w: %w", worker.ErrSizeMismatch), CodeSize},
		{"order", fmt.Errorf("w: %w", worker.ErrPullBeforePush), CodeState},
		{"terminated", fmt.Errorf("w: %w", cluster.ErrTerminated), CodeCluster},
		{"variable", fmt.Errorf("c: %w", &config.VarError{Var: "DMLC_ROLE"}), CodeConfig},
		{"other", errors.New("x"), CodeArg},
	}
	for _, tt := range classes {
		if got := classify(tt.err, CodeArg); got != tt.code {
			t.Errorf("%s: classify = %d, want %d", tt.name, got, tt.code)
		}
	}
}

// env is a DMLC_* environment for one node of a loopback cluster.
func env(port, servers, workers int, role string) map[string]string {
	return map[string]string{
		"DMLC_ROLE":         role,
		"DMLC_PS_ROOT_URI":  "127.0.0.1",
		"DMLC_PS_ROOT_PORT": strconv.Itoa(port),
		"DMLC_NUM_SERVER":   strconv.Itoa(servers),
		"DMLC_NUM_WORKER":   strconv.Itoa(workers),
		"FPT_START_TIMEOUT": "30",
	}
}

// newLib returns a library reading vars, with a shutdown that counts.
func newLib(vars map[string]string, shutdowns *atomic.Int32) *Lib {
	var mu sync.Mutex
	lookup := func(k string) (string, bool) {
		mu.Lock()
		defer mu.Unlock()
		v, ok := vars[k]
		return v, ok
	}
	return New(lookup, nil, io.Discard, io.Discard, func() { shutdowns.Add(1) })
}

// Every call before Start is refused with CodeState, except the queries
// the environment answers; a bad environment is CodeConfig and leaves the
// library startable.
func TestBeforeStart(t *testing.T) {
	vars := env(1, 1, 1, "worker")
	var shutdowns atomic.Int32
	l := newLib(vars, &shutdowns)
	one := Tensors{Keys: []uint64{1}, Lens: []int{4}, Data: make([]byte, 4)}
	calls := []struct {
		name string
		call func() error
	}{
		{"Rank", func() error { _, err := l.Rank(); return err }},
		{"SetTensorsPerIteration", func() error { return l.SetTensorsPerIteration(1) }},
		{"Declare", func() error { return l.Declare(1, 4, int(frame.Float32), 0) }},
		{"Init", func() error { return l.Init(one) }},
		{"Push", func() error { _, err := l.Push(one, 0, nil); return err }},
		{"Pull", func() error { _, err := l.Pull(one, nil); return err }},
		{"Wait", func() error { return l.Wait(1) }},
		{"Barrier", l.Barrier},
		{"SetParamsSource", func() error { return l.SetParamsSource(nil) }},
		{"StartIteration", func() error { _, err := l.StartIteration(); return err }},
		{"Joined", func() error { _, err := l.Joined(); return err }},
		{"Finalize", l.Finalize},
	}
	for _, c := range calls {
		err := c.call()
		if CodeOf(err) != CodeState || !strings.Contains(err.Error(), "fpt_start has not been called") {
			t.Errorf("%s before Start: %v (code %d), want CodeState", c.name, err, CodeOf(err))
		}
	}
	if r, err := l.Role(); err != nil || r != node.Worker {
		t.Errorf("Role before Start = %v, %v; want worker from DMLC_ROLE", r, err)
	}
	if n, err := l.NumWorkers(); err != nil || n != 1 {
		t.Errorf("NumWorkers before Start = %d, %v", n, err)
	}
	vars["DMLC_ROLE"] = "trainer"
	for name, call := range map[string]func() error{
		"Start": l.Start,
		"Role":  func() error { _, err := l.Role(); return err },
	} {
		if err := call(); CodeOf(err) != CodeConfig || !strings.Contains(err.Error(), "DMLC_ROLE") {
			t.Errorf("%s with DMLC_ROLE=trainer: %v, want CodeConfig naming it", name, err)
		}
	}
	if l.state != idle || shutdowns.Load() != 0 {
		t.Errorf("after a configuration error: state %d, %d shutdowns; want idle, none", l.state, shutdowns.Load())
	}
}

// libCluster is a whole cluster of Libs in this process: the scheduler,
// servers and workers each drive their own Lib, as separate C processes
// would, so that the race detector sees the library with the node code.
type libCluster struct {
	sched     *Lib
	servers   []*Lib
	workers   []*Lib // by rank
	shutdowns atomic.Int32
	// lib makes one more node's library with the job's environment.
	lib func(role string) *Lib
}

func startLibs(t *testing.T, servers, workers int) *libCluster {
	t.Helper()
	return startLibsWith(t, servers, workers, nil)
}

// startLibsWith is startLibs with setup, if not nil, run on each node's
// environment and library before it starts.
func startLibsWith(t *testing.T, servers, workers int, setup func(role string, vars map[string]string, l *Lib)) *libCluster {
	t.Helper()
	port, err := localcluster.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	c := &libCluster{}
	lib := func(role string) *Lib {
		vars := env(port, servers, workers, role)
		l := newLib(vars, &c.shutdowns)
		if setup != nil {
			setup(role, vars, l)
		}
		return l
	}
	c.lib = lib
	c.sched = lib("scheduler")
	if err := c.sched.Start(); err != nil {
		t.Fatal(err)
	}
	all := []*Lib{}
	for range servers {
		l := lib("server")
		c.servers = append(c.servers, l)
		all = append(all, l)
	}
	ws := make([]*Lib, workers)
	for i := range ws {
		ws[i] = lib("worker")
		all = append(all, ws[i])
	}
	errs := make(chan error, len(all))
	for _, l := range all {
		go func() { errs <- l.Start() }()
	}
	for range all {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	c.workers = make([]*Lib, workers)
	for _, l := range ws {
		r, err := l.Rank()
		if err != nil {
			t.Fatal(err)
		}
		c.workers[r] = l
	}
	return c
}

// finalize finalizes every node at once and returns each one's error, the
// scheduler first, then the servers, then the workers.
func (c *libCluster) finalize() []error {
	all := append(append([]*Lib{c.sched}, c.servers...), c.workers...)
	errs := make([]error, len(all))
	var wg sync.WaitGroup
	for i, l := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = l.Finalize()
		}()
	}
	wg.Wait()
	return errs
}

// each runs f on every worker at once and returns the first error. Once
// one worker has failed, the others may wait for ever for its next push:
// each gives them a minute, then returns the error without them.
func (c *libCluster) each(f func(rank int, l *Lib) error) error {
	errs := make(chan error, len(c.workers))
	for r, l := range c.workers {
		go func() {
			err := f(r, l)
			if err != nil {
				err = fmt.Errorf("worker %d: %w", r, err)
			}
			errs <- err
		}()
	}
	var first error
	var giveUp <-chan time.Time
	for range c.workers {
		select {
		case err := <-errs:
			if err != nil && first == nil {
				first, giveUp = err, time.After(time.Minute)
			}
		case <-giveUp:
			return fmt.Errorf("%w (the other workers did not return within a minute of it)", first)
		}
	}
	return first
}

func f32s(b []byte) []float32 {
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
}

// Two workers declare, init and train through the library; callbacks run
// once each, before Wait returns; every value is checked; finalize leaves
// every node finished, with ZeroMQ flushed once per node.
func TestLibCluster(t *testing.T) {
	c := startLibs(t, 2, 2)
	sizes := []int{1000, 300000, 17} // elements of float32; key 1 spans two partitions
	const iters = 3
	err := c.each(func(rank int, l *Lib) error {
		if err := l.SetTensorsPerIteration(len(sizes)); err != nil {
			return err
		}
		keys := make([]uint64, len(sizes))
		lens := make([]int, len(sizes))
		total := 0
		for i, n := range sizes {
			keys[i], lens[i] = uint64(i), n*4
			total += n * 4
			if err := l.Declare(keys[i], uint64(n*4), int(frame.Float32), -i); err != nil {
				return err
			}
		}
		weights := make([]byte, total)
		for j := range f32s(weights) {
			f32s(weights)[j] = float32(rank*100 + j%50)
		}
		if err := l.SetParamsSource(func(_, _ uint64, dst []byte) int { copy(dst, weights); return 0 }); err != nil {
			return err
		}
		if err := l.Init(Tensors{Keys: keys, Lens: lens, Data: weights}); err != nil {
			return err
		}
		if it, err := l.StartIteration(); err != nil || it != 1 {
			return fmt.Errorf("rank %d: StartIteration = %d, %v; want 1 on a worker that started with the job", rank, it, err)
		}
		if j, err := l.Joined(); err != nil || j {
			return fmt.Errorf("rank %d: Joined = %v, %v; want false", rank, j, err)
		}
		for j, f := range f32s(weights) {
			if f != float32(j%50) {
				return fmt.Errorf("rank %d: init element %d = %v, want worker 0's %v", rank, j, f, j%50)
			}
		}
		// MXNet's broadcast: a pull right after the init gives its values.
		bcast := make([]byte, total)
		ts, err := l.Pull(Tensors{Keys: keys, Lens: lens, Data: bcast}, nil)
		if err != nil {
			return fmt.Errorf("rank %d: pull after init: %w", rank, err)
		}
		if err := l.Wait(ts); err != nil {
			return err
		}
		if !bytes.Equal(bcast, weights) {
			return fmt.Errorf("rank %d: the pull after init differs from the init's values", rank)
		}
		grads := make([]byte, total)
		sums := make([]byte, total)
		for it := 1; it <= iters; it++ {
			for j := range f32s(grads) {
				f32s(grads)[j] = float32(rank + it + j%7)
			}
			var calls atomic.Int32
			cb := func(ts int, err error) {
				if err != nil {
					t.Errorf("rank %d: request %d: %v", rank, ts, err)
				}
				time.Sleep(time.Millisecond) // Wait must not return before this
				calls.Add(1)
			}
			var reqs []int
			off := 0
			for i := range keys {
				one := Tensors{Keys: keys[i : i+1], Lens: lens[i : i+1], Data: grads[off : off+lens[i]]}
				ts, err := l.Push(one, -i, cb)
				if err != nil {
					return err
				}
				reqs = append(reqs, ts)
				off += lens[i]
			}
			ts, err := l.Pull(Tensors{Keys: keys, Lens: lens, Data: sums}, cb)
			if err != nil {
				return err
			}
			reqs = append(reqs, ts)
			for _, ts := range reqs {
				if err := l.Wait(ts); err != nil {
					return err
				}
			}
			if n := calls.Load(); n != int32(len(reqs)) {
				return fmt.Errorf("rank %d: %d callbacks had returned after waiting for %d requests", rank, n, len(reqs))
			}
			for j, f := range f32s(sums) {
				if want := float32(0 + it + j%7 + 1 + it + j%7); f != want {
					return fmt.Errorf("rank %d, iteration %d: element %d = %v, want %v", rank, it, j, f, want)
				}
			}
			if err := l.Barrier(); err != nil {
				return err
			}
		}
		all := Tensors{Keys: keys, Lens: lens, Data: grads}
		if _, err := l.PushPull(all, sums[:4], 0, nil); CodeOf(err) != CodeSize {
			return fmt.Errorf("rank %d: PushPull into a short buffer: %v, want CodeSize", rank, err)
		}
		// PushPull: one request an iteration, the sums into sums, then in
		// place into the pushed values.
		for it := iters + 1; it <= iters+2; it++ {
			for j := range f32s(grads) {
				f32s(grads)[j] = float32(rank + it + j%7)
			}
			out := sums
			if it == iters+2 {
				out = grads
			}
			called := make(chan error, 1)
			ts, err := l.PushPull(all, out, 0, func(_ int, err error) { called <- err })
			if err != nil {
				return fmt.Errorf("rank %d: PushPull: %w", rank, err)
			}
			if err := l.Wait(ts); err != nil {
				return err
			}
			select {
			case err := <-called:
				if err != nil {
					return fmt.Errorf("rank %d: PushPull's callback: %w", rank, err)
				}
			default:
				return fmt.Errorf("rank %d: Wait of a PushPull returned before its callback ran", rank)
			}
			for j, f := range f32s(out) {
				if want := float32(0 + it + j%7 + 1 + it + j%7); f != want {
					return fmt.Errorf("rank %d, PushPull iteration %d: element %d = %v, want %v", rank, it, j, f, want)
				}
			}
			if err := l.Barrier(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, err := range c.finalize() {
		if err != nil {
			t.Errorf("node %d: Finalize: %v", i, err)
		}
	}
	if n := c.shutdowns.Load(); n != 5 {
		t.Errorf("%d shutdowns for 5 nodes", n)
	}
	for _, l := range c.workers {
		if err := l.Barrier(); CodeOf(err) != CodeState {
			t.Errorf("Barrier after Finalize: %v, want CodeState", err)
		}
		if err := l.Start(); CodeOf(err) != CodeState {
			t.Errorf("Start after Finalize: %v, want CodeState", err)
		}
	}
}

// Calls in the wrong role, and a worker's failure: its waiting pull's
// callback and Wait get CodeCluster, new requests are refused at once, and
// every node's Finalize returns instead of hanging.
func TestLibClusterFailure(t *testing.T) {
	c := startLibs(t, 1, 2)
	if err := c.servers[0].Barrier(); CodeOf(err) != CodeState || !strings.Contains(err.Error(), "only a worker") {
		t.Errorf("Barrier on a server: %v, want CodeState", err)
	}
	if err := c.servers[0].SetParamsSource(func(uint64, uint64, []byte) int { return 0 }); CodeOf(err) != CodeState {
		t.Errorf("SetParamsSource on a server: %v, want CodeState", err)
	}
	if r, err := c.sched.Rank(); err != nil || r != 0 {
		t.Errorf("scheduler Rank = %d, %v", r, err)
	}
	w0 := c.workers[0]
	one := Tensors{Keys: []uint64{5}, Lens: []int{64}, Data: make([]byte, 64)}
	err := c.each(func(_ int, l *Lib) error {
		if err := l.Declare(5, 64, int(frame.Float32), 0); err != nil {
			return err
		}
		return l.Init(Tensors{Keys: one.Keys, Lens: one.Lens, Data: make([]byte, 64)})
	})
	if err != nil {
		t.Fatal(err)
	}
	// Worker 1 never pushes iteration 1: worker 0's pull waits until the
	// node fails.
	if _, err := w0.Push(one, 0, nil); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	ts, err := w0.Pull(Tensors{Keys: one.Keys, Lens: one.Lens, Data: make([]byte, 64)}, func(_ int, err error) { got <- err })
	if err != nil {
		t.Fatal(err)
	}
	w0.w.Node().Fail(errors.New("test: worker 0 gives up"))
	select {
	case err := <-got:
		if CodeOf(err) != CodeCluster {
			t.Errorf("callback: %v, want CodeCluster", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the pull's callback never ran after the node failed")
	}
	if err := w0.Wait(ts); CodeOf(err) != CodeCluster || !strings.Contains(err.Error(), "gives up") {
		t.Errorf("Wait: %v, want CodeCluster with the node's error", err)
	}
	if err := w0.Wait(ts); err != nil {
		t.Errorf("second Wait: %v, want nil (the first took the error)", err)
	}
	if _, err := w0.Push(one, 0, nil); CodeOf(err) != CodeCluster {
		t.Errorf("Push after the failure: %v, want CodeCluster", err)
	}
	done := make(chan []error, 1)
	go func() { done <- c.finalize() }()
	select {
	case errs := <-done:
		if CodeOf(errs[len(errs)-2]) != CodeCluster {
			t.Errorf("worker 0's Finalize: %v, want CodeCluster", errs[len(errs)-2])
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Finalize hung after a failure")
	}
}

// fpt.h's enums must carry the values the Go side uses: cgo checks the
// functions' prototypes against the header, not the constants.
func TestHeaderConstants(t *testing.T) {
	src, err := os.ReadFile("../include/fpt.h")
	if err != nil {
		t.Fatal(err)
	}
	header := map[string]int{}
	for _, m := range regexp.MustCompile(`(?m)^\s*(FPT_[A-Z0-9_]+) = (\d+),?`).FindAllStringSubmatch(string(src), -1) {
		v, _ := strconv.Atoi(m[2])
		header[m[1]] = v
	}
	want := []struct {
		name  string
		value int
	}{
		{"FPT_OK", int(CodeOK)},
		{"FPT_ERR_ARG", int(CodeArg)},
		{"FPT_ERR_STATE", int(CodeState)},
		{"FPT_ERR_KEY", int(CodeKey)},
		{"FPT_ERR_SIZE", int(CodeSize)},
		{"FPT_ERR_CONFIG", int(CodeConfig)},
		{"FPT_ERR_CLUSTER", int(CodeCluster)},
		{"FPT_ERR_INTERNAL", int(CodeInternal)},
		{"FPT_ROLE_SCHEDULER", int(node.Scheduler)},
		{"FPT_ROLE_SERVER", int(node.Server)},
		{"FPT_ROLE_WORKER", int(node.Worker)},
		{"FPT_FLOAT32", int(frame.Float32)},
		{"FPT_FLOAT64", int(frame.Float64)},
		{"FPT_FLOAT16", int(frame.Float16)},
		{"FPT_BFLOAT16", int(frame.BFloat16)},
	}
	for _, w := range want {
		if v, ok := header[w.name]; !ok || v != w.value {
			t.Errorf("fpt.h: %s = %d (found %v), Go uses %d", w.name, v, ok, w.value)
		}
	}
	if len(header) != len(want) {
		t.Errorf("fpt.h has %d constants, the test knows %d: %v", len(header), len(want), header)
	}
}

// A C parameters source's status becomes the error the joining worker is
// told, naming the key and iteration; no source is no ParamsSource.
func TestParamsSource(t *testing.T) {
	if paramsSource(nil) != nil {
		t.Error("paramsSource(nil) is not nil: the worker would think a source is registered")
	}
	tests := []struct {
		name   string
		status int
		msg    string // "": no error
	}{
		{"success", 0, ""},
		{"failure", 5, "fpt_params_fn returned 5 for key 3 at iteration 17"},
		{"negative status", -1, "returned -1"},
	}
	for _, tt := range tests {
		var gotIter, gotKey uint64
		var gotLen int
		src := paramsSource(func(iteration, key uint64, dst []byte) int {
			gotIter, gotKey, gotLen = iteration, key, len(dst)
			copy(dst, "params")
			return tt.status
		})
		dst := make([]byte, 6)
		err := src(17, 3, dst)
		if gotIter != 17 || gotKey != 3 || gotLen != 6 {
			t.Errorf("%s: the C source got iteration %d, key %d, %d bytes; want 17, 3, 6", tt.name, gotIter, gotKey, gotLen)
		}
		switch {
		case tt.msg == "" && (err != nil || string(dst) != "params"):
			t.Errorf("%s: %v, dst %q; want no error and the source's bytes", tt.name, err, dst)
		case tt.msg != "" && (err == nil || !strings.Contains(err.Error(), tt.msg)):
			t.Errorf("%s: %v, want an error containing %q", tt.name, err, tt.msg)
		}
	}
}
