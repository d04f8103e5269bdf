package scheduler

import (
	"time"

	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/metrics"
	"github.com/fptps/fpt/status"
)

// Observers watch the scheduler from outside. Nil fields watch nothing.
type Observers struct {
	// Status receives a status.Snapshot at every change and every
	// heartbeat interval (the status page, FPT_STATUS_ADDR).
	Status *status.Board
	// Metrics records the members, the LB's decisions and the iterations.
	Metrics *metrics.Scheduler
}

// observer feeds the Observers from the scheduler's loop.
type observer struct {
	Observers
	rec *status.Recorder
}

// publish posts the status at now, from the scheduler's last-seen times.
func (s *sched) publish(now time.Time) {
	if s.obs.Status != nil {
		s.obs.Status.Publish(s.obs.rec.Snapshot(now, s.lastSeen))
	}
}

// started records the node table, once every node registered.
func (s *sched) started(now time.Time) {
	s.obs.rec.Started(s.table, now)
	s.obs.Metrics.Members(s.table)
	s.publish(now)
}

// directed records the directives the LB answered a report with at now.
func (s *sched) directed(ds []lb.Directive, now time.Time) {
	if len(ds) == 0 {
		return
	}
	for _, d := range ds {
		p := s.obs.rec.Directive(d, s.lb.State(), now)
		s.obs.Metrics.Iteration(p.Iteration, time.Duration(p.Seconds*float64(time.Second)))
		if d.Decision != nil {
			s.obs.Metrics.Decision(*d.Decision, d.Probe)
		}
	}
	up, down := s.lb.Measured()
	bound, err := s.lb.Bound()
	if err != nil {
		bound = 0 // a node not measured yet
	}
	s.obs.rec.Measured(up, down, bound)
	s.obs.Metrics.Capacities(up, down)
	s.publish(now)
}
