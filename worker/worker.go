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
// KV[T] is the typed face (like ps-lite's KVWorker<Val>) for float32 and
// float64; the Worker underneath works on bytes.
package worker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/fptps/fpt/aggregator"
	"github.com/fptps/fpt/cluster"
	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/lbagent"
	"github.com/fptps/fpt/metrics"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/van"
)

// Worker is a running worker node.
type Worker struct {
	node      *cluster.Member
	partBytes uint64
	metrics   *metrics.Node // nil: none
	agg       *aggregator.Aggregator
	agent     *lbagent.Agent // nil when the LB is off

	mu       sync.Mutex
	ready    bool // Start finished: the fields below it are set
	rank     int
	servers  []node.ID
	schedule *lb.Schedule
	// horizon is the last iteration the LB allows pushing: every decision
	// taking effect up to it is in the schedule. moved is closed (and
	// replaced) when it rises.
	horizon    uint64
	moved      chan struct{}
	modelBytes uint64 // declared bytes: what one iteration pushes
	perIter    int    // SetTensorsPerIteration; 0 = not announced
	tensors    map[uint64]*tensor
	results    map[resultKey]*result
	requests   map[int]*request
	failedReqs map[int]error
	sunk       map[partKey]landing // result partitions being read in place
	nextTS     int
}

type tensor struct {
	key      uint64
	dtype    frame.DType
	bytes    uint64
	priority int32
	pushed   uint64 // iterations pushed
	pulled   uint64 // iterations claimed by FPTPull
	// layout caches the partitions under one decision version.
	layoutVersion uint32
	layout        []lb.Partition
	spare         [][]byte // result buffers to reuse
}

type resultKey struct{ key, iter uint64 }

// result gathers the partitions of one key's sum for one iteration. Once
// an FPTPull waits for it, partitions land straight in the caller's buffer;
// those that arrive before are staged in buf (taken from the tensor's
// spares only when needed) and copied over when the pull comes.
type result struct {
	t        *tensor
	iter     uint64
	buf      []byte // staging; nil until a partition arrives with no waiter
	parts    []lb.Partition
	seen     []bool // partition claimed by an arriving frame
	staged   []bool // partition complete in buf, not yet in the waiter's buffer
	left     int
	complete bool
	waiter   *pullWait // the FPTPull waiting for it, if it was called first
}

type pullWait struct {
	req *request
	dst []byte
}

// request is an asynchronous call's completion: left counts what is still
// outstanding (frames written, results or replies received).
type request struct {
	ts       int
	left     int
	finished bool // settled: done closes once the callback returned
	done     chan struct{}
	err      error
	cb       func()
	// began and observe time the request for the latency metrics.
	began   time.Time
	observe func(time.Duration)
	// classic Pull and PushPull: where each key's reply goes.
	dst map[uint64]*kvDst
}

type kvDst struct {
	buf []byte
	got uint64
}

// Start joins the cluster as a worker and returns once every node has.
// With the LB on (config.LB), the worker reports its measured rates to
// the scheduler each iteration and follows its decisions.
func Start(ctx context.Context, n *cluster.Member) (*Worker, error) {
	w := &Worker{
		node:       n,
		partBytes:  n.Config().PartitionBytes,
		metrics:    n.Metrics(),
		tensors:    make(map[uint64]*tensor),
		results:    make(map[resultKey]*result),
		requests:   make(map[int]*request),
		failedReqs: make(map[int]error),
		sunk:       make(map[partKey]landing),
		horizon:    math.MaxUint64,
		moved:      make(chan struct{}),
	}
	w.agg = aggregator.New(n, w.deliverLocal)
	if n.Config().LB {
		// Until the scheduler's first directive, nothing may be pushed.
		w.horizon = 0
		w.agent = lbagent.New(n, w.follow)
	}
	if err := n.Start(ctx, w); err != nil {
		return nil, err
	}
	servers := n.Servers()
	sched, err := lb.NewSchedule(lb.Even(0, 0, servers))
	if err != nil {
		n.Close()
		return nil, fmt.Errorf("worker: %w", err)
	}
	w.mu.Lock()
	w.rank, w.servers, w.schedule, w.ready = n.Self().ID.Rank(), servers, sched, true
	w.mu.Unlock()
	if w.agent != nil {
		w.agent.Start()
	}
	return w, nil
}

