package memvan

import (
	"sync"
	"time"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/pool"
	"github.com/fptps/fpt/van"
)

// sendQueue is the send pool made safe for many producers and the one
// sender goroutine, with the real vans' rules (van/queue.go): Send blocks
// on the pool's byte limit, Forward never does, frames leave by priority
// within a destination and by weight across destinations, and Close waits
// for the pool to drain.
type sendQueue struct {
	mu    sync.Mutex
	space sync.Cond // producers blocked on the limit
	work  sync.Cond // the sender waiting for an entry, a purge or stop
	idle  sync.Cond // Close waiting for the pool to drain

	p       *pool.Pool[*van.Message]
	purge   []node.ID // flows to fail (peer lost), in order
	busy    bool      // the sender is handling a job
	closed  bool      // refuse new messages
	stopped bool      // the sender should finish
	sayBye  bool      // ... after saying Bye to every peer
}

type entry = pool.Entry[*van.Message]

// job is what the sender is given to do next.
type job struct {
	msg    *van.Message
	failed []entry
	stop   bool
	sayBye bool
}

func newSendQueue(limit int64) *sendQueue {
	q := &sendQueue{p: pool.New[*van.Message](limit)}
	q.space.L, q.work.L, q.idle.L = &q.mu, &q.mu, &q.mu
	return q
}

func (q *sendQueue) put(m *van.Message, block bool) error {
	n := int64(frame.HeaderSize) + int64(len(m.Payload))
	q.mu.Lock()
	defer q.mu.Unlock()
	for block && !q.closed && !q.p.Admit(n) {
		q.space.Wait()
	}
	if q.closed {
		return van.ErrClosed
	}
	q.p.Push(entry{Flow: m.Header.Recipient, Priority: m.Header.Priority, Bytes: n, Value: m})
	q.work.Signal()
	return nil
}

func (q *sendQueue) setWeight(flow node.ID, w float64) {
	q.mu.Lock()
	q.p.SetWeight(uint32(flow), w)
	q.work.Signal()
	q.mu.Unlock()
}

func (q *sendQueue) setShaping(on bool) {
	q.mu.Lock()
	q.p.SetShaping(on)
	q.work.Signal()
	q.mu.Unlock()
}

func (q *sendQueue) queued() int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.p.Bytes()
}

// purgeFlow asks the sender to fail what is queued for a lost peer, so
// that every Done callback runs on the sender goroutine.
func (q *sendQueue) purgeFlow(flow node.ID) {
	q.mu.Lock()
	q.purge = append(q.purge, flow)
	q.work.Signal()
	q.mu.Unlock()
}

// next blocks until the sender has something to do; every job but stop
// must be followed by done.
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

func (q *sendQueue) done() {
	q.mu.Lock()
	q.busy = false
	if q.p.Len() == 0 {
		q.idle.Broadcast()
	}
	q.mu.Unlock()
}

// closeAndDrain refuses new messages, resumes paused flows and waits up to
// timeout for the pool to empty; it reports whether it did.
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

func (q *sendQueue) stop(sayBye bool) {
	q.mu.Lock()
	q.closed, q.stopped, q.sayBye = true, true, sayBye
	q.space.Broadcast()
	q.work.Signal()
	q.mu.Unlock()
}
