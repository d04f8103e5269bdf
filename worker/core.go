package worker

import (
	"errors"
	"fmt"
	"iter"
	"math"
	"slices"
	"time"

	"github.com/fptps/fpt/classic"
	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/node"
)

// core is the worker's state and logic without I/O: declared tensors,
// the LB's schedule and horizon, requests, and the results being
// assembled. It holds no lock, opens no socket, starts no goroutine and
// reads no clock. Each method takes one input (a call, a received frame, a
// completed send, a directive, a failure) and returns effects: what the
// shell (Worker) must do once it has released its lock. Like lb.Balancer
// beside scheduler/balance.go, it is tested with tables, without a cluster.
//
// Its concerns lie in files of their own: core_push.go (pushes cut into
// frames), core_result.go (pulls, and the results claimed and landed),
// core_retry.go (held pushes and retries), core_sums.go (the sums in, and
// re-summing), core_init.go (the kept Init values), join_core.go and
// classic_core.go.
type core struct {
	partBytes uint64

	started  bool // start ran: the fields below it are set
	self     node.ID
	rank     int
	schedule *lb.Schedule
	// horizon is the last iteration the LB allows pushing: every decision
	// taking effect up to it is in the schedule.
	horizon    uint64
	modelBytes uint64 // declared bytes: what one iteration pushes
	perIter    int    // SetTensorsPerIteration; 0 = not announced
	tensors    map[uint64]*tensor
	// pushes counts the tensors' iterations pushed, sums their sums in
	// (tensor.sumsIn), each over the tensors tallied (see tally): the
	// fewest of either is known without a pass over every tensor, which
	// a push or a result may not make.
	pushes, sums least
	// scanned counts the tensors visited by passes over all of them
	// (allTensors): a push's and a result's path make none.
	scanned uint64
	// calls numbers the calls split checked; a tensor's inCall is the
	// latest that named it, so a key named twice is found in one pass.
	// compared counts the keys that check visited.
	calls          uint64
	compared       uint64
	results        map[resultKey]*result
	readingInPlace map[inPlaceKey]landing // result partitions being read in place

	requests map[int]*request // not yet released
	// errs holds released requests' errors until a Wait collects them.
	errs   map[int]error
	lastTS int
	// err is the node's failure: every request settled with it, new ones
	// are refused.
	err error

	// retryMode is FPT_ON_SERVER_LOSS=retry: a lost server's incomplete
	// iterations are pushed again, so a push completes only once every
	// worker has its iteration's sum (done passes it); until then it is
	// held, and its buffer is still the worker's to send again.
	retryMode bool
	held      []*heldPush
	// heldAt indexes the held pushes' values by key and iteration.
	heldAt map[resultKey][]heldValues
	// sumsAgainOnWorkerLoss is FPT_ON_WORKER_LOSS=continue or wait: a lost worker's retry sums
	// the incomplete iterations again over the workers left, so their
	// sums change. A pull then completes only once every worker has its
	// iteration's sum (heldPulls), so that no program saw the old one.
	sumsAgainOnWorkerLoss bool
	heldPulls             []*result
	// done is one past the last iteration every worker has the sum of
	// (the LB's Directive.Done).
	done uint64
	// retried lists the retry decisions applied: results of iterations
	// they re-cut may arrive twice, or under the version they replaced.
	retried []retryMark
	// sumsIn is one past the last iteration whose every sum is here, as
	// reported to the LB (retry mode reports completions, not pushes).
	sumsIn uint64
	// early holds the directives with a decision or a Done that came
	// before start.
	early []lb.Directive
	// classicUsed: a classic request was made. A lost server's classic
	// keys are lost with it, so the worker cannot go on without one.
	classicUsed bool
	// layout is the newest classic key layout the worker knows: classic
	// requests go to its servers.
	layout classic.Layout
	// classicSent counts the classic requests made to each server, for
	// the KVDrained a server that leaves the layout hears.
	classicSent map[node.ID]uint64
	// parkedRanges are range pulls a server answered under a layout the
	// worker does not know yet: they ask again once it does.
	parkedRanges []*request
	// join is set on a worker that joined a running job.
	join *joinState
	// dutyFrom: the iterations before it were looked at for a join whose
	// parameters this worker hands over (duty).
	dutyFrom uint64
	// deferred are pulls into the buffer of a push still held: their
	// sums are staged and copied in once every worker has them, since a
	// retry would push the buffer again.
	deferred []deferredPull
	// gated are in-place FPTPushPulls' pulls whose keys' frames are not
	// all written yet, by key and iteration.
	gated map[resultKey]*gatedPull
	// restaged counts the result bytes copied from staging into a pull's
	// buffer: partitions that arrived before their FPTPull, each read
	// once into staging and once more into the caller's buffer.
	restaged uint64
}

