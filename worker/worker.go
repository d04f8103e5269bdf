// Package worker is the API a training program uses on a worker node.
//
// FPT's calls: FPTPush sends each tensor's partitions to the aggregators
// that own them; each aggregator sums the W workers' contributions and sends
// the sum to every worker on its own, so FPTPull only waits for the local
// result (no extra round trip); partitions that arrive while an FPTPull
// waits are read by the van straight into the caller's buffer. Tensors are declared up front
// (key, size, dtype, priority), which makes every key's iteration number
// known to every node: a key's n-th FPTPush belongs to iteration n.
// Iteration 0 is the key's init round: every worker ends up with worker 0's
// value (ps-lite/MXNet init semantics); Init wraps it in barriers.
//
// ps-lite's classic calls are here too: Push, Pull and PushPull over keys
// sliced by range across the servers, with Wait(timestamp) and callbacks.
//
// Every asynchronous call completes the same way: its Callback runs once
// with the request's error (nil on success, the node's failure otherwise),
// and Wait(timestamp) returns after it. The C library (package capi) uses
// the same callbacks and Wait.
//
// KV[T] is the typed face (like ps-lite's KVWorker<Val>) for float32 and
// float64; the Worker underneath works on bytes.
//
// The logic lives in core (core.go, classic_core.go), which does no I/O;
// Worker is its shell: it locks, calls the core, unlocks, then sends
// frames, adds local contributions and runs callbacks as the core says.
package worker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fptps/fpt/classic"
	"github.com/fptps/fpt/cluster"
	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/customer"
	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/metrics"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/role"
	"github.com/fptps/fpt/trace"
	"github.com/fptps/fpt/van"
)

// Worker is a running worker node.
type Worker struct {
	node    *cluster.Member
	metrics *metrics.Node   // nil: none
	trace   *trace.Recorder // nil: not tracing
	base    *role.Base

	mu sync.Mutex
	c  *core
	// params is the program's parameters source, for a joining worker.
	params ParamsSource
	// moved is closed (and replaced) when the LB's horizon rises.
	moved chan struct{}

	quit     chan struct{} // closed by Finalize: watch stops
	quitOnce sync.Once
	// failed is closed by watch once the node failed and every request
	// outstanding was settled with its error (Failed).
	failed chan struct{}
	// lagg is this worker's side of its host's groups
	// (localagg_groups.go); nil when it sums nothing locally. Set once
	// the worker started; the directives that come before wait in
	// laggStart.
	lagg      atomic.Pointer[localGroups]
	laggStart localStart
}

var _ van.Sink = (*Worker)(nil)

// Start joins the cluster as a worker and returns once every node has.
// With the LB on (config.LB), the worker reports its measured rates to
// the scheduler each iteration and follows its decisions.
func Start(ctx context.Context, n *cluster.Member) (*Worker, error) {
	cfg := n.Config()
	w := &Worker{
		node:    n,
		metrics: n.Metrics(),
		trace:   n.Tracer(),
		c:       newCore(cfg.PartitionBytes, cfg.Grants()),
		moved:   make(chan struct{}),
		quit:    make(chan struct{}),
		failed:  make(chan struct{}),
	}
	w.c.retryMode = cfg.Retries()
	w.c.sumsAgainOnWorkerLoss = cfg.WorkerLoss != config.WorkerLossFail
	w.base = role.New(n, w.deliverLocal, w.follow, w.left)
	n.OnLayout(func(l classic.Layout) { w.update(func(c *core) effects { return c.newLayout(l) }) })
	if err := w.base.Start(ctx, w); err != nil {
		return nil, err
	}
	w.mu.Lock()
	if n.Joined() {
		w.c.joining()
	}
	w.c.newLayout(n.Layout()) // before start: nothing is parked
	err := w.c.start(n.Self().ID, n.Servers(), n.Workers())
	var t effects
	if err == nil {
		t.notices = w.c.drainedOutside(n.Servers(), w.c.layout)
	}
	w.mu.Unlock()
	if err != nil {
		w.base.Close()
		n.Close()
		return nil, err
	}
	lagg, err := startLocal(n, w.deliverLocal, w.base.Agg)
	if err != nil {
		w.base.Close()
		n.Close()
		return nil, err
	}
	w.laggStart.started(&w.lagg, lagg, w.WorkersAt)
	w.do(t)
	go w.watch()
	return w, nil
}