// DecisionVersion is the version of the latest LB decision this worker has
// received (0: the initial even split over the servers).
func (w *Worker) DecisionVersion() uint32 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.schedule == nil {
		return 0
	}
	return w.schedule.Latest().Version
}

// follow applies the LB's directive: its decision joins the schedule and
// the horizon rises. Decisions must come in version order, none missing:
// a worker that lacked one would cut tensors differently from the others.
func (w *Worker) follow(d lb.Directive) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if d.Decision != nil {
		if w.schedule == nil {
			return fmt.Errorf("worker: decision v%d before the worker started", d.Decision.Version)
		}
		if latest := w.schedule.Latest(); d.Decision.Version != latest.Version+1 {
			return fmt.Errorf("worker: decision v%d follows v%d: one is missing", d.Decision.Version, latest.Version)
		}
		// With the LB off the horizon is unbounded and only tests force
		// decisions: there is no grant to check against.
		if d.Decision.Iteration <= w.horizon && w.horizon != math.MaxUint64 {
			return fmt.Errorf("worker: decision v%d takes effect at iteration %d, within the horizon already granted (%d)", d.Decision.Version, d.Decision.Iteration, w.horizon)
		}
		if err := w.schedule.Add(*d.Decision); err != nil {
			return fmt.Errorf("worker: %w", err)
		}
	}
	if d.Horizon > w.horizon {
		w.horizon = d.Horizon
		close(w.moved)
		w.moved = make(chan struct{})
	}
	return nil
}

// Rank is this worker's rank, 0..NumWorkers-1.
func (w *Worker) Rank() int { return w.node.Self().ID.Rank() }

// NumWorkers is the number of workers in the cluster.
func (w *Worker) NumWorkers() int { return w.node.Config().NumWorkers }

// NumServers is the number of servers in the cluster.
func (w *Worker) NumServers() int { return w.node.Config().NumServers }

// Node is the worker's cluster membership.
func (w *Worker) Node() *cluster.Member { return w.node }

// Barrier waits for every worker (group node.WorkerGroup) or any other group.
func (w *Worker) Barrier(ctx context.Context, g node.Group) error { return w.node.Barrier(ctx, g) }

// finalizeWait bounds how long Finalize waits for outstanding requests: an
// FPTPull of an iteration the other workers never push would otherwise
// hold this worker, and with it the final barrier, forever.
const finalizeWait = 30 * time.Second

// Finalize waits for the worker's outstanding requests, passes the final
// barrier and leaves the cluster.
func (w *Worker) Finalize(ctx context.Context) error {
	if w.agent != nil {
		defer w.agent.Close()
	}
	w.mu.Lock()
	pending := make([]*request, 0, len(w.requests))
	for _, r := range w.requests {
		pending = append(pending, r)
	}
	w.mu.Unlock()
	deadline := time.NewTimer(finalizeWait)
	defer deadline.Stop()
	for _, r := range pending {
		select {
		case <-r.done:
		case <-w.node.Done():
		case <-deadline.C:
			err := fmt.Errorf("worker: Finalize: request %d still outstanding after %s (an FPTPull of an iteration the other workers did not push?)", r.ts, finalizeWait)
			w.node.Fail(err)
			w.node.Close()
			return err
		}
	}
	if err := w.node.Err(); err != nil {
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
	if n < 1 {
		return fmt.Errorf("worker: SetTensorsPerIteration(%d): must be at least 1", n)
	}
	if len(w.tensors) > n {
		return fmt.Errorf("worker: SetTensorsPerIteration(%d): %d tensors are already declared", n, len(w.tensors))
	}
	w.perIter = n
	return nil
}

// declare registers a tensor of the given size in bytes.
func (w *Worker) declare(key uint64, dtype frame.DType, bytes uint64, priority int32) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if t, ok := w.tensors[key]; ok {
		if t.dtype == dtype && t.bytes == bytes {
			t.priority = priority
			return nil
		}
		return fmt.Errorf("worker: key %d is already declared as %d bytes of %s", key, t.bytes, t.dtype)
	}
	if w.perIter > 0 && len(w.tensors) >= w.perIter {
		return fmt.Errorf("worker: declaring key %d would exceed the %d tensors per iteration announced", key, w.perIter)
	}
	w.tensors[key] = &tensor{key: key, dtype: dtype, bytes: bytes, priority: priority}
	w.modelBytes += bytes
	return nil
}

