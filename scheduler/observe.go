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
	// Apps carries the scheduler's customers' messages (nil: it has
	// none, and members' app messages are refused).
	Apps *Apps
}

// observer feeds the Observers from the scheduler's loop.
type observer struct {
	Observers
	rec *status.Recorder
}

// publish has the shell post the status once the input is handled.
func (c *core) publish() { c.out.publish = true }

// snapshot is the status at now, from the scheduler's last-seen times.
func (c *core) snapshot(now time.Time) status.Snapshot {
	return c.obs.rec.Snapshot(now, c.lastSeen)
}

// started records the node table, once every node registered.
func (c *core) started() {
	c.obs.rec.Started(c.table, c.now)
	c.obs.Metrics.Members(c.table)
	c.publish()
}

// directed records the directives the LB answered a report with at now.
func (c *core) directed(ds []lb.Directive) {
	now := c.now
	if len(ds) == 0 {
		return
	}
	for _, d := range ds {
		p := c.obs.rec.Directive(d, c.lb.State(), now)
		c.obs.Metrics.Iteration(p.Iteration, time.Duration(p.Seconds*float64(time.Second)))
		if d.Decision != nil {
			c.obs.Metrics.Decision(*d.Decision, d.Probe)
		}
	}
	c.obs.Metrics.Guards(c.lb.Guards())
	up, down := c.lb.Measured()
	bound, err := c.lb.Bound()
	if err != nil {
		bound = 0 // a node not measured yet
	}
	c.obs.rec.Measured(up, down, bound)
	c.obs.Metrics.Capacities(up, down)
	c.publish()
}