// newCore returns a worker core. With the LB on nothing may be pushed
// until the scheduler's first directive raises the horizon.
func newCore(partBytes uint64, lbOn bool) *core {
	c := &core{
		partBytes:      partBytes,
		horizon:        math.MaxUint64,
		tensors:        make(map[uint64]*tensor),
		results:        make(map[resultKey]*result),
		readingInPlace: make(map[inPlaceKey]landing),
		heldAt:         make(map[resultKey][]heldValues),
		gated:          make(map[resultKey]*gatedPull),
		requests:       make(map[int]*request),
		errs:           make(map[int]error),
	}
	if lbOn {
		c.horizon = 0
	}
	return c
}

// start records what the worker learns once the cluster has started: its
// id, the servers, over which the initial decision splits evenly, and the
// workers whose pushes the sums add up.
func (c *core) start(self node.ID, servers, workers []node.ID) error {
	initial := lb.Even(0, 0, servers)
	initial.Workers = workers
	sched, err := lb.NewSchedule(initial)
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	c.self, c.rank, c.schedule, c.started = self, self.Rank(), sched, true
	c.newLayout(classic.Initial(servers)) // unless the shell gave a newer one; nothing is parked yet
	early := c.early
	c.early = nil
	for _, d := range early {
		// Nothing is pushed or pulled yet: there is nothing to do but
		// follow.
		if _, _, err := c.follow(d); err != nil {
			return err
		}
	}
	return nil
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
	// sumsIn counts the leading iterations whose sum is complete here;
	// sumsAhead holds later ones that completed first. Kept under retry
	// only (sumIn).
	sumsIn    uint64
	sumsAhead map[uint64]bool
	// once: set by Broadcast, the key has its init round only, and no
	// iteration after it waits for the key (a model's buffers, fpt.torch's
	// broadcast keys).
	once bool
	// initial is the key's value as Init left it, kept until its next
	// push: a pull with no push outstanding returns it (MXNet broadcasts a
	// parameter by init, then pull, one key at a time). It lies in kept.
	initial []byte
	kept    *keptInit
	inCall  uint64 // the latest split call that named the key (core.calls)
}

// sumsTallied reports whether t's sums count in core.sums: a key pushed
// (a joining worker's start counts as pushed) and not broadcast. A sum
// that lands before the key's push (worker 0's init values reach the
// other workers before they call Init) waits for the push to count, so
// that the report never claims an iteration while another key's sum of
// it is still to come.
func (t *tensor) sumsTallied() bool { return !t.once && t.pushed > 0 }

// untally takes t out of the core's counts of pushes and sums before its
// counters or its once flag change; tally puts it back after. Broadcast
// keys count in neither.
func (c *core) untally(t *tensor) {
	if t.once {
		return
	}
	c.pushes.remove(t.pushed)
	if t.sumsTallied() {
		c.sums.remove(t.sumsIn)
	}
}

// tally counts t in the core's counts of pushes and sums (see untally).
func (c *core) tally(t *tensor) {
	if t.once {
		return
	}
	c.pushes.add(t.pushed)
	if t.sumsTallied() {
		c.sums.add(t.sumsIn)
	}
}

// allTensors yields every declared tensor, counting the visits (scanned).
func (c *core) allTensors() iter.Seq[*tensor] {
	return func(yield func(*tensor) bool) {
		for _, t := range c.tensors {
			c.scanned++
			if !yield(t) {
				return
			}
		}
	}
}

// request is an asynchronous call: left counts what is still outstanding
// (frames written, results or replies received, and the call's own
// hand-over of its frames).
type request struct {
	ts       int
	left     int
	finished bool // settled: the shell completes it, then releases it
	err      error
	call     *call // the shell's half: callback, done channel, timing
	// classic Pull and PushPull: where each key's reply goes.
	dst map[uint64]*kvDst
	// frames are a classic request's, in key order: one a server
	// redirects (KVMoved) is sent again as it was.
	frames []frame.Message
	rng    *rangePull
	// key and iter are an FPTPush's or FPTPull's first key and its
	// iteration (the timeline's), with fpt set; classic requests have none.
	key, iter, bytes uint64
	fpt              bool
}