// layoutFor returns t's partitions for an iteration under the decision in
// force then. Caller holds w.mu.
func (w *Worker) layoutFor(t *tensor, iter uint64) (lb.Decision, []lb.Partition) {
	d := w.schedule.At(iter)
	if t.layout == nil || t.layoutVersion != d.Version {
		t.layout = d.Layout(t.key, t.bytes, t.dtype.Size(), w.partBytes)
		t.layoutVersion = d.Version
	}
	return d, t.layout
}

// split checks keys, data and byte lengths against the declarations and
// returns each key's slice of data. Caller holds w.mu.
func (w *Worker) split(keys []uint64, data []byte, byteLens []int, dtype frame.DType) ([]*tensor, [][]byte, error) {
	if !w.ready {
		return nil, nil, errors.New("worker: not started")
	}
	if len(byteLens) != len(keys) {
		return nil, nil, fmt.Errorf("worker: %d lengths for %d keys: %w", len(byteLens), len(keys), ErrSizeMismatch)
	}
	ts := make([]*tensor, len(keys))
	parts := make([][]byte, len(keys))
	off := 0
	for i, k := range keys {
		t := w.tensors[k]
		if t == nil {
			return nil, nil, fmt.Errorf("worker: key %d: %w", k, ErrNotDeclared)
		}
		if t.dtype != dtype {
			return nil, nil, fmt.Errorf("worker: key %d is declared as %s, not %s (one call carries one dtype)", k, t.dtype, dtype)
		}
		if byteLens[i] < 0 || uint64(byteLens[i]) != t.bytes {
			return nil, nil, fmt.Errorf("worker: key %d is declared as %d bytes, the call gives %d: %w", k, t.bytes, byteLens[i], ErrSizeMismatch)
		}
		if slices.Contains(keys[:i], k) {
			return nil, nil, fmt.Errorf("worker: key %d appears twice in one call", k)
		}
		if off+byteLens[i] > len(data) {
			break // reported below
		}
		ts[i], parts[i] = t, data[off:off+byteLens[i]]
		off += byteLens[i]
	}
	if total := sum(byteLens); total != len(data) {
		return nil, nil, fmt.Errorf("worker: lengths add up to %d bytes, the values have %d: %w", total, len(data), ErrSizeMismatch)
	}
	return ts, parts, nil
}

func sum(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}

// newRequest registers a request; observe receives its latency if it
// succeeds. Caller holds w.mu.
func (w *Worker) newRequest(cb func(), observe func(time.Duration)) *request {
	w.nextTS++
	r := &request{ts: w.nextTS, done: make(chan struct{}), cb: cb, began: time.Now(), observe: observe}
	w.requests[r.ts] = r
	return r
}

// settle records progress on r (n fewer outstanding items, or a failure)
// and returns a function to run after unlocking when r finished. Caller
// holds w.mu.
func (w *Worker) settle(r *request, n int, err error) (after func()) {
	if r.finished {
		return nil
	}
	r.left -= n
	if err != nil {
		r.err = err
	}
	if r.left > 0 && r.err == nil {
		return nil
	}
	r.finished = true
	if r.err == nil {
		r.observe(time.Since(r.began))
	}
	return func() { w.finish(r) }
}

// finish runs a successful request's callback, then releases its waiters:
// as in ps-lite, Wait returns after the callback. The callback runs on a
// goroutine of its own, since it may call back into the worker (push again)
// and must not hold up the van's goroutine that completed the request.
func (w *Worker) finish(r *request) {
	if r.err == nil && r.cb != nil {
		go func() {
			r.cb()
			w.release(r)
		}()
		return
	}
	w.release(r)
}

func (w *Worker) release(r *request) {
	w.mu.Lock()
	delete(w.requests, r.ts)
	if r.err != nil {
		w.failedReqs[r.ts] = r.err
	}
	w.mu.Unlock()
	close(r.done)
}

func (w *Worker) settleUnlocked(r *request, n int, err error) {
	w.mu.Lock()
	after := w.settle(r, n, err)
	w.mu.Unlock()
	if after != nil {
		after()
	}
}

