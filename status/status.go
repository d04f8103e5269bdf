// Package status keeps what the scheduler's status page shows: the
// members, the load balancer's measurements and decisions, and the recent
// iteration times, as a Snapshot (the page's /status.json).
//
// It is pure: the scheduler's loop feeds a Recorder what happens, with
// the time it happened, and publishes a Snapshot to a Board, which the
// HTTP side (package statusweb) reads from other goroutines. Everything
// kept is bounded: the iteration times and decision marks are rings.
package status

import (
	"net"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/node"
)

// Snapshot is the status page's data at one moment.
type Snapshot struct {
	// Time is when it was taken, in Unix milliseconds.
	Time int64 `json:"time_ms"`
	// Phase is "registering", "running" or "stopped".
	Phase   string   `json:"phase"`
	LB      bool     `json:"lb"`
	Members []Member `json:"members"`
	// State is the LB's state: default, probe or balanced ("" when off).
	State string `json:"lb_state,omitempty"`
	// Decision is the latest decision issued (nil before the first one,
	// or with the LB off).
	Decision *Decision `json:"decision,omitempty"`
	// Capacities are the rates the LB measured, per server and worker.
	Capacities []Capacity `json:"capacities"`
	// BoundSeconds is the least iteration time the measured capacities
	// allow (lb.Bound); 0 while unknown.
	BoundSeconds float64 `json:"bound_seconds"`
	// Iterations are the latest finished iterations, oldest first, at most
	// a Recorder's capacity.
	Iterations []Point `json:"iterations"`
	// Decisions mark where each recent decision takes effect, oldest first.
	Decisions []Mark `json:"decisions"`
	// Probes counts the probes since the start.
	Probes int `json:"probes"`
}

// Member is one node of the cluster.
type Member struct {
	Name  string  `json:"name"` // as "server 0"
	Role  string  `json:"role"`
	Rank  int     `json:"rank"`
	ID    node.ID `json:"id"`
	Addr  string  `json:"addr"` // host:control port
	Alive bool    `json:"alive"`
	// SeenAgoSeconds is the time since the scheduler last heard from it
	// (0 for the scheduler itself).
	SeenAgoSeconds float64 `json:"seen_ago_seconds"`
	// Group is a worker's local group (package localagg): its host and
	// how many workers it has; "" for other roles.
	Group string `json:"group,omitempty"`
}

// Decision is an LB decision with its shares by node.
type Decision struct {
	Version       uint32  `json:"version"`
	FromIteration uint64  `json:"from_iteration"`
	Probe         bool    `json:"probe"`
	Reason        string  `json:"reason"`
	Shares        []Share `json:"shares"`
}

// Share is one aggregator's share of every tensor, a fraction.
type Share struct {
	Node  string  `json:"node"`
	Share float64 `json:"share"`
}

// Capacity is a node's measured rates in bits per second (0: not yet
// measured).
type Capacity struct {
	Node        string  `json:"node"`
	SendBits    float64 `json:"send_bits_per_second"`
	ReceiveBits float64 `json:"receive_bits_per_second"`
}

// Point is one finished iteration and how long it took: the time between
// the moments the scheduler saw it and the one before it finish.
type Point struct {
	Iteration uint64  `json:"iteration"`
	Seconds   float64 `json:"seconds"`
}

// Mark is a decision on the iteration chart, at the iteration it takes
// effect from.
type Mark struct {
	Version   uint32 `json:"version"`
	Iteration uint64 `json:"iteration"`
	Probe     bool   `json:"probe"`
}

// NodeName names a node for people and for metric labels: role and rank,
// as "server 0" or "worker 1"; the scheduler is "scheduler".
func NodeName(id node.ID) string {
	r, ok := id.Role()
	switch {
	case !ok:
		return "node " + strconv.Itoa(int(id))
	case r == node.Scheduler:
		return "scheduler"
	}
	return r.String() + " " + strconv.Itoa(id.Rank())
}

// DefaultKeep is how many iteration times and decision marks a Recorder
// keeps by default: enough for the chart, bounded whatever the job's
// length.
const DefaultKeep = 600

// Recorder builds Snapshots from what the scheduler tells it. It is not
// safe for concurrent use: the scheduler's loop owns it.
type Recorder struct {
	lbOn     bool
	phase    string
	members  []node.Info
	groups   map[node.ID]string // Groups
	started  time.Time
	timeout  time.Duration
	state    string
	decision *Decision
	up, down map[node.ID]float64
	bound    time.Duration
	iters    *Ring[Point]
	marks    *Ring[Mark]
	probes   int
	next     uint64    // the next iteration to finish
	last     time.Time // when the latest one finished (or the LB started)
}

// NewRecorder returns a Recorder for a scheduler with the LB on or off,
// keeping the latest keep iteration times and decisions (DefaultKeep if
// keep < 1). A member silent for longer than timeout is shown dead.
func NewRecorder(lbOn bool, timeout time.Duration, keep int) *Recorder {
	if keep < 1 {
		keep = DefaultKeep
	}
	return &Recorder{lbOn: lbOn, phase: "registering", timeout: timeout,
		iters: NewRing[Point](keep), marks: NewRing[Mark](keep)}
}