// call is the shell's half of a request, which the core only carries.
type call struct {
	cb   Callback
	done chan struct{} // closed once the request settled and cb returned
	pull bool          // for the latency metric: values come back
	// pushPull: an FPTPushPull, which counts as a push and a pull.
	pushPull bool
	began    time.Time
	// notify are the Notify waiters, run by the goroutine that releases
	// the request (under the worker's lock to add, run after it).
	notify []func(error)
}

// effects is what the shell does after a core call, once unlocked, in this
// order: copy the initial values, add the local contributions to the
// aggregator, queue sends, report the hand-over of req, copy the
// deliveries, complete the finished requests, and tell the LB agent an
// iteration began.
type effects struct {
	initials []initialCopy   // copies to make before req is handed over
	unmap    [][]byte        // kept Init values nothing uses any more
	req      *request        // the call's request, to hand over; nil for other inputs
	locals   []frame.Message // this worker's own contributions to partitions it aggregates
	sends    []frame.Message // frames to queue
	counted  bool            // each send's Done settles one of req's outstanding items
	copies   []delivery
	finished []*request
	began    *iterationBegan
	// resends are a retry's frames, pushed again from held pushes.
	resends []resend
	// duty: hand the parameters to joining workers, before sends.
	duty *paramsDuty
	// notices are frames no request waits for (KVDrained).
	notices []frame.Message
}

// iterationBegan is what the LB agent learns from a push (or, under
// retry, a completed iteration), under the latest retry version.
type iterationBegan struct {
	iter, modelBytes uint64
	version          uint32
}

func (t *effects) merge(o effects) {
	t.finished = append(t.finished, o.finished...)
	t.copies = append(t.copies, o.copies...)
	t.resends = append(t.resends, o.resends...)
	t.notices = append(t.notices, o.notices...)
	if o.began != nil {
		t.began = o.began
	}
}

// Errors the byte-level calls wrap, so that a caller can tell a bad key or
// size from other failures (the C library maps them to its status codes).
var (
	ErrNotDeclared    = errors.New("key is not declared")
	ErrSizeMismatch   = errors.New("size does not match the declaration")
	ErrPullBeforePush = errors.New("pull of an iteration this worker has not pushed")
)

// Callback learns that a request completed: err is nil once a push's
// values may be reused (sent; with FPT_ON_SERVER_LOSS=retry or
// FPT_ON_WORKER_LOSS=continue, once every worker has their iteration's
// sums) or a pull's buffer holds the result (into its own push's buffer
// under either: with that push; under continue, every pull once every
// worker has the sums, which a lost worker's retry changes), else why the
// request failed (a refused key, the node's failure). It runs exactly
// once per request, on a goroutine of its own (it may call the worker),
// and Wait for the request returns after it returned. A call that returns
// an error made no request and never runs its callback.
type Callback func(err error)

// ErrNoRequest is Wait's error for a timestamp no call returned.
var ErrNoRequest = errors.New("no such request")

// errHorizon is push's answer while an iteration it pushes lies beyond the
// LB's horizon: the shell waits for the horizon to rise and calls again.
var errHorizon = errors.New("beyond the LB's horizon")

// decisionVersion is the version of the latest decision (0: the initial
// even split).
func (c *core) decisionVersion() uint32 {
	if c.schedule == nil {
		return 0
	}
	return c.schedule.Latest().Version
}

// workersAt is the workers whose pushes the sums of iteration iter add
// up (nil before start).
func (c *core) workersAt(iter uint64) []node.ID {
	if c.schedule == nil {
		return nil
	}
	return slices.Clone(c.schedule.WorkersAt(iter))
}

