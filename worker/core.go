package worker

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
	"unsafe"

	"github.com/fptps/fpt/classic"
	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/van"
)

// core is the worker's state and logic without I/O: declared tensors,
// the LB's schedule and horizon, requests, and the results being
// assembled. It holds no lock, opens no socket, starts no goroutine and
// reads no clock. Each method takes one input (a call, a received frame, a
// completed send, a directive, a failure) and returns a todo: what the
// shell (Worker) must do once it has released its lock. Like lb.Balancer
// beside scheduler/balance.go, it is tested with tables, without a cluster.
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
	results    map[resultKey]*result
	sunk       map[sunkKey]landing // result partitions being read in place

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
	// resum is FPT_ON_WORKER_LOSS=continue or wait: a lost worker's retry sums
	// the incomplete iterations again over the workers left, so their
	// sums change. A pull then completes only once every worker has its
	// iteration's sum (heldPulls), so that no program saw the old one.
	resum     bool
	heldPulls []*result
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
}

// deferredPull is a pull whose result lands in staging until done passes
// its iteration.
type deferredPull struct {
	r  *result
	pw *pullWait
}

// heldPush is a push whose frames may have to be sent again: until every
// worker has the sums of its iterations.
type heldPush struct {
	req      *request
	ts       []*tensor
	iters    []uint64 // per tensor: the iteration pushed
	parts    [][]byte // per tensor: the caller's values
	priority int32
	last     uint64 // the latest of iters
}

// retryMark is a retry decision applied: version, from iteration from on.
type retryMark struct {
	version uint32
	from    uint64
}

// errStale is claim's answer for a result frame that a retry made
// redundant (cut under a version it replaced, or a second copy of a sum
// this worker already has): it is dropped, not a protocol error.
var errStale = errors.New("stale result after a retry")

// newCore returns a worker core. With the LB on nothing may be pushed
// until the scheduler's first directive raises the horizon.
func newCore(partBytes uint64, lbOn bool) *core {
	c := &core{
		partBytes: partBytes,
		horizon:   math.MaxUint64,
		tensors:   make(map[uint64]*tensor),
		results:   make(map[resultKey]*result),
		sunk:      make(map[sunkKey]landing),
		requests:  make(map[int]*request),
		errs:      make(map[int]error),
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
}

// keptInit is the memory one Init call's values are kept in, outside the
// Go heap (the shell maps and unmaps it). It is unmapped once no key
// refers to it and no pull is copying out of it: a copy from unmapped
// memory would crash the process, not merely read stale values.
type keptInit struct {
	mem     []byte
	keys    int // tensors whose initial lies in mem
	readers int // initialCopy's not yet copied
	freed   bool
}

// drop returns k's memory for the shell to unmap, once nothing uses it.
func (k *keptInit) drop() [][]byte {
	if k.keys > 0 || k.readers > 0 || k.freed {
		return nil
	}
	k.freed = true
	return [][]byte{k.mem}
}

// forgetInitial drops t's kept value.
func (t *tensor) forgetInitial() [][]byte {
	k := t.kept
	if k == nil {
		return nil
	}
	t.initial, t.kept = nil, nil
	k.keys--
	return k.drop()
}

type resultKey struct{ key, iter uint64 }

// sunkKey names a result frame being read in place: the sender's
// partition of one key's iteration.
type sunkKey struct {
	sender    node.ID
	key, iter uint64
	part      uint32
}

func sunkKeyOf(h *frame.Header) sunkKey {
	return sunkKey{node.ID(h.Sender), h.Key, h.Iteration, h.Partition}
}

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
	// gen counts re-cuts by retries: a landing claimed before one no
	// longer counts. writing counts this gen's landings claimed and not
	// yet landed, stale those of older gens: their bytes are still being
	// written (the van reads a frame in place across many reads, and the
	// shell copies outside the lock). restage: re-cut while its pull copied
	// from staging or a stale landing was still being written into the
	// pull's buffer; new partitions are staged in a fresh buffer until
	// both end, since the new layout's partitions may overlap those bytes.
	gen     int
	writing int
	stale   int
	restage bool
	// held: complete, but its pull waits until every worker has the sum
	// (resum); the pull stays its waiter.
	held bool
}

