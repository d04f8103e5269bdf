// Package sendq is a van's send queue: the send pool (package pool) made
// safe for many producers and the one sender goroutine. Send blocks on the
// pool's byte limit, Forward never does, the sender sleeps until there is
// work, and Close waits for the pool to drain. The TCP vans (package van)
// and the in-memory one (van/memvan) share it, so that they order, weigh,
// shape and bound frames alike.
package sendq

import (
	"sync"
	"time"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/pool"
)

// Queue holds the frames (of type T, the van's message) waiting to be sent.
type Queue[T any] struct {
	mu    sync.Mutex
	space sync.Cond // producers blocked on the limit; signalled as bytes leave
	work  sync.Cond // the sender waiting for an entry, a purge or stop
	idle  sync.Cond // CloseAndDrain waiting for the pool to drain

	p       *pool.Pool[T]
	purge   []node.ID // flows to fail (peer lost), in order
	busy    bool      // the sender is handling a job
	closed  bool      // refuse new messages
	stopped bool      // the sender should finish
	sayBye  bool      // ... after saying Bye to every peer
}

// Entry is a queued message.
type Entry[T any] = pool.Entry[T]

// Job is what the sender is given to do next: stop (after saying Bye to
// every peer if SayBye, failing Failed), fail Failed (a lost peer's
// entries), or else write Msgs, in order.
type Job[T any] struct {
	Msgs   []T
	Failed []Entry[T]
	Stop   bool
	SayBye bool
}

// Join decides which entries join a job's first message: asked about each
// entry that follows first in the pool's schedule, in order, it reports
// whether the entry joins; the first it refuses stays queued, the next to
// leave, and ends the job.
type Join[T any] func(first, next *Entry[T]) bool

// New returns an empty queue that holds up to limit bytes (headers
// included) before Put with block waits.
func New[T any](limit int64) *Queue[T] {
	q := &Queue[T]{p: pool.New[T](limit)}
	q.space.L, q.work.L, q.idle.L = &q.mu, &q.mu, &q.mu
	return q
}

// Put queues m, a frame with header h and a payload of payloadLen bytes;
// with block it waits while the pool is over its limit. It reports false
// when the queue is closed (m is not queued).
func (q *Queue[T]) Put(m T, h *frame.Header, payloadLen int, block bool) bool {
	n := int64(frame.HeaderSize) + int64(payloadLen)
	q.mu.Lock()
	defer q.mu.Unlock()
	for block && !q.closed && !q.p.Admit(n) {
		q.space.Wait()
	}
	if q.closed {
		return false
	}
	q.p.Push(Entry[T]{Flow: h.Recipient, Priority: h.Priority, Bytes: n, Value: m})
	q.work.Signal()
	return true
}

// SetWeight sets a destination's weight (see pool.Pool.SetWeight).
func (q *Queue[T]) SetWeight(flow node.ID, w float64) {
	q.mu.Lock()
	q.p.SetWeight(uint32(flow), w)
	q.work.Signal() // a resumed flow may be eligible now
	q.mu.Unlock()
}

// SetShaping switches weights and pauses on or off.
func (q *Queue[T]) SetShaping(on bool) {
	q.mu.Lock()
	q.p.SetShaping(on)
	q.work.Signal()
	q.mu.Unlock()
}

// Queued is the bytes waiting in the pool.
func (q *Queue[T]) Queued() int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.p.Bytes()
}

// PurgeFlow asks the sender to fail what is queued for a lost peer. The
// sender does it, so that Done callbacks all run on the sender goroutine.
func (q *Queue[T]) PurgeFlow(flow node.ID) {
	q.mu.Lock()
	q.purge = append(q.purge, flow)
	q.work.Signal()
	q.mu.Unlock()
}

// Next blocks until the sender has something to do. A job to write has
// the next message, and after it those that join takes (nil: none), in
// the pool's order, appended to msgs[:0]. Every job but Stop must be
// followed by Done.
func (q *Queue[T]) Next(msgs []T, join Join[T]) Job[T] {
	q.mu.Lock()
	defer q.mu.Unlock()
	for {
		if q.stopped {
			return Job[T]{Stop: true, SayBye: q.sayBye, Failed: q.p.Drain()}
		}
		if len(q.purge) > 0 {
			flow := q.purge[0]
			q.purge = q.purge[1:]
			if es := q.p.RemoveFlow(uint32(flow)); len(es) > 0 {
				q.busy = true
				q.space.Broadcast()
				return Job[T]{Failed: es}
			}
			continue
		}
		if e, ok := q.p.Pop(); ok {
			msgs = append(msgs[:0], e.Value)
			for join != nil {
				next, ok := q.p.PopIf(func(n *Entry[T]) bool { return join(&e, n) })
				if !ok {
					break
				}
				msgs = append(msgs, next.Value)
			}
			q.busy = true
			q.space.Broadcast()
			return Job[T]{Msgs: msgs}
		}
		q.idle.Broadcast()
		q.work.Wait()
	}
}

// Done marks the current job finished (its Done callbacks have run).
func (q *Queue[T]) Done() {
	q.mu.Lock()
	q.busy = false
	if q.p.Len() == 0 {
		q.idle.Broadcast()
	}
	q.mu.Unlock()
}

// CloseAndDrain refuses new messages, wakes blocked producers (Put reports
// false), resumes paused flows (what was accepted is sent, not dropped)
// and waits up to timeout for the pool to empty and the sender to go idle.
// It reports whether it drained.
func (q *Queue[T]) CloseAndDrain(timeout time.Duration) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	q.space.Broadcast()
	q.p.SetShaping(false)
	q.work.Signal()
	expired := false
	t := time.AfterFunc(timeout, func() {
		q.mu.Lock()
		expired = true
		q.idle.Broadcast()
		q.mu.Unlock()
	})
	defer t.Stop()
	for (q.p.Len() > 0 || q.busy || len(q.purge) > 0) && !expired {
		q.idle.Wait()
	}
	return q.p.Len() == 0 && !q.busy
}

// Stop tells the sender to finish: say Bye if asked, fail what is left.
func (q *Queue[T]) Stop(sayBye bool) {
	q.mu.Lock()
	q.closed, q.stopped, q.sayBye = true, true, sayBye
	q.space.Broadcast()
	q.work.Signal()
	q.mu.Unlock()
}