// watch settles every outstanding request with the node's failure, so
// that callbacks and Waits learn of it. It stops the data plane first:
// the van may still hold the caller's memory (a push's values queued in
// the pool, a pull's buffer it reads a result into), and a caller told
// that a request failed may free it at once (a C program will). Closing
// the van fails or finishes every queued frame and ends its receiver.
//
// A node closed without a failure (Close, or the cluster's end) settles
// what is still outstanding too: nothing can complete it any more.
func (w *Worker) watch() {
	select {
	case <-w.node.Done():
	case <-w.node.Closed():
	case <-w.quit:
		if w.node.Err() == nil {
			return
		}
	}
	// A result the van's receiver hands a group may wait for a chunk
	// that members gone (a lost leader's) never free: woken first, or
	// closing the van waits for it for ever.
	w.lagg.Load().stop()
	if err := w.node.CloseVan(); err != nil {
		w.node.Logger().Warn("closing the data plane after the node failed", "err", err)
	}
	err := w.node.Err()
	failed := err != nil
	if !failed {
		err = fmt.Errorf("worker: the node left the cluster: %w", cluster.ErrTerminated)
	}
	w.update(func(c *core) effects { return c.fail(err) })
	w.lagg.Load().close()
	if failed {
		close(w.failed)
	}
}

// update runs f on the core under the lock, then does what it returned.
func (w *Worker) update(f func(*core) effects) {
	w.mu.Lock()
	t := f(w.c)
	w.mu.Unlock()
	w.do(t)
}

// do carries out a core's effects, without the lock, in its order.
func (w *Worker) do(t effects) {
	for _, m := range t.unmap {
		if err := unmapKept(m); err != nil {
			w.node.Logger().Warn("unmapping the values kept after Init", "err", err)
		}
	}
	if t.duty != nil {
		w.sendParams(t.duty)
	}
	if len(t.initials) > 0 {
		for _, c := range t.initials {
			copyPreemptible(c.dst, c.src)
		}
		w.update(func(c *core) effects { return c.initialCopied(t.initials) })
	}
	if req := t.req; req != nil {
		err := w.hand(req, t.locals, t.sends, t.counted)
		w.update(func(c *core) effects { return c.handedOver(req, err) })
	}
	for _, rs := range t.resends {
		if err := w.hand(rs.req, rs.locals, rs.sends, true); err != nil {
			w.update(func(c *core) effects { return c.settle(rs.req, 0, err) })
		}
	}
	for _, d := range t.copies {
		for _, p := range d.parts {
			copy(d.pw.dst[p.Offset:p.Offset+p.Length], d.buf[p.Offset:p.Offset+p.Length])
		}
		w.update(func(c *core) effects { return c.copied(d) })
	}
	for _, r := range t.finished {
		w.complete(r)
	}
	if b := t.began; b != nil && w.base.Agent != nil {
		w.base.Agent.IterationBegan(b.iter, b.modelBytes, b.version)
	}
	for i := range t.notices {
		if err := w.node.Van().Forward(&t.notices[i]); err != nil {
			// A lost server: it waits for nothing any more.
			w.node.Logger().Debug("notice not sent", "frame", &t.notices[i].Header, "err", err)
		}
	}
}