// follow applies the LB's directive: its decision joins the schedule and
// the horizon rises (moved reports that). Decisions must come in version
// order, none missing: a worker that lacked one would cut tensors
// differently from the others.
func (c *core) follow(d lb.Directive) (out effects, moved bool, err error) {
	if !c.started && (d.Decision != nil || d.Done > 0) {
		// The node's control loop runs before the worker has its
		// schedule: start applies these.
		c.early = append(c.early, d)
		return effects{}, false, nil
	}
	if c.join != nil && c.join.first == 0 {
		// A joining worker starts from the decision naming it: the
		// decisions and retries before it are of iterations it never
		// pushes.
		if d.Decision != nil && slices.Contains(d.Decision.Workers, c.self) {
			if err := c.joinedAt(*d.Decision); err != nil {
				return effects{}, false, err
			}
			out.merge(c.paramsSettle())
		}
	} else if d.Retry {
		if out, err = c.retry(d); err != nil {
			return effects{}, false, err
		}
	} else if d.Decision != nil {
		if latest := c.schedule.Latest(); d.Decision.Version != latest.Version+1 {
			return effects{}, false, fmt.Errorf("worker: decision v%d follows v%d: one is missing", d.Decision.Version, latest.Version)
		}
		// With the LB off the horizon is unbounded and only tests force
		// decisions: there is no grant to check against.
		if d.Decision.Iteration <= c.horizon && c.horizon != math.MaxUint64 {
			return effects{}, false, fmt.Errorf("worker: decision v%d takes effect at iteration %d, within the horizon already granted (%d)", d.Decision.Version, d.Decision.Iteration, c.horizon)
		}
		if err := c.schedule.Add(*d.Decision); err != nil {
			return effects{}, false, fmt.Errorf("worker: %w", err)
		}
		c.forgetDecisions()
	}
	if d.Done > c.done {
		c.done = d.Done
		out.merge(c.releaseHeld())
	}
	if d.Horizon > c.horizon {
		c.horizon = d.Horizon
		return out, true, nil
	}
	return out, false, nil
}

// setTensorsPerIteration announces how many tensors one iteration pushes.
func (c *core) setTensorsPerIteration(n int) error {
	if n < 1 {
		return fmt.Errorf("worker: SetTensorsPerIteration(%d): must be at least 1", n)
	}
	if len(c.tensors) > n {
		return fmt.Errorf("worker: SetTensorsPerIteration(%d): %d tensors are already declared", n, len(c.tensors))
	}
	c.perIter = n
	return nil
}

// declare registers a tensor of the given size in bytes; declaring it
// again with the same size and dtype only updates its priority.
func (c *core) declare(key uint64, dtype frame.DType, bytes uint64, priority int32) error {
	if t, ok := c.tensors[key]; ok {
		if t.dtype == dtype && t.bytes == bytes {
			t.priority = priority
			return nil
		}
		return fmt.Errorf("worker: key %d is already declared as %d bytes of %s: %w", key, t.bytes, t.dtype, ErrSizeMismatch)
	}
	if c.perIter > 0 && len(c.tensors) >= c.perIter {
		return fmt.Errorf("worker: declaring key %d would exceed the %d tensors per iteration announced", key, c.perIter)
	}
	t := &tensor{key: key, dtype: dtype, bytes: bytes, priority: priority}
	c.startTensor(t)
	c.tensors[key] = t
	c.tally(t)
	c.modelBytes += bytes
	return nil
}

// dtypeOf is the declared dtype of a byte-level call's keys: its first
// key's (split checks that the others agree). Undeclared or no keys: any
// dtype will do, split reports the fault.
func (c *core) dtypeOf(keys []uint64) frame.DType {
	if len(keys) > 0 {
		if t := c.tensors[keys[0]]; t != nil {
			return t.dtype
		}
	}
	return frame.Float32
}

// layoutFor returns t's partitions for an iteration under the decision in
// force then.
func (c *core) layoutFor(t *tensor, iter uint64) (lb.Decision, []lb.Partition) {
	d := c.schedule.At(iter)
	if t.layout == nil || t.layoutVersion != d.Version {
		t.layout = d.Layout(t.key, t.bytes, t.dtype.Size(), c.partBytes)
		t.layoutVersion = d.Version
	}
	return d, t.layout
}