// start sets how many items r waits for, releases w.mu (which the caller
// holds), adds this worker's own contributions to the partitions it
// aggregates, and queues msgs. A request waiting for nothing completes at
// once; none completes before its local contributions have been copied,
// since the caller may reuse its buffer then.
func (w *Worker) start(r *request, left int, msgs []van.Message, locals []van.Message) int {
	r.left = left + 1 // and one for this call, settled once all is handed over
	w.mu.Unlock()
	var err error
	for i := range locals {
		if err = w.agg.AddLocal(&locals[i].Header, locals[i].Payload); err != nil {
			err = fmt.Errorf("worker: own contribution to %s: %w", &locals[i].Header, err)
			break
		}
	}
	w.send(r, msgs)
	w.settleUnlocked(r, 1, err)
	return r.ts
}

// Wait blocks until the request with timestamp ts has completed, and
// returns its error or the node's failure.
func (w *Worker) Wait(ts int) error {
	w.mu.Lock()
	r := w.requests[ts]
	if r == nil {
		err, failed := w.failedReqs[ts]
		delete(w.failedReqs, ts)
		known := ts > 0 && ts <= w.nextTS
		w.mu.Unlock()
		switch {
		case failed:
			return err
		case !known:
			return fmt.Errorf("worker: Wait(%d): no such request", ts)
		}
		return nil
	}
	w.mu.Unlock()
	select {
	case <-r.done:
		w.mu.Lock()
		err := r.err
		delete(w.failedReqs, ts)
		w.mu.Unlock()
		return err
	case <-w.node.Done():
		return w.node.Err()
	}
}

// send queues messages (blocking on a full pool) and settles r for any that
// could not be queued.
func (w *Worker) send(r *request, msgs []van.Message) {
	for i := range msgs {
		m := &msgs[i]
		if err := w.node.Van().Send(m); err != nil {
			w.settleUnlocked(r, len(msgs)-i, fmt.Errorf("worker: send %s: %w", &m.Header, err))
			return
		}
	}
}

// fptPush is FPTPush on bytes: byteLens[i] bytes of data belong to keys[i].
// It waits while an iteration it pushes lies beyond the LB's horizon: the
// decision for it may still be on its way.
func (w *Worker) fptPush(keys []uint64, data []byte, byteLens []int, dtype frame.DType, priority int32, cb func()) (int, error) {
	w.mu.Lock()
	ts, parts, err := w.split(keys, data, byteLens, dtype)
	for err == nil {
		beyond := slices.ContainsFunc(ts, func(t *tensor) bool { return t.pushed > w.horizon })
		if !beyond {
			break
		}
		moved := w.moved
		w.mu.Unlock()
		select {
		case <-moved:
		case <-w.node.Done():
			return 0, fmt.Errorf("worker: push waiting for the LB's decision: %w", w.node.Err())
		}
		w.mu.Lock()
		ts, parts, err = w.split(keys, data, byteLens, dtype)
	}
	if err != nil {
		w.mu.Unlock()
		return 0, err
	}
	req := w.newRequest(cb, w.metrics.ObservePush)
	self := w.node.Self().ID
	done := func(err error) {
		if err != nil {
			err = fmt.Errorf("worker: push: %w", err)
		}
		w.settleUnlocked(req, 1, err)
	}
	// One slice holds the request's frames: they live until their Done.
	// locals are the partitions this worker aggregates itself.
	var msgs, locals []van.Message
	began := uint64(0)
	for i, t := range ts {
		iter := t.pushed
		t.pushed++
		began = max(began, iter)
		var flags uint8
		if iter == 0 {
			// The init round: only worker 0's value is sent and kept.
			if w.rank != 0 {
				continue
			}
			flags = frame.FlagInit
		}
		d, layout := w.layoutFor(t, iter)
		for _, p := range layout {
			m := van.Message{
				Header: frame.Header{
					Type: frame.Push, DType: t.dtype, Flags: flags,
					Sender: uint32(self), Recipient: uint32(p.Aggregator),
					Key: t.key, Partition: p.Index, Iteration: iter,
					Offset: p.Offset, Total: t.bytes, Length: p.Length, Priority: priority, Aux: d.Version,
				},
				Payload: parts[i][p.Offset : p.Offset+p.Length],
				Done:    done,
			}
			if p.Aggregator == self {
				locals = append(locals, m)
			} else {
				msgs = append(msgs, m)
			}
		}
	}
	model := w.modelBytes
	id := w.start(req, len(msgs), msgs, locals)
	if w.agent != nil {
		w.agent.IterationBegan(began, model)
	}
	return id, nil
}

