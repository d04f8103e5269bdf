// Package capi is the Go half of libfpt, fpt's C library (include/fpt.h,
// built from cmd/libfpt): one node per process, started from the DMLC_*
// environment, with status codes instead of Go errors, and asynchronous
// FPTPush/FPTPull on memory the caller owns.
//
// The package is plain Go so that its logic (the node's life cycle, the
// checks on every argument, callbacks; requests are the worker's) is
// tested with go test and the race detector; cmd/libfpt is the thin cgo
// shell that turns C pointers into the Go slices this package takes and
// its errors back into status codes and a last-error string.
package capi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"strconv"
	"sync"

	"github.com/fptps/fpt/cluster"
	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/customer"
	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/launch"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/worker"
)

// Code is a call's status, as the C caller sees it (fpt_status in fpt.h;
// the values must stay equal).
type Code int

// Status codes.
const (
	CodeOK       Code = 0 // success
	CodeArg      Code = 1 // a null pointer, a bad dtype or count, a duplicate key
	CodeState    Code = 2 // before fpt_start, after fpt_finalize, twice, the wrong role, or out of order
	CodeKey      Code = 3 // a key that was not declared
	CodeSize     Code = 4 // a length that disagrees with the declaration
	CodeConfig   Code = 5 // a missing or malformed DMLC_*/PS_*/FPT_* variable
	CodeCluster  Code = 6 // the cluster failed, timed out or terminated
	CodeInternal Code = 7 // a bug in fpt (a recovered Go panic)
)

// Error is a failed call: the code the C caller gets and why.
type Error struct {
	Code Code
	Err  error
}

func (e *Error) Error() string { return e.Err.Error() }

func (e *Error) Unwrap() error { return e.Err }

