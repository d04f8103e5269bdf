package van

import (
	"github.com/fptps/fpt/node"

	"sync"
	"time"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/pool"
)

// sendQueue is the pool made safe for many producers and the one sender
// goroutine: Send blocks on the pool's byte limit, Forward never does, the
// sender sleeps until there is work, and Close waits for it to drain.
type sendQueue struct {
	mu    sync.Mutex
	space sync.Cond // producers blocked on the limit; signalled as bytes leave
	work  sync.Cond // the sender waiting for an entry, a purge or stop
	idle  sync.Cond // Close waiting for the pool to drain

	p       *pool.Pool[*Message]
	purge   []node.ID // flows to fail (peer lost), in order
	busy    bool      // the sender is handling a job
	closed  bool      // refuse new messages
	stopped bool      // the sender should finish
	sayBye  bool      // ... after saying Bye to every peer
}

// entry is a queued message.
type entry = pool.Entry[*Message]

// job is what the sender is given to do next.
type job struct {
	msg    *Message
	failed []entry // entries to fail (purge, or stop)
	stop   bool
	sayBye bool
}

func newSendQueue(limit int64) *sendQueue {
	q := &sendQueue{p: pool.New[*Message](limit)}
	q.space.L, q.work.L, q.idle.L = &q.mu, &q.mu, &q.mu
	return q
}

// put queues m; with block it waits while the pool is over its limit.
func (q *sendQueue) put(m *Message, block bool) error {
	n := int64(frame.HeaderSize) + int64(len(m.Payload))
	q.mu.Lock()
	defer q.mu.Unlock()
	for block && !q.closed && !q.p.Admit(n) {
		q.space.Wait()
	}
	if q.closed {
		return ErrClosed
	}
	q.p.Push(pool.Entry[*Message]{Flow: m.Header.Recipient, Priority: m.Header.Priority, Bytes: n, Value: m})
	q.work.Signal()
	return nil
}

func (q *sendQueue) setWeight(flow node.ID, w float64) {
	q.mu.Lock()
	q.p.SetWeight(uint32(flow), w)
	q.work.Signal() // a resumed flow may be eligible now
	q.mu.Unlock()
}

func (q *sendQueue) setShaping(on bool) {
	q.mu.Lock()
	q.p.SetShaping(on)
	q.work.Signal()
	q.mu.Unlock()
}

// queued is the bytes waiting in the pool.
func (q *sendQueue) queued() int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.p.Bytes()
}

// purgeFlow asks the sender to fail what is queued for a lost peer. The
// sender does it, so that Done callbacks all run on the sender goroutine.
func (q *sendQueue) purgeFlow(flow node.ID) {
	q.mu.Lock()
	q.purge = append(q.purge, flow)
	q.work.Signal()
	q.mu.Unlock()
}

// next blocks until the sender has something to do. Every job but stop must
// be followed by done.
func (q *sendQueue) next() job {
	q.mu.Lock()
	defer q.mu.Unlock()
	for {
		if q.stopped {
			return job{stop: true, sayBye: q.sayBye, failed: q.p.Drain()}
		}
		if len(q.purge) > 0 {
			flow := q.purge[0]
			q.purge = q.purge[1:]
			if es := q.p.RemoveFlow(uint32(flow)); len(es) > 0 {
				q.busy = true
				q.space.Broadcast()
				return job{failed: es}
			}
			continue
		}
		if e, ok := q.p.Pop(); ok {
			q.busy = true
			q.space.Broadcast()
			return job{msg: e.Value}
		}
		q.idle.Broadcast()
		q.work.Wait()
	}
}

// done marks the current job finished (its Done callbacks have run).
func (q *sendQueue) done() {
	q.mu.Lock()
	q.busy = false
	if q.p.Len() == 0 {
		q.idle.Broadcast()
	}
	q.mu.Unlock()
}

// closeAndDrain refuses new messages, wakes blocked producers (they get
// ErrClosed), resumes paused flows (what was accepted is sent, not dropped)
// and waits up to timeout for the pool to empty and the sender to go idle.
// It reports whether it drained.
func (q *sendQueue) closeAndDrain(timeout time.Duration) bool {
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

// stop tells the sender to finish: say Bye if asked, fail what is left.
func (q *sendQueue) stop(sayBye bool) {
	q.mu.Lock()
	q.closed, q.stopped, q.sayBye = true, true, sayBye
	q.space.Broadcast()
	q.work.Signal()
	q.mu.Unlock()
}