// hand adds req's local contributions to the aggregator and queues its
// frames; with counted, each frame's Done settles one of req's items. It
// returns the local contributions' error.
func (w *Worker) hand(req *request, locals, sends []frame.Message, counted bool) error {
	// A worker of a group adds its own contribution to a partition it
	// aggregates into its host's sum too: the host sum then counts for
	// every worker of the group, this one included.
	locals, lerr := w.lagg.Load().intercept(locals)
	if lerr != nil {
		w.node.Fail(lerr)
		return lerr
	}
	var err error
	for i := range locals {
		m := &locals[i]
		w.trace.Begin(trace.Push, &m.Header)
		if err = w.base.Agg.AddLocal(&m.Header, m.Payload); err != nil {
			err = fmt.Errorf("worker: own contribution to %s: %w", &m.Header, err)
			break
		}
		w.trace.End(trace.Push, &m.Header)
	}
	if counted {
		for i := range sends {
			to, h := node.ID(sends[i].Header.Recipient), &sends[i].Header
			w.trace.Begin(trace.Push, h)
			sends[i].Done = func(err error) {
				w.trace.End(trace.Push, h)
				if err != nil {
					err = w.sendError(to, err)
				}
				w.update(func(c *core) effects { return c.sentFrame(req, h, err) })
			}
		}
	}
	// Pushes summed on the host do not go to the van.
	sends, lerr = w.lagg.Load().intercept(sends)
	if lerr != nil {
		w.node.Fail(lerr)
		return lerr
	}
	for i := range sends {
		m := &sends[i]
		if serr := w.node.Van().Send(m); serr != nil {
			to := node.ID(m.Header.Recipient)
			rerr := w.sendError(to, serr)
			if rerr == nil && counted {
				w.update(func(c *core) effects { return c.sentFrame(req, &m.Header, nil) })
				continue
			}
			if rerr == nil {
				// A frame no retry sends again (a classic request's):
				// its request fails, naming the peer.
				rerr = w.toPeer(to, serr)
			}
			serr = rerr
			w.update(func(c *core) effects { return c.sendFailed(req, &m.Header, serr) })
			break
		}
	}
	return err
}

// sendError is what a frame to peer id that could not be sent means for
// its request. A frame lost with a server under FPT_ON_SERVER_LOSS=retry,
// or with a worker (an aggregator of a balanced split) under
// FPT_ON_WORKER_LOSS=continue, means nothing (nil): if the peer is gone,
// the scheduler's retry decision has this worker push the frame's
// iteration again; if it is not, the cluster fails anyway.
func (w *Worker) sendError(id node.ID, err error) error {
	if cfg := w.node.Config(); cfg.Survives(id) {
		w.node.Logger().Debug("frame to a lost peer; a retry sends it again", "peer", id, "err", err)
		return nil
	}
	return w.toPeer(id, err)
}

// left is told that a server or a worker left the job (role.New's
// left): a worker that made classic requests cannot go on without a
// server, since the lost server's classic keys are lost with it (they move
// when a server joins, but are not replicated). A lost worker changes
// nothing for them.
func (w *Worker) left(id node.ID, graceful bool) error {
	if r, _ := id.Role(); r != node.Server || graceful {
		return nil // a server that left in order handed its keys over
	}
	w.mu.Lock()
	used := w.c.classicUsed
	w.mu.Unlock()
	if used {
		return fmt.Errorf("worker: server %s left the job, and the classic Push/Pull keys it held are lost with it (FPT_ON_SERVER_LOSS=retry covers FPTPush and FPTPull only)", id)
	}
	return nil
}

// toPeer names the peer a send failed to, by role, rank and address (the
// van knows only its id): when a peer dies, the first error a caller sees
// may be its own push's, before the cluster's verdict arrives.
func (w *Worker) toPeer(id node.ID, err error) error {
	if info, ok := w.node.Info(id); ok {
		return fmt.Errorf("to %s: %w", info, err)
	}
	return fmt.Errorf("to %s: %w", id, err)
}

