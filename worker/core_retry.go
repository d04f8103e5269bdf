package worker

// The core under FPT_ON_SERVER_LOSS=retry: pushes held until every worker
// has their sums, and the retry decision that cuts them again.

import (
	"errors"
	"fmt"
	"slices"
	"unsafe"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/lb"
)

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

// heldValues is a held push's values of one key and iteration.
type heldValues struct {
	hp   *heldPush
	data []byte
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

// resend is one held push's frames cut again by a retry decision.
type resend struct {
	req           *request
	locals, sends []frame.Message
}

// aliasesHeld reports whether dst overlaps the values of a held push of
// t's iteration iter: a pull into its own push's buffer, as MXNet's
// kvstore and in-place all-reduce do.
func (c *core) aliasesHeld(t *tensor, iter uint64, dst []byte) bool {
	return slices.ContainsFunc(c.heldAt[resultKey{t.key, iter}], func(v heldValues) bool { return overlaps(v.data, dst) })
}

// hold keeps hp until every worker has the sums of its iterations.
func (c *core) hold(hp *heldPush) {
	c.held = append(c.held, hp)
	for i, t := range hp.ts {
		k := resultKey{t.key, hp.iters[i]}
		c.heldAt[k] = append(c.heldAt[k], heldValues{hp, hp.parts[i]})
	}
}

// unhold forgets hp's values (releaseHeld takes it out of c.held).
func (c *core) unhold(hp *heldPush) {
	for i, t := range hp.ts {
		k := resultKey{t.key, hp.iters[i]}
		vs := slices.DeleteFunc(c.heldAt[k], func(v heldValues) bool { return v.hp == hp })
		if len(vs) == 0 {
			delete(c.heldAt, k)
		} else {
			c.heldAt[k] = vs
		}
	}
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
func (c *core) releaseHeld() effects {
	var out effects
	c.deferred = slices.DeleteFunc(c.deferred, func(dp deferredPull) bool {
		if dp.r.iter >= c.done {
			return false
		}
		// The pull's buffer is free: what is staged is copied there, and
		// the partitions still to come land there. Done passing the
		// iteration does not mean this worker has all of its sum: a key
		// initialised apart counts in the report only once pushed.
		if d, ok := dp.r.wait(dp.pw); ok {
			out.copies = append(out.copies, d)
		} else if dp.r.complete {
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
		c.unhold(hp)
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
func (c *core) retry(d lb.Directive) (effects, error) {
	dec := d.Decision
	workersChanged := dec.Workers != nil
	switch {
	case !c.retryMode:
		return effects{}, fmt.Errorf("worker: retry decision v%d, but neither FPT_ON_SERVER_LOSS=retry nor FPT_ON_WORKER_LOSS=continue or wait is set here", dec.Version)
	case workersChanged && !c.sumsAgainOnWorkerLoss:
		return effects{}, fmt.Errorf("worker: retry decision v%d changes the workers, but FPT_ON_WORKER_LOSS is neither continue nor wait here", dec.Version)
	case dec.Iteration < c.done:
		return effects{}, fmt.Errorf("worker: retry decision v%d from iteration %d, but every worker has the sums up to %d", dec.Version, dec.Iteration, c.done)
	}
	if err := c.schedule.Rewrite(*dec); err != nil {
		return effects{}, fmt.Errorf("worker: retry: %w", err)
	}
	c.retried = append(c.retried, retryMark{dec.Version, dec.Iteration})
	for _, r := range c.results {
		if r.iter >= dec.Iteration && (!r.complete || workersChanged) {
			c.recut(r, workersChanged)
		}
	}
	var out effects
	if workersChanged {
		c.heldPulls = slices.DeleteFunc(c.heldPulls, func(r *result) bool { return !r.held })
		out.merge(c.sumAgainFrom(dec.Iteration))
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
// partitions received under the replaced one no longer count. When the
// workers changed, a complete sum is summed again too (an empty tensor's
// excepted: it has nothing to sum).
func (c *core) recut(r *result, workersChanged bool) {
	_, layout := c.layoutFor(r.t, r.iter)
	r.parts = layout
	r.seen = make([]bool, len(layout))
	r.staged = make([]bool, len(layout))
	r.left = len(layout)
	r.gen++
	r.stale += r.writing
	r.writing = 0
	if workersChanged && len(layout) > 0 {
		r.complete, r.held = false, false
	}
	if r.stale > 0 {
		r.buf = nil // stale landings may still write into the old one
	}
	if r.waiter != nil && (r.waiter.copying > 0 || r.stale > 0) {
		r.restage, r.buf = true, nil
	}
	if r.gate != nil {
		r.gate.closed = nil // the new cut's partitions are not the frames'
	}
}

// unstage ends r's restage once nothing older is written into its pull's
// buffer any more: the partitions staged apart meanwhile are copied over,
// or the pull completes if they are all in.
func (c *core) unstage(r *result) effects {
	if !r.restage || r.stale > 0 || r.waiter == nil || r.waiter.copying > 0 {
		return effects{}
	}
	r.restage = false
	if d, ok := r.wait(r.waiter); ok {
		return effects{copies: []delivery{d}}
	}
	if !r.complete || r.gate != nil {
		return effects{} // land or open completes it
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