// fptPull is FPTPull on bytes.
func (w *Worker) fptPull(keys []uint64, data []byte, byteLens []int, dtype frame.DType, cb func()) (int, error) {
	w.mu.Lock()
	ts, parts, err := w.split(keys, data, byteLens, dtype)
	if err == nil {
		for _, t := range ts {
			if t.pulled >= t.pushed {
				err = fmt.Errorf("worker: FPTPull of key %d for iteration %d before its FPTPush: %w", t.key, t.pulled, ErrPullBeforePush)
				break
			}
		}
	}
	if err != nil {
		w.mu.Unlock()
		return 0, err
	}
	req := w.newRequest(cb, w.metrics.ObservePull)
	type ready struct {
		r   *result
		dst []byte
	}
	var now []ready
	for i, t := range ts {
		iter := t.pulled
		t.pulled++
		r := w.resultFor(t, iter)
		if r.complete {
			now = append(now, ready{r, parts[i]})
		} else {
			r.wait(&pullWait{req: req, dst: parts[i]})
		}
	}
	w.start(req, len(ts), nil, nil)
	for _, c := range now {
		w.deliver(c.r, req, c.dst, true)
	}
	return req.ts, nil
}

// resultFor finds or creates the result of t's iteration. Caller holds w.mu.
func (w *Worker) resultFor(t *tensor, iter uint64) *result {
	k := resultKey{t.key, iter}
	if r := w.results[k]; r != nil {
		return r
	}
	_, layout := w.layoutFor(t, iter)
	r := &result{t: t, iter: iter, parts: layout, seen: make([]bool, len(layout)),
		staged: make([]bool, len(layout)), left: len(layout)}
	r.complete = r.left == 0
	w.results[k] = r
	return r
}

// stage returns r's staging buffer, taking a spare if it has none. Caller
// holds w.mu.
func (r *result) stage() []byte {
	if r.buf == nil {
		if n := len(r.t.spare); n > 0 {
			r.buf, r.t.spare = r.t.spare[n-1], r.t.spare[:n-1]
		} else {
			r.buf = make([]byte, r.t.bytes)
		}
	}
	return r.buf
}

// wait makes an FPTPull's buffer the destination of r's partitions,
// copying over those already staged. Caller holds w.mu.
func (r *result) wait(pw *pullWait) {
	for i, ok := range r.staged {
		if ok {
			p := r.parts[i]
			copy(pw.dst[p.Offset:p.Offset+p.Length], r.buf[p.Offset:p.Offset+p.Length])
			r.staged[i] = false
		}
	}
	r.waiter = pw
}

// deliver completes an FPTPull's share of a complete result, copying it
// from staging when it was complete before the pull came, and recycles it.
func (w *Worker) deliver(r *result, req *request, dst []byte, fromStaging bool) {
	if fromStaging {
		copy(dst, r.buf)
	}
	w.mu.Lock()
	delete(w.results, resultKey{r.t.key, r.iter})
	if r.buf != nil && len(r.t.spare) < 2 {
		r.t.spare = append(r.t.spare, r.buf)
	}
	after := w.settle(req, 1, nil)
	w.mu.Unlock()
	if after != nil {
		after()
	}
}

// HandleFrame implements van.Handler.
func (w *Worker) HandleFrame(h *frame.Header, payload []byte) {
	var err error
	switch h.Type {
	case frame.Push:
		err = w.agg.HandlePush(h, payload)
	case frame.Result:
		err = w.handleResult(h, payload)
	case frame.KVAck, frame.KVData, frame.KVError:
		err = w.handleKV(h, payload)
	default:
		err = fmt.Errorf("unexpected %s frame", h.Type)
	}
	if err != nil {
		w.node.Fail(fmt.Errorf("worker: from %s: %s: %w", node.ID(h.Sender), h, err))
	}
}

// PeerLost implements van.Handler; the cluster node handles it.
func (w *Worker) PeerLost(node.ID, error) {}

func (w *Worker) handleResult(h *frame.Header, payload []byte) error {
	k := partKey{h.Key, h.Iteration, h.Partition}
	w.mu.Lock()
	l, sunk := w.sunk[k]
	if sunk {
		delete(w.sunk, k) // PayloadBuffer claimed it; the bytes are in place
	} else {
		var err error
		if l, err = w.claim(h); err != nil {
			w.mu.Unlock()
			return err
		}
	}
	w.mu.Unlock()
	if !sunk {
		copy(l.span, payload)
	}
	w.land(l, h.Partition)
	return nil
}