// newCall is the shell's half of a new request.
func newCall(cb Callback, pull bool) *call {
	return &call{cb: cb, done: make(chan struct{}), pull: pull, began: time.Now()}
}

// complete runs a finished request's callback, then releases its waiters:
// as in ps-lite, Wait returns after the callback. The callback runs on a
// goroutine of its own, since it may call back into the worker (push
// again) and must not hold up the van's goroutine that completed the
// request.
func (w *Worker) complete(r *request) {
	cl := r.call
	traced := w.trace.Now()
	if r.err == nil && !cl.began.IsZero() {
		took := time.Since(cl.began)
		if cl.pull {
			w.metrics.ObservePull(took)
		}
		if !cl.pull || cl.pushPull {
			w.metrics.ObservePush(took)
		}
	}
	if cl.cb == nil {
		w.release(r)
		w.traceRequest(trace.Settle, r, traced)
		return
	}
	go func() {
		cl.cb(r.err)
		w.release(r)
		w.traceRequest(trace.Settle, r, traced)
	}()
}

// traceRequest records phase p of FPTPush or FPTPull request r, begun at
// start (the recorder's Now), on the timeline.
func (w *Worker) traceRequest(p trace.Phase, r *request, start int64) {
	if w.trace != nil && r.fpt {
		w.trace.Request(p, r.key, r.iter, r.bytes, r.call.pull, start)
	}
}

func (w *Worker) release(r *request) {
	w.mu.Lock()
	w.c.release(r)
	notify := r.call.notify
	var err error
	if len(notify) > 0 {
		err = w.c.collect(r.ts) // the first waiter's, as Wait's
	}
	w.mu.Unlock()
	close(r.call.done)
	for i, fn := range notify {
		if i > 0 {
			err = nil
		}
		fn(err)
	}
}

// Notify is Wait without blocking a goroutine: fn runs with the request's
// error (as Wait would return it) once request ts has settled and its
// callback returned, on the goroutine that released it, which fn must not
// hold up. A request settled already runs no fn: Notify returns done and
// its outcome (ErrNoRequest for a timestamp no call returned). The C
// library's fpt_wait blocks its thread in C on what fn signals, so the
// thread wakes without waiting for the Go scheduler.
func (w *Worker) Notify(ts int, fn func(error)) (done bool, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	r, err := w.c.lookup(ts)
	if r == nil {
		return true, err
	}
	began := w.trace.Now()
	r.call.notify = append(r.call.notify, func(err error) {
		w.traceRequest(trace.Wait, r, began) // up to the signal
		fn(err)
	})
	return false, nil
}

// Wait blocks until the request with timestamp ts has completed and its
// callback returned, and returns its error. A failed request's error goes
// to the first Wait that asks; later ones, like Waits for requests that
// succeeded, return nil. A timestamp no call returned is ErrNoRequest.
func (w *Worker) Wait(ts int) error {
	w.mu.Lock()
	r, err := w.c.lookup(ts)
	w.mu.Unlock()
	if r == nil {
		return err
	}
	began := w.trace.Now()
	<-r.call.done
	w.mu.Lock()
	err = w.c.collect(ts)
	w.mu.Unlock()
	w.traceRequest(trace.Wait, r, began)
	return err
}

// Test reports, without blocking, whether request ts has settled and its
// callback returned: a Wait on it would return at once. A timestamp no
// call returned is ErrNoRequest.
func (w *Worker) Test(ts int) (bool, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.c.settled(ts)
}

// DecisionVersion is the version of the latest LB decision this worker has
// received (0: the initial even split over the servers).
func (w *Worker) DecisionVersion() uint32 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.c.decisionVersion()
}