// split checks keys, data and byte lengths against the declarations and
// returns each key's slice of data.
func (c *core) split(keys []uint64, data []byte, byteLens []int, dtype frame.DType) ([]*tensor, [][]byte, error) {
	if !c.started {
		return nil, nil, errors.New("worker: not started")
	}
	if len(byteLens) != len(keys) {
		return nil, nil, fmt.Errorf("worker: %d lengths for %d keys: %w", len(byteLens), len(keys), ErrSizeMismatch)
	}
	ts := make([]*tensor, len(keys))
	parts := make([][]byte, len(keys))
	off := 0
	c.calls++
	for i, k := range keys {
		t := c.tensors[k]
		if t == nil {
			return nil, nil, fmt.Errorf("worker: key %d: %w", k, ErrNotDeclared)
		}
		if t.dtype != dtype {
			return nil, nil, fmt.Errorf("worker: key %d is declared as %s, not %s (one call carries one dtype)", k, t.dtype, dtype)
		}
		if byteLens[i] < 0 || uint64(byteLens[i]) != t.bytes {
			return nil, nil, fmt.Errorf("worker: key %d is declared as %d bytes, the call gives %d: %w", k, t.bytes, byteLens[i], ErrSizeMismatch)
		}
		c.compared++
		if t.inCall == c.calls {
			return nil, nil, fmt.Errorf("worker: key %d appears twice in one call", k)
		}
		t.inCall = c.calls
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

// newRequest registers a request waiting for left items and the hand-over
// of its frames, or refuses it once the node failed.
func (c *core) newRequest(cl *call, left int) (*request, error) {
	if c.err != nil {
		return nil, fmt.Errorf("worker: the node failed: %w", c.err)
	}
	c.lastTS++
	r := &request{ts: c.lastTS, left: left + 1, call: cl}
	c.requests[r.ts] = r
	return r, nil
}

// settle records progress on r (n fewer outstanding items, or a failure)
// and returns it in effects.finished when that finishes it.
func (c *core) settle(r *request, n int, err error) effects {
	if r.finished {
		return effects{}
	}
	r.left -= n
	if err != nil {
		r.err = err
	}
	if r.left > 0 && r.err == nil {
		return effects{}
	}
	r.finished = true
	return effects{finished: []*request{r}}
}

// handedOver settles the call's own item of r: its local contributions
// were added (err: or refused) and its frames queued. No request completes
// before that, since the caller may reuse its buffer then.
func (c *core) handedOver(r *request, err error) effects { return c.settle(r, 1, err) }

// sent settles one frame of r written (or lost, err).
func (c *core) sent(r *request, err error) effects {
	if err != nil {
		err = fmt.Errorf("worker: push: %w", err)
	}
	return c.settle(r, 1, err)
}

// sendFailed settles r with the error of a frame that could not be queued:
// neither it nor the frames after it will be written.
func (c *core) sendFailed(r *request, h *frame.Header, err error) effects {
	return c.settle(r, 0, fmt.Errorf("worker: send %s: %w", h, err))
}

// release forgets a finished request once its callback returned, keeping
// its error for the first Wait that asks.
func (c *core) release(r *request) {
	delete(c.requests, r.ts)
	if r.err != nil {
		c.errs[r.ts] = r.err
	}
}

// lookup is Wait's first step: the request if it is outstanding, else its
// outcome (the error, once; nil; or ErrNoRequest).
func (c *core) lookup(ts int) (*request, error) {
	if r := c.requests[ts]; r != nil {
		return r, nil
	}
	if ts <= 0 || ts > c.lastTS {
		return nil, fmt.Errorf("worker: Wait(%d): %w", ts, ErrNoRequest)
	}
	return nil, c.collect(ts)
}

// settled is Test: whether request ts is released (its callback returned).
func (c *core) settled(ts int) (bool, error) {
	if ts <= 0 || ts > c.lastTS {
		return false, fmt.Errorf("worker: Test(%d): %w", ts, ErrNoRequest)
	}
	return c.requests[ts] == nil, nil
}

// collect returns request ts's error to the first caller that asks.
func (c *core) collect(ts int) error {
	err := c.errs[ts]
	delete(c.errs, ts)
	return err
}

// pending lists the requests not yet released.
func (c *core) pending() []*request {
	rs := make([]*request, 0, len(c.requests))
	for _, r := range c.requests {
		rs = append(rs, r)
	}
	return rs
}

// fail settles every outstanding request with the node's failure, and
// refuses new ones from now on.
func (c *core) fail(err error) effects {
	if c.err == nil {
		c.err = err
	}
	var t effects
	for _, r := range c.requests {
		t.merge(c.settle(r, 0, fmt.Errorf("worker: the node failed: %w", c.err)))
	}
	for tn := range c.allTensors() {
		t.unmap = append(t.unmap, tn.forgetInitial()...)
	}
	t.unmap = append(t.unmap, c.paramsBufs()...)
	// The order callbacks run in is the order requests were made.
	slices.SortFunc(t.finished, func(a, b *request) int { return a.ts - b.ts })
	return t
}