// PayloadBuffer implements van.Sink: a result partition is read straight
// into the FPTPull's buffer (or the staging buffer), not copied there.
func (w *Worker) PayloadBuffer(h *frame.Header) []byte {
	if h.Type == frame.Push {
		return w.agg.PayloadBuffer(h)
	}
	if h.Type != frame.Result {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	l, err := w.claim(h)
	if err != nil {
		return nil // HandleFrame meets the same error and reports it
	}
	w.sunk[partKey{h.Key, h.Iteration, h.Partition}] = l
	return l.span
}

// deliverLocal takes this worker's own copy of a sum it aggregated: the
// same checks and landing as a Result frame, without the network.
func (w *Worker) deliverLocal(h *frame.Header, data []byte) {
	w.mu.Lock()
	l, err := w.claim(h)
	w.mu.Unlock()
	if err != nil {
		w.node.Fail(fmt.Errorf("worker: own sum %s: %w", h, err))
		return
	}
	copy(l.span, data)
	w.land(l, h.Partition)
}

// partKey names one partition of one key's iteration.
type partKey struct {
	key, iter uint64
	part      uint32
}

// landing is where a claimed result partition's bytes go.
type landing struct {
	r       *result
	staging bool   // span is in r's staging buffer, not the waiter's
	span    []byte // exactly the partition's bytes
}

// claim validates a result frame and reserves its partition. Caller holds
// w.mu.
func (w *Worker) claim(h *frame.Header) (landing, error) {
	if !w.ready {
		return landing{}, errors.New("result before the worker started")
	}
	t := w.tensors[h.Key]
	if t == nil {
		return landing{}, errors.New("result for an undeclared key (declare every key on every worker before the first push)")
	}
	r := w.results[resultKey{h.Key, h.Iteration}]
	if r == nil {
		if h.Iteration < t.pulled || h.Iteration > t.pushed {
			return landing{}, fmt.Errorf("result for iteration %d, but this worker pushed %d and pulled %d", h.Iteration, t.pushed, t.pulled)
		}
		r = w.resultFor(t, h.Iteration)
	}
	if err := r.check(h); err != nil {
		return landing{}, err
	}
	r.seen[h.Partition] = true
	l := landing{r: r, staging: r.waiter == nil}
	var into []byte
	if l.staging {
		into = r.stage()
	} else {
		into = r.waiter.dst
	}
	l.span = into[h.Offset : h.Offset+h.Length]
	return l, nil
}

// land accounts for a partition whose bytes are in place, and completes
// the result (and the FPTPull waiting for it) with its last partition.
func (w *Worker) land(l landing, part uint32) {
	r := l.r
	w.mu.Lock()
	if l.staging {
		if r.waiter != nil {
			// The pull came while this partition was being staged.
			p := r.parts[part]
			copy(r.waiter.dst[p.Offset:p.Offset+p.Length], l.span)
		} else {
			r.staged[part] = true
		}
	}
	r.left--
	var wait *pullWait
	if r.left == 0 {
		r.complete = true
		wait, r.waiter = r.waiter, nil
	}
	w.mu.Unlock()
	if wait != nil {
		w.deliver(r, wait.req, wait.dst, false)
	}
}

// check verifies that a result frame is the partition the layout expects
// from the aggregator that owns it: a misrouted or stale partition is a
// protocol error, never a silently wrong value.
func (r *result) check(h *frame.Header) error {
	if int(h.Partition) >= len(r.parts) {
		return fmt.Errorf("partition %d of %d", h.Partition, len(r.parts))
	}
	p := r.parts[h.Partition]
	switch {
	case h.DType != r.t.dtype || h.Total != r.t.bytes:
		return fmt.Errorf("key is %d bytes of %s", r.t.bytes, r.t.dtype)
	case p.Offset != h.Offset || p.Length != h.Length:
		return fmt.Errorf("partition %d is [%d,+%d)", p.Index, p.Offset, p.Length)
	case p.Aggregator != node.ID(h.Sender):
		return fmt.Errorf("partition %d belongs to %s", p.Index, node.ID(p.Aggregator))
	case r.seen[h.Partition]:
		return fmt.Errorf("partition %d received twice", h.Partition)
	}
	return nil
}

// ServerFor returns the server owning key under ps-lite's range slicing:
// the key space is cut into NumServers equal ranges.
func ServerFor(key uint64, servers int) int {
	span := math.MaxUint64 / uint64(servers)
	return int(min(key/span, uint64(servers-1)))
}

// kvRequest sends a classic request: one frame per partition-sized chunk of
// every key (a pull sends one empty frame per key).
func (w *Worker) kvRequest(typ frame.Type, keys []uint64, data, out []byte, byteLens []int, dtype frame.DType, cb func()) (int, error) {
	if dtype.Size() == 0 {
		return 0, fmt.Errorf("worker: unknown dtype %d", dtype)
	}
	for i := 1; i < len(keys); i++ {
		if keys[i] <= keys[i-1] {
			return 0, fmt.Errorf("worker: keys must be sorted and unique, as in ps-lite (key %d after %d)", keys[i], keys[i-1])
		}
	}
	total := 0
	for i, n := range byteLens {
		if n < 0 || n%dtype.Size() != 0 {
			return 0, fmt.Errorf("worker: key %d: %d bytes is not a whole number of %s", keys[i], n, dtype)
		}
		total += n
	}
	if total != len(data) || (out != nil && len(out) != len(data)) {
		return 0, fmt.Errorf("worker: lengths add up to %d bytes, the values have %d", total, len(data))
	}
	w.mu.Lock()
	if !w.ready {
		w.mu.Unlock()
		return 0, errors.New("worker: not started")
	}
	observe := w.metrics.ObservePull // a reply carries values back
	if typ == frame.KVPush {
		observe = w.metrics.ObservePush
	}
	req := w.newRequest(cb, observe)
	self := uint32(w.node.Self().ID)
	var msgs []van.Message
	if out != nil {
		req.dst = make(map[uint64]*kvDst, len(keys))
	}
	off := 0
	for i, k := range keys {
		n := uint64(byteLens[i])
		if out != nil {
			req.dst[k] = &kvDst{buf: out[off : off+int(n)]}
		}
		base := frame.Header{
			Type: typ, DType: dtype, Sender: self, Recipient: uint32(w.servers[ServerFor(k, len(w.servers))]),
			Key: k, Total: n, Aux: uint32(req.ts),
		}
		val := data[off : off+int(n)]
		off += int(n)
		if typ == frame.KVPull {
			msgs = append(msgs, van.Message{Header: base})
			continue
		}
		for part, c := range frame.Chunks(n, w.partBytes, dtype.Size()) {
			m := van.Message{Header: base, Payload: val[c[0]:c[1]]}
			m.Header.Offset, m.Header.Partition = c[0], part
			msgs = append(msgs, m)
		}
	}
	left := len(msgs) // one ack per frame
	if out != nil {
		left = len(keys) // one per key's complete reply
	}
	return w.start(req, left, msgs, nil), nil
}

func (w *Worker) handleKV(h *frame.Header, payload []byte) error {
	w.mu.Lock()
	req := w.requests[int(h.Aux)]
	if req == nil {
		w.mu.Unlock()
		return fmt.Errorf("reply to request %d, which is not outstanding", h.Aux)
	}
	switch h.Type {
	case frame.KVError:
		after := w.settle(req, 0, fmt.Errorf("worker: %s refused key %d: %s", node.ID(h.Sender), h.Key, payload))
		w.mu.Unlock()
		if after != nil {
			after()
		}
		return nil
	case frame.KVAck:
		if req.dst != nil {
			w.mu.Unlock()
			return errors.New("ack for a request that expects data")
		}
		after := w.settle(req, 1, nil)
		w.mu.Unlock()
		if after != nil {
			after()
		}
		return nil
	}
	var d *kvDst
	if req.dst != nil {
		d = req.dst[h.Key]
	}
	if d == nil || uint64(len(d.buf)) != h.Total {
		w.mu.Unlock()
		return fmt.Errorf("data for key %d that request %d does not expect at that size", h.Key, h.Aux)
	}
	w.mu.Unlock()
	copy(d.buf[h.Offset:h.Offset+h.Length], payload)
	w.mu.Lock()
	d.got += h.Length
	var after func()
	if d.got == h.Total {
		after = w.settle(req, 1, nil)
	} else if d.got > h.Total {
		after = w.settle(req, 0, fmt.Errorf("worker: key %d: more data than its %d bytes", h.Key, h.Total))
	}
	w.mu.Unlock()
	if after != nil {
		after()
	}
	return nil
}
