package scheduler

import (
	"fmt"
	"time"

	"github.com/fptps/fpt/control"
	"github.com/fptps/fpt/node"
)

// stallWatch finds a worker that stopped pushing while the others wait for
// it. Each worker reports, with every heartbeat, how many iterations it has
// pushed in full; a worker is stalled once it has been behind the most
// advanced worker, without pushing anything, for longer than the timeout.
// The clock restarts whenever the worker pushes an iteration, so a worker
// that is merely slow (always a little behind, but moving) is never
// stalled. It is pure: the caller passes the time.
type stallWatch struct {
	timeout time.Duration // 0: off
	workers map[node.ID]*workerProgress
	most    uint64 // the most advanced worker's iterations pushed
}

type workerProgress struct {
	pushed uint64
	// since is when the worker last pushed, or when it fell behind,
	// whichever came later: how long it has kept the others waiting.
	since time.Time
}

// stall is a worker found stalled.
type stall struct {
	worker node.ID
	iter   uint64 // the iteration it has not pushed
	waited time.Duration
}

func newStallWatch(timeout time.Duration, workers []node.ID, now time.Time) *stallWatch {
	w := &stallWatch{timeout: timeout, workers: make(map[node.ID]*workerProgress, len(workers))}
	for _, id := range workers {
		w.workers[id] = &workerProgress{since: now}
	}
	return w
}

// report records that worker id has pushed its first pushed iterations.
// Reports from non-workers, and a count going backwards (a late heartbeat),
// change nothing.
func (w *stallWatch) report(id node.ID, pushed uint64, now time.Time) {
	p, ok := w.workers[id]
	if !ok || pushed <= p.pushed {
		return
	}
	p.pushed, p.since = pushed, now
	if pushed <= w.most {
		return
	}
	// Workers level with the old front fall behind now: their clock starts.
	for other, q := range w.workers {
		if other != id && q.pushed == w.most {
			q.since = now
		}
	}
	w.most = pushed
}

// add watches worker id, which joined the job: it pushes from iteration
// from on, so it is as far as a worker that has pushed the iterations
// before it (a smaller count it reports changes nothing).
func (w *stallWatch) add(id node.ID, from uint64, now time.Time) {
	if _, ok := w.workers[id]; ok {
		return
	}
	w.workers[id] = &workerProgress{since: now}
	w.report(id, from, now)
}

// remove stops watching worker id (it left the job). The front may move
// back to the workers left.
func (w *stallWatch) remove(id node.ID) {
	p, ok := w.workers[id]
	if !ok {
		return
	}
	delete(w.workers, id)
	if p.pushed < w.most {
		return
	}
	w.most = 0
	for _, q := range w.workers {
		w.most = max(w.most, q.pushed)
	}
}

// shift moves every worker's clock on by d (capped at now): time the
// watcher did not run.
func (w *stallWatch) shift(d time.Duration, now time.Time) {
	for _, p := range w.workers {
		if p.since = p.since.Add(d); p.since.After(now) {
			p.since = now
		}
	}
}

// check returns a worker that has kept the others waiting for longer than
// the timeout (the lowest id when several have), or ok false.
func (w *stallWatch) check(now time.Time) (s stall, ok bool) {
	if w.timeout <= 0 {
		return stall{}, false
	}
	for id, p := range w.workers {
		if p.pushed >= w.most {
			continue
		}
		if waited := now.Sub(p.since); waited > w.timeout && (!ok || id < s.worker) {
			s, ok = stall{worker: id, iter: p.pushed, waited: waited}, true
		}
	}
	return s, ok
}

// reason says what the stalled worker did not do, for every node's error.
func (s stall) reason() string {
	name := fmt.Sprintf("worker %d (id %d)", s.worker.Rank(), s.worker)
	return fmt.Sprintf("%s has pushed nothing for iteration %d for %s while the other workers wait (FPT_STALL_TIMEOUT)",
		name, s.iter, s.waited.Round(time.Second))
}

// workerIDs lists the workers of the node table.
func (c *core) workerIDs() []node.ID {
	var ids []node.ID
	for _, info := range c.table {
		if info.Role == node.Worker {
			ids = append(ids, info.ID)
		}
	}
	return ids
}

// stalled tells every node, the stalled worker included (it is alive and
// would otherwise wait on), that the job fails because of it.
func (c *core) stalled(st stall) error {
	reason := st.reason()
	c.log.Error("worker stalled; stopping the cluster", "worker", st.worker, "iteration", st.iter, "for", st.waited)
	for _, info := range c.table[1:] {
		c.send(info.ID, &control.Message{Command: control.NodeFailed, Sender: node.SchedulerID, Target: st.worker, Text: reason})
	}
	return fmt.Errorf("scheduler: %s", reason)
}