// follow applies the LB's directive (lbagent.Apply).
func (w *Worker) follow(d lb.Directive) error {
	// Before the core takes the decision: every push cut under it (a
	// retry's, and any the program makes meanwhile) goes to the group it
	// forms, never into one whose leader may not have dissolved it yet.
	w.laggStart.follow(&w.lagg, d, w.WorkersAt)
	w.mu.Lock()
	t, moved, err := w.c.follow(d)
	if moved {
		close(w.moved)
		w.moved = make(chan struct{})
	}
	w.mu.Unlock()
	if err != nil {
		return err
	}
	w.do(t)
	return nil
}

// WorkersAt returns the workers whose pushes make up the sums of
// iteration iter, in increasing id order (a key's iteration n is its n-th
// FPTPush, 0 the init round). All of them, unless a worker was lost under
// FPT_ON_WORKER_LOSS=continue: from the iteration its retry took effect
// at, the sums add up the workers left. The answer for an iteration is
// final once a pull of it has completed.
func (w *Worker) WorkersAt(iter uint64) []node.ID {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.c.workersAt(iter)
}

// NumWorkersAt is len(WorkersAt(iter)): what a program divides an
// iteration's sums by to average them.
func (w *Worker) NumWorkersAt(iter uint64) int { return len(w.WorkersAt(iter)) }

// RankAt is this worker's dense rank among WorkersAt(iter), 0 to
// NumWorkersAt(iter)-1: Rank until a worker is lost, then the rank a
// program reshards its data by (-1 if this worker is not among them).
func (w *Worker) RankAt(iter uint64) int { return slices.Index(w.WorkersAt(iter), w.node.Self().ID) }

// Rank is this worker's rank, from its id: 0..NumWorkers-1 for the
// workers that started the job, the next rank no worker had for one that
// joined it (RankAt is the dense rank among an iteration's workers).
func (w *Worker) Rank() int { return w.node.Self().ID.Rank() }

// NumWorkers is the number of workers in the cluster.
func (w *Worker) NumWorkers() int { return w.node.Config().NumWorkers }

// NumServers is the number of servers in the cluster.
func (w *Worker) NumServers() int { return w.node.Config().NumServers }

// Failed is closed as soon as the node fails (a peer lost, the scheduler's
// verdict, a bad frame), never when it leaves the cluster in order: once
// every outstanding request has failed with the node's error, and every
// call made after refuses. A training program that does not watch a
// context, or one that blocks elsewhere, learns of the failure there
// while its own code still runs, as C and Python programs do from their
// calls' status; Err says why.
func (w *Worker) Failed() <-chan struct{} { return w.failed }

// Err is why the node failed, or nil while it has not.
func (w *Worker) Err() error { return w.node.Err() }

// Node is the worker's cluster membership.
func (w *Worker) Node() *cluster.Member { return w.node }

// Barrier waits for every worker (group node.WorkerGroup) or any other group.
func (w *Worker) Barrier(ctx context.Context, g node.Group) error { return w.node.Barrier(ctx, g) }

// finalizeWait bounds how long Finalize waits for outstanding requests: an
// FPTPull of an iteration the other workers never push would otherwise
// hold this worker, and with it the final barrier, forever.
const finalizeWait = 30 * time.Second

// Finalize waits for the worker's outstanding requests and their
// callbacks, passes the final barrier and leaves the cluster. After a
// failure every outstanding request settles with it, and Finalize still
// returns only once their callbacks have.
func (w *Worker) Finalize(ctx context.Context) error {
	// Last: the group's leader hands results over until every worker
	// passed the final barrier.
	defer w.lagg.Load().close()
	defer w.base.Close()
	defer w.quitOnce.Do(func() { close(w.quit) })
	w.mu.Lock()
	pending := w.c.pending()
	w.mu.Unlock()
	deadline := time.NewTimer(finalizeWait)
	defer deadline.Stop()
	var err error
wait:
	for _, r := range pending {
		select {
		case <-r.call.done:
		case <-w.node.Done():
			break wait
		case <-deadline.C:
			err = fmt.Errorf("worker: Finalize: request %d still outstanding after %s (an FPTPull of an iteration the other workers did not push?)", r.ts, finalizeWait)
			w.node.Fail(err)
			break wait
		}
	}
	// On a failure watch settles them all; their callbacks run first.
	for _, r := range pending {
		<-r.call.done
	}
	if err == nil {
		err = w.node.Err()
	}
	if err != nil {
		w.node.Close()
		return err
	}
	return w.node.Finalize(ctx)
}