// CodeOf is err's status code: CodeOK for nil, CodeInternal for an error
// that does not carry one.
func CodeOf(err error) Code {
	if err == nil {
		return CodeOK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CodeInternal
}

func fail(code Code, op, format string, args ...any) error {
	return &Error{Code: code, Err: fmt.Errorf("capi: "+op+": "+format, args...)}
}

// state is where the library's single node is in its life.
type state int

const (
	idle       state = iota // nothing started; fpt_start may be called
	starting                // fpt_start is joining the cluster
	running                 // started
	broken                  // fpt_start failed after binding sockets: only fpt_finalize is left
	finalizing              // fpt_finalize is leaving the cluster
	finished                // finalized; the process cannot start another node
)

// Lib is one process's node, as the C library drives it. Its methods are
// safe for concurrent use by any number of C threads.
type Lib struct {
	lookup         func(string) (string, bool)
	environ        func() []string
	stdout, stderr io.Writer
	shutdown       func()

	mu       sync.Mutex
	state    state
	cfg      config.Config
	startErr error
	node     *launch.Node   // running, finalizing
	w        *worker.Worker // node.Worker(): nil unless a worker
	// startDone is closed when Start (starting) has ended; first is the
	// customer id it started as, extra a worker's further customers
	// (StartCustomer).
	startDone chan struct{}
	first     int
	extra     *cluster.Customers
	// alloc makes the buffers customer messages are read into
	// (SetAllocator); nil: Go memory.
	alloc customer.Allocator

	// submit is held for reading while a call hands a request to the
	// worker, and taken for writing by Finalize once the state says
	// finalizing: every request a call started is then known to the
	// worker's Finalize, which settles it and waits for its callback.
	submit sync.RWMutex

	// wires are the compressed keys' wire types (fpt_declare_wire).
	wires map[uint64]frame.DType
	// staged are idle wire buffers by size, for the next compressed call;
	// stageMade counts the buffers made (all back when it equals the idle
	// ones).
	stageMu   sync.Mutex
	staged    map[int][][]byte
	stageMade int
}

// New returns a library that reads its configuration through lookup (the
// C environment) and warns at start about the unknown variables of environ
// (the whole C environment; nil: no check), writes a scheduler's LB decisions to stdout as the fpt
// binaries do, logs to stderr, and calls shutdown once at the end of
// Finalize (control.Shutdown, which must run once per process; tests, which
// run many nodes in one process, pass a no-op).
func New(lookup func(string) (string, bool), environ func() []string, stdout, stderr io.Writer, shutdown func()) *Lib {
	return &Lib{lookup: lookup, environ: environ, stdout: stdout, stderr: stderr, shutdown: shutdown}
}

// Start joins the cluster in the role DMLC_ROLE names, through
// launch.Start as the fpt binaries do (metrics at FPT_METRICS_ADDR, LB
// decisions on stdout). A server or worker returns once the whole cluster
// has started; the scheduler runs in the background and returns at once
// (its outcome, such as a taken port, is Finalize's). A configuration
// error leaves the library as it was, so the environment can be fixed and
// Start called again; any other failure is final and only Finalize is
// left.
func (l *Lib) Start() error { return l.start("fpt_start", 0) }

// start is Start, as customer first of the process (StartCustomer).
func (l *Lib) start(op string, first int) error {
	l.mu.Lock()
	if l.state != idle {
		err := l.stateErr(op)
		l.mu.Unlock()
		return err
	}
	// As launch.Main does for the binaries: a typo'd name is otherwise
	// silently ignored.
	if l.environ != nil {
		for _, w := range config.Unknown(l.environ()) {
			fmt.Fprintf(l.stderr, "%s: warning: %s\n", op, w)
		}
	}
	cfg, err := config.FromEnv(l.lookup)
	if err != nil {
		l.mu.Unlock()
		return &Error{Code: CodeConfig, Err: fmt.Errorf("capi: %s: %w", op, err)}
	}
	l.state, l.cfg = starting, cfg
	l.startDone, l.first = make(chan struct{}), first
	spareProc(l.lookup)
	if cfg.Role == node.Worker {
		l.extra = &cluster.Customers{}
	}
	l.mu.Unlock()

	// The node bounds its start with FPT_START_TIMEOUT; a failed start has
	// released what it bound.
	n, err := launch.Start(context.Background(), cfg, launch.Deps{Log: launch.Logger(l.stderr, cfg), Decisions: l.stdout, Customers: l.extra})
	l.mu.Lock()
	defer l.mu.Unlock()
	defer close(l.startDone)
	if err != nil {
		l.state, l.startErr = broken, err
		return &Error{Code: classify(err, CodeCluster), Err: fmt.Errorf("capi: %s: %w", op, err)}
	}
	l.state, l.node, l.w = running, n, n.Worker()
	return nil
}

// spareProc gives the Go runtime one P (a processor for Go code) more
// than its default, unless the program's environment sets GOMAXPROCS,
// which it then applies (the runtime read the environment as the library
// loaded, perhaps before the program set it). The program's thread that
// calls the library goes back to C holding the P it ran on, to the
// runtime a thread in a system call, while it waits for a request or runs
// the program's own code: with the default, that leaves the library's
// goroutines one P short, and sysmon takes it back, hands it on and wakes
// a thread for it, step after step. With one to spare, a small step wakes
// a quarter to a third fewer threads (docs/latency.md). It is idempotent:
// each call starts from the default.
func spareProc(lookup func(string) (string, bool)) {
	if v, set := lookup("GOMAXPROCS"); set {
		if n, err := strconv.Atoi(v); err == nil && n > 0 {
			runtime.GOMAXPROCS(n)
		}
		return
	}
	// Reading the default and adding one is two steps on a setting of the
	// whole process: nodes starting at once would each add their one.
	procMu.Lock()
	defer procMu.Unlock()
	runtime.SetDefaultGOMAXPROCS()
	runtime.GOMAXPROCS(runtime.GOMAXPROCS(0) + 1)
}

// procMu serialises spareProc's changes to GOMAXPROCS, which belongs to
// the process, not to a Lib.
var procMu sync.Mutex

// Finalize leaves the cluster: a worker waits for its outstanding requests
// and their callbacks (the worker's Finalize does) and passes the final
// barrier, a server or the scheduler serves until the cluster terminates. When it returns, every callback has returned and the
// process's ZeroMQ context is flushed; no node can be started again.
func (l *Lib) Finalize() error {
	const op = "fpt_finalize"
	l.mu.Lock()
	prev := l.state
	if prev != running && prev != broken {
		err := l.stateErr(op)
		l.mu.Unlock()
		return err
	}
	l.state = finalizing
	l.mu.Unlock()
	// A fence: calls already submitting finish, later ones see finalizing.
	l.submit.Lock()
	l.submit.Unlock()

	var err error
	if prev != broken { // a failed Start released the node already
		err = l.node.Finalize(context.Background())
	}
	l.shutdown()
	l.mu.Lock()
	l.state = finished
	alloc := l.alloc
	l.mu.Unlock()
	if d, ok := alloc.(interface{ Drain() }); ok {
		d.Drain() // no message comes any more: the kept blocks go back
	}
	if err != nil {
		return &Error{Code: classify(err, CodeCluster), Err: fmt.Errorf("capi: %s: %w", op, err)}
	}
	return nil
}

// stateErr says why a call is not allowed now. Caller holds l.mu.
func (l *Lib) stateErr(op string) error {
	switch l.state {
	case idle:
		return fail(CodeState, op, "fpt_start has not been called")
	case starting:
		return fail(CodeState, op, "fpt_start is still joining the cluster")
	case running:
		return fail(CodeState, op, "fpt_start was called already (one node per process)")
	case broken:
		return &Error{Code: CodeState, Err: fmt.Errorf("capi: %s: fpt_start failed, only fpt_finalize is left: %w", op, l.startErr)}
	case finalizing:
		return fail(CodeState, op, "fpt_finalize is in progress")
	}
	return fail(CodeState, op, "fpt_finalize was called (a process runs one node; it cannot start again)")
}

// Role is the node's role (node.Role values): DMLC_ROLE before Start.
func (l *Lib) Role() (node.Role, error) {
	cfg, err := l.config("fpt_role")
	return cfg.Role, err
}

// NumWorkers is DMLC_NUM_WORKER; it is readable before Start.
func (l *Lib) NumWorkers() (int, error) {
	cfg, err := l.config("fpt_num_workers")
	return cfg.NumWorkers, err
}

// NumWorkersAt is the number of workers whose pushes the sums of
// iteration iter add up (worker.Worker.NumWorkersAt): DMLC_NUM_WORKER,
// unless a worker left (FPT_ON_WORKER_LOSS=continue or wait) or joined
// the job. Workers only, once started.
func (l *Lib) NumWorkersAt(iter uint64) (int, error) {
	w, err := l.worker("fpt_num_workers_at")
	if err != nil {
		return 0, err
	}
	return w.NumWorkersAt(iter), nil
}

// RankAt is this worker's dense rank among the workers of iteration iter
// (worker.Worker.RankAt). Workers only, once started.
func (l *Lib) RankAt(iter uint64) (int, error) {
	w, err := l.worker("fpt_rank_at")
	if err != nil {
		return 0, err
	}
	return w.RankAt(iter), nil
}

// NumServers is DMLC_NUM_SERVER; it is readable before Start.
func (l *Lib) NumServers() (int, error) {
	cfg, err := l.config("fpt_num_servers")
	return cfg.NumServers, err
}

// config is the running node's configuration or, before Start, the
// environment's: MXNet asks a process's role before it starts the node.
func (l *Lib) config(op string) (config.Config, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch l.state {
	case idle:
		cfg, err := config.FromEnv(l.lookup)
		if err != nil {
			return config.Config{}, &Error{Code: CodeConfig, Err: fmt.Errorf("capi: %s: %w", op, err)}
		}
		return cfg, nil
	case finished:
		return config.Config{}, l.stateErr(op)
	}
	return l.cfg, nil
}

// Rank is the node's rank among the workers or the servers (0 for the
// scheduler), once started.
func (l *Lib) Rank() (int, error) {
	const op = "fpt_rank"
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != running && l.state != finalizing {
		return 0, l.stateErr(op)
	}
	return l.node.Rank(), nil
}

// worker returns the running worker, or why op cannot run.
func (l *Lib) worker(op string) (*worker.Worker, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != running {
		return nil, l.stateErr(op)
	}
	if l.w == nil {
		return nil, fail(CodeState, op, "only a worker can call it; this node is the %s", l.cfg.Role)
	}
	return l.w, nil
}

// SetTensorsPerIteration announces how many tensors one iteration pushes.
func (l *Lib) SetTensorsPerIteration(n int) error {
	const op = "fpt_set_tensors_per_iteration"
	w, err := l.worker(op)
	if err != nil {
		return err
	}
	if err := w.SetTensorsPerIteration(n); err != nil {
		return &Error{Code: CodeArg, Err: fmt.Errorf("capi: %s: %w", op, err)}
	}
	return nil
}

// Declare declares a tensor: its key, size in bytes, dtype (frame.DType
// values) and priority (larger first; MXNet uses minus the layer index).
func (l *Lib) Declare(key, bytes uint64, dtype, priority int) error {
	const op = "fpt_declare"
	w, err := l.worker(op)
	if err != nil {
		return err
	}
	d := frame.DType(dtype)
	if dtype < 0 || dtype > math.MaxUint8 || d.Size() == 0 {
		return fail(CodeArg, op, "key %d: unknown dtype %d (FPT_FLOAT32, FPT_FLOAT64, FPT_FLOAT16 or FPT_BFLOAT16)", key, dtype)
	}
	if priority < math.MinInt32 || priority > math.MaxInt32 {
		return fail(CodeArg, op, "key %d: priority %d out of range", key, priority)
	}
	if err := w.DeclareBytes(key, bytes, d, int32(priority)); err != nil {
		return wrap(op, w, err)
	}
	return nil
}

// Init sets t's keys to worker 0's values on every worker, in t.Data
// (collective: every worker calls it with the same keys, before their
// first push).
func (l *Lib) Init(t Tensors) error {
	return l.collective("fpt_init", t, (*worker.Worker).InitBytes)
}

// Broadcast is Init for keys no iteration pushes again (fpt_broadcast).
func (l *Lib) Broadcast(t Tensors) error {
	return l.collective("fpt_broadcast", t, (*worker.Worker).BroadcastBytes)
}

// collective runs a blocking call of every worker (Init, Broadcast) on
// t's keys, through their 16-bit wire where they have one: narrowed
// before, widened into t.Data after a success.
func (l *Lib) collective(op string, t Tensors, call func(w *worker.Worker, ctx context.Context, keys []uint64, data []byte, byteLens []int) error) error {
	w, err := l.worker(op)
	if err != nil {
		return err
	}
	wc, err := l.wireOf(op, t)
	if err != nil {
		return err
	}
	if wc != nil {
		wc.narrow()
		t = wc.wire
	}
	err = call(w, context.Background(), t.Keys, t.Data, t.Lens)
	if wc != nil {
		if err == nil {
			wc.widen()
		}
		wc.release()
	}
	if err != nil {
		return wrap(op, w, err)
	}
	return nil
}

// Callback learns that request ts settled; err is nil on success.
type Callback func(ts int, err error)

// Push is FPTPush of t at priority: asynchronous, t.Data must stay
// untouched until the request settles. cb, if not nil, runs once, on a
// goroutine of its own, when it does, successful or not.
func (l *Lib) Push(t Tensors, priority int, cb Callback) (int, error) {
	return l.push("fpt_push", t, nil, false, priority, cb)
}

// PushPull is FPTPushPull: t.Data is pushed at priority and the keys' sums
// of that iteration land in outs (t.Data's size; it may be t.Data itself),
// in one request: every key's result has its waiter before the first
// frame leaves, so it is read once, straight into outs. Asynchronous,
// like Push: t.Data must stay untouched, and outs unread, until the
// request settles.
func (l *Lib) PushPull(t Tensors, outs []byte, priority int, cb Callback) (int, error) {
	return l.push("fpt_push_pull", t, outs, true, priority, cb)
}

// push is Push, or with pull PushPull into outs.
func (l *Lib) push(op string, t Tensors, outs []byte, pull bool, priority int, cb Callback) (int, error) {
	l.submit.RLock()
	defer l.submit.RUnlock()
	w, err := l.worker(op)
	if err != nil {
		return 0, err
	}
	if priority < math.MinInt32 || priority > math.MaxInt32 {
		return 0, fail(CodeArg, op, "priority %d out of range", priority)
	}
	if pull && len(outs) != len(t.Data) {
		return 0, fail(CodeSize, op, "the output buffer has %d bytes, the values %d", len(outs), len(t.Data))
	}
	if err := l.alive(w, op); err != nil {
		return 0, err
	}
	wc, err := l.wireOf(op, t)
	if err != nil {
		return 0, err
	}
	if wc != nil {
		wc.narrow()
		if pull {
			// The wire buffer takes the narrowed values and then, in
			// place, the sums, which widen into outs.
			wc.user.Data = outs
			outs = wc.wire.Data
		}
		t = wc.wire
		cb = wc.then(cb, pull)
	}
	wcb, known := callback(cb)
	var ts int
	if pull {
		ts, err = w.FPTPushPullBytes(t.Keys, t.Data, outs, t.Lens, int32(priority), wcb)
	} else {
		ts, err = w.FPTPushBytes(t.Keys, t.Data, t.Lens, int32(priority), wcb)
	}
	if err != nil {
		if wc != nil {
			wc.release() // a refused call never runs its callback
		}
		return 0, wrap(op, w, err)
	}
	known(ts)
	return ts, nil
}

// Pull is FPTPull into t.Data: the sums of the keys' next unpulled
// iteration, once they arrived. Asynchronous, like Push.
func (l *Lib) Pull(t Tensors, cb Callback) (int, error) {
	const op = "fpt_pull"
	l.submit.RLock()
	defer l.submit.RUnlock()
	w, err := l.worker(op)
	if err != nil {
		return 0, err
	}
	if err := l.alive(w, op); err != nil {
		return 0, err
	}
	wc, err := l.wireOf(op, t)
	if err != nil {
		return 0, err
	}
	if wc != nil {
		cb = wc.then(cb, true)
		t = wc.wire
	}
	wcb, known := callback(cb)
	ts, err := w.FPTPullBytes(t.Keys, t.Data, t.Lens, wcb)
	if err != nil {
		if wc != nil {
			wc.release() // a refused call never runs its callback
		}
		return 0, wrap(op, w, err)
	}
	known(ts)
	return ts, nil
}

// alive refuses new requests once the node has failed: they could only
// fail later, and each would hold a record until someone waits for it.
func (l *Lib) alive(w *worker.Worker, op string) error {
	if err := w.Node().Err(); err != nil {
		return &Error{Code: CodeCluster, Err: fmt.Errorf("capi: %s: %w", op, err)}
	}
	return nil
}

// callback adapts cb to the worker's callback, which runs on a goroutine
// of its own once the request settles, successful or not. cb learns the
// request's timestamp, which the worker returns only after taking the
// callback: known passes it on once the call returned (the callback waits
// for it; a call that fails never runs the callback).
func callback(cb Callback) (_ worker.Callback, known func(ts int)) {
	if cb == nil {
		return nil, func(int) {}
	}
	tsc := make(chan int, 1)
	return func(err error) {
		ts := <-tsc
		cb(ts, requestErr(ts, err))
	}, func(ts int) { tsc <- ts }
}

// requestErr is a settled request's error as the C caller sees it.
func requestErr(ts int, err error) error {
	if err == nil {
		return nil
	}
	return &Error{Code: CodeCluster, Err: fmt.Errorf("capi: request %d: %w", ts, err)}
}

// Wait blocks until request ts has settled and its callback returned, and
// returns its error (the worker's Wait). A failed request's error goes to
// the first Wait that asks; later ones, like Waits for requests that
// succeeded, return nil.
func (l *Lib) Wait(ts int) error {
	const op = "fpt_wait"
	w, err := l.requestWorker(op)
	if err != nil {
		return err
	}
	err = worker.ErrNoRequest // a server or the scheduler made none
	if w != nil {
		err = w.Wait(ts)
	}
	if errors.Is(err, worker.ErrNoRequest) {
		return fail(CodeArg, op, "no request %d", ts)
	}
	return requestErr(ts, err)
}

// Notify is Wait without blocking a goroutine (the worker's Notify): fn
// runs with the error Wait would return once request ts has settled, on
// the goroutine that released it, unless it settled already: then Notify
// returns done and that error.
func (l *Lib) Notify(ts int, fn func(error)) (done bool, err error) {
	const op = "fpt_wait"
	w, err := l.requestWorker(op)
	if err != nil {
		return true, err
	}
	err = worker.ErrNoRequest // a server or the scheduler made none
	if w != nil {
		done, err = w.Notify(ts, func(err error) { fn(requestErr(ts, err)) })
		if !done {
			return false, nil
		}
	}
	if errors.Is(err, worker.ErrNoRequest) {
		return true, fail(CodeArg, op, "no request %d", ts)
	}
	return true, requestErr(ts, err)
}

// requestWorker is the worker whose requests op asks about (nil on a
// server or the scheduler), or op's state error before fpt_start or
// after fpt_finalize.
func (l *Lib) requestWorker(op string) (*worker.Worker, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != running && l.state != finalizing {
		return nil, l.stateErr(op)
	}
	return l.w, nil
}

// Test reports, without blocking, whether request ts has settled and its
// callback returned (Wait would return at once).
func (l *Lib) Test(ts int) (bool, error) {
	const op = "fpt_test"
	w, err := l.requestWorker(op)
	if err != nil {
		return false, err
	}
	if w == nil {
		return false, fail(CodeArg, op, "no request %d", ts)
	}
	done, err := w.Test(ts)
	if err != nil {
		return false, fail(CodeArg, op, "no request %d", ts)
	}
	return done, nil
}

// Barrier waits for every worker to call it.
func (l *Lib) Barrier() error {
	const op = "fpt_barrier"
	w, err := l.worker(op)
	if err != nil {
		return err
	}
	if err := w.Barrier(context.Background(), node.WorkerGroup); err != nil {
		return &Error{Code: CodeCluster, Err: fmt.Errorf("capi: %s: %w", op, err)}
	}
	return nil
}

// wrap gives a worker's error its code: the worker's sentinels name bad
// keys, sizes and order; a failed node is the cluster's fault; anything
// else the worker refused is a bad argument.
func wrap(op string, w *worker.Worker, err error) error {
	code := CodeArg
	if w.Node().Err() != nil {
		code = CodeCluster
	}
	return &Error{Code: classify(err, code), Err: fmt.Errorf("capi: %s: %w", op, err)}
}

// classify maps the errors fpt's packages wrap to codes, else def.
func classify(err error, def Code) Code {
	var ve *config.VarError
	switch {
	case errors.Is(err, worker.ErrNotDeclared):
		return CodeKey
	case errors.Is(err, worker.ErrSizeMismatch):
		return CodeSize
	case errors.Is(err, worker.ErrPullBeforePush):
		return CodeState
	case errors.Is(err, cluster.ErrTerminated):
		return CodeCluster
	case errors.As(err, &ve):
		return CodeConfig
	}
	return def
}