type pullWait struct {
	req *request
	dst []byte
	// copying: the shell is copying the partitions staged before the pull
	// into dst, outside the lock (a tensor's staging can be gigabytes); the
	// result completes only once that copy is reported (copied).
	copying bool
}

// landing is where a claimed result partition's bytes go.
type landing struct {
	r       *result
	gen     int    // r.gen when claimed
	staging bool   // span is in r's staging buffer, not the waiter's
	span    []byte // exactly the partition's bytes
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
	frames []van.Message
	rng    *rangePull
}

// call is the shell's half of a request, which the core only carries.
type call struct {
	cb    Callback
	done  chan struct{} // closed once the request settled and cb returned
	pull  bool          // for the latency metric: values come back
	began time.Time
}

// delivery is the part of a result staged before its FPTPull came: the
// shell copies those partitions from staging into the pull's buffer
// outside the lock, then reports it with copied.
type delivery struct {
	r     *result
	pw    *pullWait
	buf   []byte // the staging buffer copied from
	parts []lb.Partition
}

// todo is what the shell does after a core call, once unlocked, in this
// order: copy the initial values, add the local contributions to the
// aggregator, queue sends, report the hand-over of req, copy the
// deliveries, complete the finished requests, and tell the LB agent an
// iteration began.
type todo struct {
	initials []initialCopy // copies to make before req is handed over
	unmap    [][]byte      // kept Init values nothing uses any more
	req      *request      // the call's request, to hand over; nil for other inputs
	locals   []van.Message // this worker's own contributions to partitions it aggregates
	sends    []van.Message // frames to queue
	counted  bool          // each send's Done settles one of req's outstanding items
	copies   []delivery
	finished []*request
	began    *iterationBegan
	// resends are a retry's frames, pushed again from held pushes.
	resends []resend
	// duty: hand the parameters to joining workers, before sends.
	duty *paramsDuty
	// notices are frames no request waits for (KVDrained).
	notices []van.Message
}

// resend is one held push's frames cut again by a retry decision.
type resend struct {
	req           *request
	locals, sends []van.Message
}

// initialCopy is a key's value after Init, copied into a pull's buffer;
// the shell reports it with initialCopied.
type initialCopy struct {
	dst, src []byte
	kept     *keptInit
}

// iterationBegan is what the LB agent learns from a push (or, under
// retry, a completed iteration), under the latest retry version.
type iterationBegan struct {
	iter, modelBytes uint64
	version          uint32
}