// SetTensorsPerIteration announces how many tensors one iteration pushes
// (FPT's kvstore announces it the same way). Declaring more keys than that
// is then an error, which catches a model and a launch script that disagree.
func (w *Worker) SetTensorsPerIteration(n int) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.c.setTensorsPerIteration(n)
}

// declare registers a tensor of the given size in bytes.
func (w *Worker) declare(key uint64, dtype frame.DType, bytes uint64, priority int32) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.c.declare(key, dtype, bytes, priority)
}

// fptPush is FPTPush on bytes: byteLens[i] bytes of data belong to keys[i].
// It waits while an iteration it pushes lies beyond the LB's horizon: the
// decision for it may still be on its way.
func (w *Worker) fptPush(keys []uint64, data []byte, byteLens []int, dtype frame.DType, priority int32, cb Callback) (int, error) {
	return w.pushing(newCall(cb, false), func(c *core, cl *call) (effects, error) {
		return c.push(keys, data, byteLens, dtype, priority, cl)
	})
}

// fptPushPull is FPTPushPull on bytes: it waits for the horizon as
// fptPush does.
func (w *Worker) fptPushPull(keys []uint64, data, outs []byte, byteLens []int, dtype frame.DType, priority int32, cb Callback) (int, error) {
	cl := newCall(cb, true)
	cl.pushPull = true
	return w.pushing(cl, func(c *core, cl *call) (effects, error) {
		return c.pushPull(keys, data, outs, byteLens, dtype, priority, cl)
	})
}

// pushing makes a request that pushes (push, under the lock), waiting
// while an iteration it pushes lies beyond the LB's horizon.
func (w *Worker) pushing(cl *call, push func(*core, *call) (effects, error)) (int, error) {
	began := w.trace.Now()
	for {
		w.mu.Lock()
		t, err := push(w.c, cl)
		moved := w.moved
		pushed := w.c.iterationsPushed()
		w.mu.Unlock()
		// The scheduler's stall check hears it with the next heartbeat.
		w.node.SetProgress(pushed)
		if errors.Is(err, errHorizon) {
			select {
			case <-moved:
				cl.began = time.Now()
				continue
			case <-w.node.Done():
				return 0, fmt.Errorf("worker: push waiting for the LB's decision: %w", w.node.Err())
			}
		}
		if err != nil {
			return 0, err
		}
		w.do(t)
		w.traceRequest(trace.Call, t.req, began)
		return t.req.ts, nil
	}
}

// fptPull is FPTPull on bytes.
func (w *Worker) fptPull(keys []uint64, data []byte, byteLens []int, dtype frame.DType, cb Callback) (int, error) {
	began := w.trace.Now()
	w.mu.Lock()
	t, err := w.c.pull(keys, data, byteLens, dtype, newCall(cb, true))
	w.mu.Unlock()
	if err != nil {
		return 0, err
	}
	w.do(t)
	w.traceRequest(trace.Call, t.req, began)
	return t.req.ts, nil
}

// HandleFrame implements van.Handler.
func (w *Worker) HandleFrame(h *frame.Header, payload []byte, inPlace bool) {
	var err error
	switch h.Type {
	case frame.Push:
		err = w.base.Agg.HandlePush(h, payload, inPlace)
	case frame.Result:
		err = w.handleResult(h, payload)
	case frame.KVAck, frame.KVData, frame.KVError, frame.KVMoved, frame.KVRangeEnd:
		err = w.handleKV(h, payload)
	case frame.App:
		err = w.base.Customers.HandleFrame(h, payload, inPlace)
	case frame.Params:
		err = w.handleParams(h, payload, inPlace)
	default:
		err = fmt.Errorf("unexpected %s frame", h.Type)
	}
	if err != nil {
		w.node.Fail(fmt.Errorf("worker: from %s: %s: %w", node.ID(h.Sender), h, err))
	}
}