// Started records the node table, at now: the cluster runs, and the LB
// (if on) starts timing iterations.
func (r *Recorder) Started(table []node.Info, now time.Time) {
	r.members = slices.Clone(table)
	r.phase, r.started, r.last = "running", now, now
}

// Groups records the workers' local groups: each worker's, as the page
// shows it ("host (n workers)").
func (r *Recorder) Groups(groups map[node.ID]string) { r.groups = groups }

// Stopped records that the cluster has terminated or failed.
func (r *Recorder) Stopped() { r.phase = "stopped" }

// Directive records one directive the LB answered a report with, at now:
// each one is the next iteration finished, in order from iteration 0.
// state is the LB's state after it. It returns the iteration's point.
func (r *Recorder) Directive(d lb.Directive, state lb.State, now time.Time) Point {
	p := Point{Iteration: r.next, Seconds: max(now.Sub(r.last), 0).Seconds()}
	r.iters.Add(p)
	r.next++
	r.last = now
	r.state = state.String()
	r.decided(d)
	return p
}

// Changed records a membership change: the node table after it, and the
// directive that came with it (a retry after a lost server, the decision
// that gives a joining one its share, or none); it marks no iteration as
// finished.
func (r *Recorder) Changed(table []node.Info, d lb.Directive, state lb.State) {
	r.members = slices.Clone(table)
	r.state = state.String()
	r.decided(d)
}

// decided records d's decision, if it carries one.
func (r *Recorder) decided(d lb.Directive) {
	if d.Decision == nil {
		return
	}
	dec := &Decision{Version: d.Decision.Version, FromIteration: d.Decision.Iteration, Probe: d.Probe, Reason: d.Reason}
	for i, a := range d.Decision.Aggregators {
		if i < len(d.Decision.Shares) {
			dec.Shares = append(dec.Shares, Share{Node: NodeName(a), Share: d.Decision.Shares[i]})
		}
	}
	r.decision = dec
	r.marks.Add(Mark{Version: dec.Version, Iteration: dec.FromIteration, Probe: d.Probe})
	if d.Probe {
		r.probes++
	}
}

// Measured records the LB's measured rates (bytes per second, as
// lb.Balancer.Measured returns them) and its bound (0: unknown).
func (r *Recorder) Measured(up, down map[node.ID]float64, bound time.Duration) {
	r.up, r.down, r.bound = up, down, bound
}

// Snapshot is the status at now; seen is when the scheduler last heard
// from each member (a member missing from it counts from the start).
func (r *Recorder) Snapshot(now time.Time, seen map[node.ID]time.Time) Snapshot {
	s := Snapshot{Time: now.UnixMilli(), Phase: r.phase, LB: r.lbOn, State: r.state, Decision: r.decision,
		BoundSeconds: r.bound.Seconds(), Iterations: r.iters.Items(), Decisions: r.marks.Items(), Probes: r.probes,
		Members: []Member{}, Capacities: []Capacity{}}
	for _, info := range r.members {
		m := Member{Name: NodeName(info.ID), Role: info.Role.String(), Rank: info.ID.Rank(), ID: info.ID,
			Addr: net.JoinHostPort(info.Host, strconv.Itoa(info.ControlPort)), Alive: r.phase == "running", Group: r.groups[info.ID]}
		if info.ID != node.SchedulerID {
			at, ok := seen[info.ID]
			if !ok {
				at = r.started
			}
			ago := max(now.Sub(at), 0)
			m.SeenAgoSeconds = ago.Seconds()
			m.Alive = r.phase == "running" && ago <= r.timeout
		}
		s.Members = append(s.Members, m)
		if r.lbOn && info.ID != node.SchedulerID {
			s.Capacities = append(s.Capacities, Capacity{Node: m.Name, SendBits: 8 * r.up[info.ID], ReceiveBits: 8 * r.down[info.ID]})
		}
	}
	return s
}

// Ring keeps the latest items added, at most its capacity.
type Ring[T any] struct {
	buf   []T
	start int // index of the oldest item once full
}

// NewRing returns an empty ring holding at most capacity (at least 1)
// items.
func NewRing[T any](capacity int) *Ring[T] {
	return &Ring[T]{buf: make([]T, 0, max(capacity, 1))}
}

// Add appends v, dropping the oldest item when full.
func (r *Ring[T]) Add(v T) {
	if len(r.buf) < cap(r.buf) {
		r.buf = append(r.buf, v)
		return
	}
	r.buf[r.start] = v
	r.start = (r.start + 1) % len(r.buf)
}

// Items returns a copy of the items, oldest first (never nil).
func (r *Ring[T]) Items() []T {
	return append(append(make([]T, 0, len(r.buf)), r.buf[r.start:]...), r.buf[:r.start]...)
}

// Board holds the latest Snapshot published, for readers on other
// goroutines. The zero Board is ready and holds an empty snapshot.
type Board struct {
	latest atomic.Pointer[Snapshot]
}

// Publish makes s the latest snapshot.
func (b *Board) Publish(s Snapshot) { b.latest.Store(&s) }

// Latest returns the latest snapshot published, or a "registering" one.
func (b *Board) Latest() Snapshot {
	if s := b.latest.Load(); s != nil {
		return *s
	}
	return Snapshot{Phase: "registering", Members: []Member{}, Capacities: []Capacity{}, Iterations: []Point{}, Decisions: []Mark{}}
}
