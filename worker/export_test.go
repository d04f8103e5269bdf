package worker

import (
	"github.com/fptps/fpt/classic"
	"github.com/fptps/fpt/lb"
)

// Follow applies an LB directive as the scheduler's would be: tests use it
// to force decisions at chosen iterations.
func (w *Worker) Follow(d lb.Directive) error { return w.follow(d) }

// ClassicLayout is the classic key layout the worker sends requests by.
func (w *Worker) ClassicLayout() classic.Layout {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.c.layout
}

// ScheduleLen is how many LB decisions the worker holds.
func (w *Worker) ScheduleLen() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.c.schedule.Len()
}

// Restaged is how many result bytes the worker copied from staging into a
// pull's buffer.
func (w *Worker) Restaged() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.c.restaged
}

// JoinCopies is what a joining worker did with its parameters: bytes
// copied out of the van's buffer, and bytes kept as Init's values where
// they were read.
func (w *Worker) JoinCopies() (cloned, kept uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.c.join == nil {
		return 0, 0
	}
	return w.c.join.cloned, w.c.join.kept
}