// PeerLost implements van.Handler: a result partition the peer's
// connection was reading in place is no longer written. The cluster node
// decides what the loss means.
func (w *Worker) PeerLost(peer node.ID, _ error) {
	w.update(func(c *core) effects { return c.abandon(peer) })
}

// Customers is the worker's customers (fpt.h's fpt_customer_add).
func (w *Worker) Customers() *customer.Set { return w.base.Customers }

// PayloadBuffer implements van.Sink: a result partition is read straight
// into the FPTPull's buffer (or the staging buffer), a pushed partition
// into the aggregator's buffer, a customer's message into its own, a
// joining worker's parameters into their key's receive buffer, not
// copied there.
func (w *Worker) PayloadBuffer(h *frame.Header) []byte {
	switch h.Type {
	case frame.Push:
		return w.base.Agg.PayloadBuffer(h)
	case frame.App:
		return w.base.Customers.PayloadBuffer(h)
	case frame.Params:
		return w.paramsBuffer(h)
	case frame.Result:
		w.trace.Begin(trace.Pull, h)
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.c.sink(h) // nil on a bad frame: HandleFrame reports it
	}
	return nil
}

func (w *Worker) handleResult(h *frame.Header, payload []byte) error {
	w.mu.Lock()
	l, inPlace, err := w.c.received(h)
	w.mu.Unlock()
	if errors.Is(err, errStale) {
		// Stale here, not to the group: a leader that had the whole sum
		// before a retry is sent it again for the members that did not,
		// whose group's host sums the retry re-pushed.
		return w.lagg.Load().publish(h, payload)
	}
	if err != nil {
		return err
	}
	own := l.span
	if inPlace {
		own = nil
	}
	if err := handOut(h, payload, own, w.lagg.Load().publish); err != nil {
		return err
	}
	w.update(func(c *core) effects { return c.land(l, h.Partition) })
	w.trace.End(trace.Pull, h)
	return nil
}

// handOut gives a partition's sum to this worker's group (publish: a
// leader's, copied for its members) and then to its own landing, own (nil
// where the sum was read there in place): the group first, so that the
// members copy theirs out while this worker copies its own, not after.
func handOut(h *frame.Header, sum, own []byte, publish func(*frame.Header, []byte) error) error {
	if err := publish(h, sum); err != nil {
		return err
	}
	copy(own, sum)
	return nil
}

// deliverLocal takes this worker's own copy of a sum it aggregated: the
// same checks and landing as a Result frame, without the network.
func (w *Worker) deliverLocal(h *frame.Header, data []byte) {
	w.mu.Lock()
	l, err := w.c.claim(h)
	w.mu.Unlock()
	if errors.Is(err, errStale) {
		// The group's all the same, as in handleResult.
		if err := w.lagg.Load().publish(h, data); err != nil {
			w.node.Fail(fmt.Errorf("worker: own sum %s: %w", h, err))
		}
		return
	}
	if err != nil {
		w.node.Fail(fmt.Errorf("worker: own sum %s: %w", h, err))
		return
	}
	w.trace.Begin(trace.Pull, h)
	// A group's leader that aggregated the partition hands the sum to
	// its group, as it does a sum it received.
	if err := handOut(h, data, l.span, w.lagg.Load().publish); err != nil {
		w.node.Fail(fmt.Errorf("worker: own sum %s: %w", h, err))
		return
	}
	w.update(func(c *core) effects { return c.land(l, h.Partition) })
	w.trace.End(trace.Pull, h)
}