func (t *todo) merge(o todo) {
	t.finished = append(t.finished, o.finished...)
	t.copies = append(t.copies, o.copies...)
	t.resends = append(t.resends, o.resends...)
	t.notices = append(t.notices, o.notices...)
	if o.began != nil {
		t.began = o.began
	}
}

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
func (c *core) follow(d lb.Directive) (out todo, moved bool, err error) {
	if !c.started && (d.Decision != nil || d.Done > 0) {
		// The node's control loop runs before the worker has its
		// schedule: start applies these.
		c.early = append(c.early, d)
		return todo{}, false, nil
	}
	if c.join != nil && c.join.first == 0 {
		// A joining worker starts from the decision naming it: the
		// decisions and retries before it are of iterations it never
		// pushes.
		if d.Decision != nil && slices.Contains(d.Decision.Workers, c.self) {
			if err := c.joinedAt(*d.Decision); err != nil {
				return todo{}, false, err
			}
			out.merge(c.paramsSettle())
		}
	} else if d.Retry {
		if out, err = c.retry(d); err != nil {
			return todo{}, false, err
		}
	} else if d.Decision != nil {
		if latest := c.schedule.Latest(); d.Decision.Version != latest.Version+1 {
			return todo{}, false, fmt.Errorf("worker: decision v%d follows v%d: one is missing", d.Decision.Version, latest.Version)
		}
		// With the LB off the horizon is unbounded and only tests force
		// decisions: there is no grant to check against.
		if d.Decision.Iteration <= c.horizon && c.horizon != math.MaxUint64 {
			return todo{}, false, fmt.Errorf("worker: decision v%d takes effect at iteration %d, within the horizon already granted (%d)", d.Decision.Version, d.Decision.Iteration, c.horizon)
		}
		if err := c.schedule.Add(*d.Decision); err != nil {
			return todo{}, false, fmt.Errorf("worker: %w", err)
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

// aliasesHeld reports whether dst overlaps the values of a held push of
// t's iteration iter: a pull into its own push's buffer, as MXNet's
// kvstore and in-place all-reduce do.
func (c *core) aliasesHeld(t *tensor, iter uint64, dst []byte) bool {
	for _, hp := range c.held {
		for i, ht := range hp.ts {
			if ht == t && hp.iters[i] == iter && overlaps(hp.parts[i], dst) {
				return true
			}
		}
	}
	return false
}

// overlaps reports whether a and b share memory.
func overlaps(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	a0, b0 := uintptr(unsafe.Pointer(unsafe.SliceData(a))), uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return a0 < b0+uintptr(len(b)) && b0 < a0+uintptr(len(a))
}

// releaseHeld completes the held pushes whose iterations every worker has
// the sums of, and hands over the deferred pulls of those iterations.
func (c *core) releaseHeld() todo {
	var out todo
	c.deferred = slices.DeleteFunc(c.deferred, func(dp deferredPull) bool {
		if dp.r.iter >= c.done {
			return false
		}
		// done passed the iteration: its sum is complete here too.
		if d, ok := dp.r.wait(dp.pw); ok {
			out.copies = append(out.copies, d)
		} else {
			out.merge(c.finish(dp.r, dp.pw))
		}
		return true
	})
	c.heldPulls = slices.DeleteFunc(c.heldPulls, func(r *result) bool {
		if r.iter >= c.done {
			return false
		}
		r.held = false
		out.merge(c.finish(r, r.waiter))
		return true
	})
	c.held = slices.DeleteFunc(c.held, func(hp *heldPush) bool {
		if hp.last >= c.done && !hp.req.finished {
			return false
		}
		out.merge(c.settle(hp.req, 1, nil))
		return true
	})
	return out
}

// retry applies a retry decision (a server or a worker was lost): it
// replaces every decision from its iteration on, results of those
// iterations start again under it (the complete ones too when the workers
// changed: their sums do), and the held pushes of those iterations are cut
// again and returned to send.
func (c *core) retry(d lb.Directive) (todo, error) {
	dec := d.Decision
	resum := dec.Workers != nil
	switch {
	case !c.retryMode:
		return todo{}, fmt.Errorf("worker: retry decision v%d, but neither FPT_ON_SERVER_LOSS=retry nor FPT_ON_WORKER_LOSS=continue or wait is set here", dec.Version)
	case resum && !c.resum:
		return todo{}, fmt.Errorf("worker: retry decision v%d changes the workers, but FPT_ON_WORKER_LOSS is neither continue nor wait here", dec.Version)
	case dec.Iteration < c.done:
		return todo{}, fmt.Errorf("worker: retry decision v%d from iteration %d, but every worker has the sums up to %d", dec.Version, dec.Iteration, c.done)
	}
	if err := c.schedule.Rewrite(*dec); err != nil {
		return todo{}, fmt.Errorf("worker: retry: %w", err)
	}
	c.retried = append(c.retried, retryMark{dec.Version, dec.Iteration})
	for _, r := range c.results {
		if r.iter >= dec.Iteration && (!r.complete || resum) {
			c.recut(r, resum)
		}
	}
	var out todo
	if resum {
		c.heldPulls = slices.DeleteFunc(c.heldPulls, func(r *result) bool { return !r.held })
		out.merge(c.resumFrom(dec.Iteration))
	}
	for _, hp := range c.held {
		if hp.req.finished {
			continue
		}
		rs := resend{req: hp.req}
		for i, t := range hp.ts {
			if hp.iters[i] >= dec.Iteration {
				rs.sends, rs.locals = c.cut(rs.sends, rs.locals, t, hp.iters[i], hp.parts[i], hp.priority)
			}
		}
		if len(rs.sends)+len(rs.locals) > 0 {
			hp.req.left += len(rs.sends)
			out.resends = append(out.resends, rs)
		}
	}
	return out, nil
}

// recut starts r again under the layout now in force at its iteration:
// partitions received under the replaced one no longer count. With
// resum the workers changed, so a complete sum is summed again too (an
// empty tensor's excepted: it has nothing to sum).
func (c *core) recut(r *result, resum bool) {
	_, layout := c.layoutFor(r.t, r.iter)
	r.parts = layout
	r.seen = make([]bool, len(layout))
	r.staged = make([]bool, len(layout))
	r.left = len(layout)
	r.gen++
	r.stale += r.writing
	r.writing = 0
	if resum && len(layout) > 0 {
		r.complete, r.held = false, false
	}
	if r.stale > 0 {
		r.buf = nil // stale landings may still write into the old one
	}
	if r.waiter != nil && (r.waiter.copying || r.stale > 0) {
		r.restage, r.buf = true, nil
	}
}

// unstage ends r's restage once nothing older is written into its pull's
// buffer any more: the partitions staged apart meanwhile are copied over,
// or the pull completes if they are all in.
func (c *core) unstage(r *result) todo {
	if !r.restage || r.stale > 0 || r.waiter == nil || r.waiter.copying {
		return todo{}
	}
	r.restage = false
	if d, ok := r.wait(r.waiter); ok {
		return todo{copies: []delivery{d}}
	}
	if !r.complete {
		return todo{} // land completes it with its last partition
	}
	return c.finish(r, r.waiter)
}

// superseded reports whether a retry replaced the decision h was cut
// under.
func (c *core) superseded(h *frame.Header) bool {
	for _, m := range c.retried {
		if h.Iteration >= m.from && h.Aux < m.version {
			return true
		}
	}
	return false
}

// retryVersion is the latest retry decision applied (0: none): the LB
// counts only reports of re-summed iterations made under it.
func (c *core) retryVersion() uint32 {
	if len(c.retried) == 0 {
		return 0
	}
	return c.retried[len(c.retried)-1].version
}

// retriedAt reports whether a retry re-cut iteration iter.
func (c *core) retriedAt(iter uint64) bool {
	return slices.ContainsFunc(c.retried, func(m retryMark) bool { return iter >= m.from })
}

// sumIn records that t's sum of iteration iter is complete here, and
// reports (began) when that completes an iteration for every tensor:
// with retries on, the LB hears of completions rather than pushes, so
// that its Done means that every worker has the sums.
func (c *core) sumIn(t *tensor, iter uint64) todo {
	if !c.retryMode || iter < t.sumsIn {
		return todo{} // only retries need to know
	}
	if iter != t.sumsIn {
		if t.sumsAhead == nil {
			t.sumsAhead = make(map[uint64]bool)
		}
		t.sumsAhead[iter] = true
		return todo{}
	}
	t.sumsIn++
	for t.sumsAhead[t.sumsIn] {
		delete(t.sumsAhead, t.sumsIn)
		t.sumsIn++
	}
	return c.reportSums()
}

// reportSums reports (began) the iterations whose every sum is now here,
// if that is more than reported.
func (c *core) reportSums() todo {
	n, any := uint64(math.MaxUint64), false
	for _, tn := range c.tensors {
		if !tn.once && (tn.pushed > 0 || tn.sumsIn > 0) {
			n, any = min(n, tn.sumsIn), true
		}
	}
	if !any || n <= c.sumsIn {
		return todo{}
	}
	c.sumsIn = n
	return todo{began: &iterationBegan{iter: n, modelBytes: c.modelBytes, version: c.retryVersion()}}
}

// resumFrom forgets that the sums of iterations from on are here: after
// a lost worker they are summed again, and the LB must hear of them anew
// (under the retry's version). Empty tensors' sums stay complete.
func (c *core) resumFrom(from uint64) todo {
	for _, t := range c.tensors {
		for it := range t.sumsAhead {
			if it >= from {
				delete(t.sumsAhead, it)
			}
		}
		if t.sumsIn <= from {
			continue
		}
		t.sumsIn = from
		for {
			r := c.results[resultKey{t.key, t.sumsIn}]
			if r == nil || !r.complete {
				break
			}
			t.sumsIn++
		}
	}
	c.sumsIn = min(c.sumsIn, from)
	return c.reportSums()
}

// finish completes pull pw of result r, whose bytes are all in its
// buffer. With resum the pull completes only once every worker has the
// iteration's sum: until then it stays r's waiter, so that a retry lands
// the new sum in its buffer.
func (c *core) finish(r *result, pw *pullWait) todo {
	if c.resum && r.iter >= c.done {
		r.waiter, r.held = pw, true
		c.heldPulls = append(c.heldPulls, r)
		return todo{}
	}
	r.waiter = nil
	return c.delivered(r, pw.req)
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

// unpushed reports an error unless none of keys has been pushed: Init
// must be a key's first push.
func (c *core) unpushed(keys []uint64) error {
	for _, k := range keys {
		if t := c.tensors[k]; t != nil && t.pushed > 0 {
			return fmt.Errorf("worker: Init: key %d was pushed already", k)
		}
	}
	return nil
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
// and returns it in todo.finished when that finishes it.
func (c *core) settle(r *request, n int, err error) todo {
	if r.finished {
		return todo{}
	}
	r.left -= n
	if err != nil {
		r.err = err
	}
	if r.left > 0 && r.err == nil {
		return todo{}
	}
	r.finished = true
	return todo{finished: []*request{r}}
}

// handedOver settles the call's own item of r: its local contributions
// were added (err: or refused) and its frames queued. No request completes
// before that, since the caller may reuse its buffer then.
func (c *core) handedOver(r *request, err error) todo { return c.settle(r, 1, err) }

// sent settles one frame of r written (or lost, err).
func (c *core) sent(r *request, err error) todo {
	if err != nil {
		err = fmt.Errorf("worker: push: %w", err)
	}
	return c.settle(r, 1, err)
}

// sendFailed settles r with the error of a frame that could not be queued:
// neither it nor the frames after it will be written.
func (c *core) sendFailed(r *request, h *frame.Header, err error) todo {
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
func (c *core) fail(err error) todo {
	if c.err == nil {
		c.err = err
	}
	var t todo
	for _, r := range c.requests {
		t.merge(c.settle(r, 0, fmt.Errorf("worker: the node failed: %w", c.err)))
	}
	for _, tn := range c.tensors {
		t.unmap = append(t.unmap, tn.forgetInitial()...)
	}
	// The order callbacks run in is the order requests were made.
	slices.SortFunc(t.finished, func(a, b *request) int { return a.ts - b.ts })
	return t
}

// push is FPTPush on bytes: byteLens[i] bytes of data belong to keys[i].
// It answers errHorizon, changing nothing, while an iteration it would
// push lies beyond the LB's horizon.
func (c *core) push(keys []uint64, data []byte, byteLens []int, dtype frame.DType, priority int32, cl *call) (todo, error) {
	ts, parts, err := c.split(keys, data, byteLens, dtype)
	if err != nil {
		return todo{}, err
	}
	if c.join != nil && slices.ContainsFunc(ts, func(t *tensor) bool { return !c.join.took[t.key] }) {
		return todo{}, errors.New("worker: a worker that joined a running job calls Init first: it gets the parameters there")
	}
	if i := slices.IndexFunc(ts, func(t *tensor) bool { return t.once }); i >= 0 {
		return todo{}, fmt.Errorf("worker: key %d was broadcast: it has its init round only, and is never pushed again", ts[i].key)
	}
	if slices.ContainsFunc(ts, func(t *tensor) bool { return t.pushed > c.horizon }) {
		return todo{}, errHorizon
	}
	// One slice holds the request's frames: they live until their Done.
	// locals are the partitions this worker aggregates itself.
	var msgs, locals []van.Message
	began := uint64(0)
	for i, t := range ts {
		began = max(began, t.pushed)
		msgs, locals = c.cut(msgs, locals, t, t.pushed, parts[i], priority)
	}
	hold := 0
	if c.retryMode && began >= c.done {
		hold = 1 // settled once every worker has the sums (releaseHeld)
	}
	req, err := c.newRequest(cl, len(msgs)+hold)
	if err != nil {
		return todo{}, err
	}
	if hold > 0 {
		hp := &heldPush{req: req, ts: ts, iters: make([]uint64, len(ts)), parts: parts, priority: priority, last: began}
		for i, t := range ts {
			hp.iters[i] = t.pushed
		}
		c.held = append(c.held, hp)
	}
	out := todo{req: req, locals: locals, sends: msgs, counted: true}
	for _, t := range ts {
		iter := t.pushed
		if out.duty == nil {
			out.duty = c.duty(iter, priority)
		}
		t.pushed++
		out.unmap = append(out.unmap, t.forgetInitial()...)
		if _, layout := c.layoutFor(t, iter); len(layout) == 0 {
			// An empty tensor's sum is complete as soon as it is pushed.
			r := c.resultFor(t, iter)
			r.complete = true
			out.merge(c.sumIn(t, iter))
		}
	}
	if !c.retryMode {
		out.began = &iterationBegan{iter: began, modelBytes: c.modelBytes, version: c.retryVersion()}
	}
	return out, nil
}

// cut appends t's frames for an iteration, from its values data, under
// the decision in force then: to sends the partitions to send, to locals
// those this worker aggregates itself. In the init round only worker 0
// sends.
func (c *core) cut(sends, locals []van.Message, t *tensor, iter uint64, data []byte, priority int32) ([]van.Message, []van.Message) {
	var flags uint8
	if iter == 0 {
		if c.rank != 0 {
			return sends, locals
		}
		flags = frame.FlagInit
	}
	d, layout := c.layoutFor(t, iter)
	for _, p := range layout {
		m := van.Message{
			Header: frame.Header{
				Type: frame.Push, DType: t.dtype, Flags: flags,
				Sender: uint32(c.self), Recipient: uint32(p.Aggregator),
				Key: t.key, Partition: p.Index, Iteration: iter,
				Offset: p.Offset, Total: t.bytes, Length: p.Length, Priority: priority, Aux: d.Version,
			},
			Payload: data[p.Offset : p.Offset+p.Length],
		}
		if p.Aggregator == c.self {
			locals = append(locals, m)
		} else {
			sends = append(sends, m)
		}
	}
	return sends, locals
}

// iterationsPushed is how many iterations this worker has pushed in full:
// the fewest pushes of any declared key (0 before any).
func (c *core) iterationsPushed() uint64 {
	n, first := uint64(0), true
	for _, t := range c.tensors {
		if t.once {
			continue
		}
		if first || t.pushed < n {
			n, first = t.pushed, false
		}
	}
	return n
}

// pull is FPTPull on bytes: each key's next iteration's sum goes to its
// slice of data. Results already complete come back as copies to make.
func (c *core) pull(keys []uint64, data []byte, byteLens []int, dtype frame.DType, cl *call) (todo, error) {
	ts, parts, err := c.split(keys, data, byteLens, dtype)
	if err != nil {
		return todo{}, err
	}
	if slices.ContainsFunc(ts, func(t *tensor) bool { return t.pulled >= t.pushed }) {
		return c.pullInitial(ts, parts, cl)
	}
	req, err := c.newRequest(cl, len(ts))
	if err != nil {
		return todo{}, err
	}
	out := todo{req: req}
	for i, t := range ts {
		iter := t.pulled
		t.pulled++
		r := c.resultFor(t, iter)
		if iter >= c.done && c.aliasesHeld(t, iter, parts[i]) {
			c.deferred = append(c.deferred, deferredPull{r, &pullWait{req: req, dst: parts[i]}})
			continue
		}
		if d, ok := r.wait(&pullWait{req: req, dst: parts[i]}); ok {
			out.copies = append(out.copies, d)
		} else if r.complete {
			// Nothing to copy: complete now.
			out.merge(c.finish(r, r.waiter))
		}
	}
	return out, nil
}

// pullInitial answers a pull with no push outstanding for some key: if
// every key was initialised and not pushed since, with the values Init
// left (copied by the shell, as initials); else it is the caller's error.
func (c *core) pullInitial(ts []*tensor, parts [][]byte, cl *call) (todo, error) {
	for _, t := range ts {
		switch {
		case t.pulled < t.pushed:
			return todo{}, fmt.Errorf("worker: FPTPull mixes key %d, pushed for iteration %d, with keys that have no push outstanding: %w", t.key, t.pulled, ErrPullBeforePush)
		case t.initial == nil:
			return todo{}, fmt.Errorf("worker: FPTPull of key %d for iteration %d before its FPTPush: %w", t.key, t.pulled, ErrPullBeforePush)
		}
	}
	req, err := c.newRequest(cl, 0)
	if err != nil {
		return todo{}, err
	}
	out := todo{req: req}
	for i, t := range ts {
		t.kept.readers++
		out.initials = append(out.initials, initialCopy{dst: parts[i], src: t.initial, kept: t.kept})
	}
	return out, nil
}

// initialCopied is the shell's report that it has copied out of the kept
// values.
func (c *core) initialCopied(copies []initialCopy) todo {
	var out todo
	for _, cp := range copies {
		cp.kept.readers--
		out.unmap = append(out.unmap, cp.kept.drop()...)
	}
	return out
}

// keepInitial records the keys' values after Init for pullInitial: mem (the
// shell's copy, which the core now owns until it hands it back in
// todo.unmap) is laid out as byteLens say.
func (c *core) keepInitial(keys []uint64, mem []byte, byteLens []int) todo {
	var out todo
	k := &keptInit{mem: mem}
	if c.err == nil {
		off := 0
		for i, key := range keys {
			// A push since Init (from another thread) makes the values stale.
			if t := c.tensors[key]; t != nil && uint64(byteLens[i]) == t.bytes && t.pushed == t.pulled {
				out.unmap = append(out.unmap, t.forgetInitial()...)
				t.initial = mem[off : off+byteLens[i] : off+byteLens[i]]
				t.kept = k
				k.keys++
			}
			off += byteLens[i]
		}
	}
	out.unmap = append(out.unmap, k.drop()...)
	return out
}

// resultFor finds or creates the result of t's iteration.
func (c *core) resultFor(t *tensor, iter uint64) *result {
	k := resultKey{t.key, iter}
	if r := c.results[k]; r != nil {
		return r
	}
	_, layout := c.layoutFor(t, iter)
	r := &result{t: t, iter: iter, parts: layout, seen: make([]bool, len(layout)),
		staged: make([]bool, len(layout)), left: len(layout)}
	c.results[k] = r
	return r
}

// stage returns r's staging buffer, taking a spare if it has none.
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

// wait makes an FPTPull's buffer the destination of r's partitions still
// to come, and hands the shell those already staged to copy over (ok).
func (r *result) wait(pw *pullWait) (d delivery, ok bool) {
	r.waiter = pw
	for i, staged := range r.staged {
		if staged {
			d.parts = append(d.parts, r.parts[i])
			r.staged[i] = false
		}
	}
	if len(d.parts) == 0 {
		return delivery{}, false
	}
	pw.copying = true
	return delivery{r: r, pw: pw, buf: r.buf, parts: d.parts}, true
}

// copied reports that the shell has copied d's staged partitions: the
// result completes now if its last partition has already landed.
func (c *core) copied(d delivery) todo {
	d.pw.copying = false
	r := d.r
	if r.restage {
		// A retry re-cut r during the copy: what landed since was staged
		// apart, and is copied now (or once stale landings end).
		return c.unstage(r)
	}
	if !r.complete {
		return todo{} // land completes it with its last partition
	}
	return c.finish(r, d.pw)
}

// delivered completes an FPTPull's share of a result once its bytes are in
// the caller's buffer, and recycles the result's staging buffer.
func (c *core) delivered(r *result, req *request) todo {
	delete(c.results, resultKey{r.t.key, r.iter})
	if r.buf != nil && len(r.t.spare) < 2 {
		r.t.spare = append(r.t.spare, r.buf)
	}
	return c.settle(req, 1, nil)
}

// sink is the van.Sink half for Result frames: the span a partition is
// read into in place (the FPTPull's buffer or staging), or nil when the
// frame is wrong (received reports why).
func (c *core) sink(h *frame.Header) []byte {
	l, err := c.claim(h)
	if err != nil {
		return nil
	}
	c.sunk[sunkKeyOf(h)] = l
	return l.span
}

// abandon releases the landing of a frame its sender's connection was
// reading in place when it ended: the partition never lands, so a retry
// (or the job's failure) follows, but its bytes are no longer written.
func (c *core) abandon(peer node.ID) todo {
	var out todo
	for k, l := range c.sunk {
		if k.sender != peer {
			continue
		}
		delete(c.sunk, k)
		r := l.r
		if l.gen != r.gen {
			r.stale--
			out.merge(c.unstage(r))
			continue
		}
		r.writing--
	}
	return out
}

// received takes a Result frame: its landing, and whether sink already
// put its bytes there (else the shell copies the payload into l.span).
func (c *core) received(h *frame.Header) (l landing, inPlace bool, err error) {
	k := sunkKeyOf(h)
	if l, ok := c.sunk[k]; ok {
		delete(c.sunk, k)
		return l, true, nil
	}
	l, err = c.claim(h)
	return l, false, err
}

// claim validates a result frame (or this worker's own copy of a sum it
// aggregated) and reserves its partition.
func (c *core) claim(h *frame.Header) (landing, error) {
	if !c.started {
		return landing{}, errors.New("result before the worker started")
	}
	t := c.tensors[h.Key]
	if t == nil {
		return landing{}, errors.New("result for an undeclared key (declare every key on every worker before the first push)")
	}
	if c.superseded(h) {
		return landing{}, errStale
	}
	r := c.results[resultKey{h.Key, h.Iteration}]
	if r == nil {
		if h.Iteration < t.pulled && c.retriedAt(h.Iteration) {
			return landing{}, errStale // pulled before the retry re-sent it
		}
		if h.Iteration < t.pulled || h.Iteration > t.pushed {
			return landing{}, fmt.Errorf("result for iteration %d, but this worker pushed %d and pulled %d", h.Iteration, t.pushed, t.pulled)
		}
		r = c.resultFor(t, h.Iteration)
	}
	if r.complete && c.retriedAt(h.Iteration) {
		return landing{}, errStale // complete here before the retry
	}
	if err := r.check(h); err != nil {
		return landing{}, err
	}
	r.seen[h.Partition] = true
	r.writing++
	l := landing{r: r, gen: r.gen, staging: r.waiter == nil || r.restage}
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
func (c *core) land(l landing, part uint32) todo {
	r := l.r
	if l.gen != r.gen {
		// Claimed before a retry re-cut r: it no longer counts, but the
		// new cut's partitions may now go where its bytes went.
		r.stale--
		return c.unstage(r)
	}
	r.writing--
	if l.staging {
		if r.waiter != nil && !r.restage {
			// The pull came while this partition was being staged.
			p := r.parts[part]
			copy(r.waiter.dst[p.Offset:p.Offset+p.Length], l.span)
		} else {
			r.staged[part] = true
		}
	}
	r.left--
	if r.left > 0 {
		return todo{}
	}
	r.complete = true
	out := c.sumIn(r.t, r.iter)
	wait := r.waiter
	if wait == nil || wait.copying || r.restage {
		return out // its pull, copied or unstage completes it
	}
	out.merge(c.finish(r, wait))
	return out
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

// broadcastOnly marks keys initialised by Broadcast: their init round is
// all they have (see tensor.once).
func (c *core) broadcastOnly(keys []uint64) {
	for _, k := range keys {
		if t := c.tensors[k]; t != nil {
			t.once = true
		}
	}
}
