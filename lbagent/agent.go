// Package lbagent is the load balancer's hand on every server and worker
// (docs/design.md). It measures the node's send and receive rates from the
// van's counters, reports them to the LB scheduler once per iteration (or
// once per half of FPT_LB_AHEAD, for shorter iterations: Pace), and
// applies the directives that come back: shaping off while probing, pool
// weights that follow the decision, and (through the worker) new decisions
// and the horizon of iterations the workers may push.
//
// The rate arithmetic is Meter's, which is pure; the decisions are
// package lb's. This package only moves numbers between the van, the
// control plane and the node.
package lbagent

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fptps/fpt/cluster"
	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/control"
	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/localagg"
	"github.com/fptps/fpt/node"
)

// Timing of the measurements.
const (
	// Tick is how often the agent reads the van's counters.
	Tick = 25 * time.Millisecond
	// Window is the span over which a rate is taken (see Meter).
	Window = 250 * time.Millisecond
)

// Apply is the worker's part of a directive: add its decision to the
// schedule and raise the horizon. An error (a decision out of sequence)
// fails the node: pushing on without the decision would misroute.
type Apply func(lb.Directive) error

// Agent is one node's LB agent.
type Agent struct {
	node  *cluster.Member
	apply Apply // nil on servers

	mu    sync.Mutex
	meter *Meter
	// considered is the last iteration begun whose report was sent or
	// skipped (pace). Atomic: a server calls IterationBegan for every
	// pushed frame, and all but one per iteration stop here.
	considered atomic.Uint64
	// version is the latest retry version reported under.
	version atomic.Uint32
	pace    *Pace
	// skipped is the report the pace skipped last, sent by flush when
	// it falls due unless a later report goes first (nil then).
	skipped  *report
	flush    *time.Timer
	shaping  bool
	quit     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// New makes n's agent and installs its control handler; call it before
// n.Start. apply is the worker's (nil on a server).
func New(n *cluster.Member, apply Apply) *Agent {
	a := &Agent{node: n, apply: apply, meter: NewMeter(Window), pace: NewPace(reportEvery(n.Config())), shaping: true, quit: make(chan struct{})}
	n.OnControl(a.handleControl)
	return a
}

// reportEvery is the pace of a node's reports under cfg: on a worker, half
// the time the LB grants short iterations ahead (FPT_LB_AHEAD), at least
// ReportEvery; ServerReportEvery on a server; or every iteration under a
// retry policy, where a worker's pull of an iteration may wait for the
// LB's Done past it, which needs every worker's report of it at once.
// A worker's report earns its grant, so a pace slower than half the
// lookahead would only have Pace send at the horizon's half instead.
func reportEvery(cfg config.Config) time.Duration {
	switch {
	case cfg.Retries():
		return 0
	case cfg.Role == node.Server:
		return ServerReportEvery
	}
	return max(ReportEvery, cfg.LBAhead/2)
}

// report is one report's iteration begun and what goes with it.
type report struct {
	iter, modelBytes uint64
	version          uint32
}

// Start begins measuring; call it once the node has started.
func (a *Agent) Start() {
	a.wg.Add(1)
	go a.sample(a.node.SumsLocally())
}

// Close stops measuring. It is idempotent.
func (a *Agent) Close() {
	a.stopOnce.Do(func() {
		close(a.quit)
		a.mu.Lock()
		if a.flush != nil {
			a.flush.Stop()
		}
		a.mu.Unlock()
	})
	a.wg.Wait()
}

// sample reads the van's counters every Tick. With local aggregation
// (byHost) the LB balances by host, and what a node exchanges with nodes
// of its own host (a host sum to an aggregator there) does not cross the
// host's link: only the bytes to and from other hosts count.
func (a *Agent) sample(byHost bool) {
	defer a.wg.Done()
	t := time.NewTicker(Tick)
	defer t.Stop()
	for {
		select {
		case <-a.quit:
			return
		case <-a.node.Done():
			return
		case <-a.node.Closed():
			// Left the cluster: whichever path closed the member, its
			// agent has nothing more to measure.
			return
		case now := <-t.C:
			var sent, recv uint64
			self := localagg.HostName(a.node.HostOf(a.node.Self().ID))
			for _, p := range a.node.Van().Stats() {
				if byHost && localagg.HostName(a.node.HostOf(p.Peer)) == self {
					continue
				}
				sent += p.SentBytes
				recv += p.ReceivedBytes
			}
			a.mu.Lock()
			a.meter.Add(now, sent, recv)
			a.mu.Unlock()
		}
	}
}

// IterationBegan tells the agent that the node saw iteration iter begin (a
// worker pushed it, an aggregator received a push of it; under a retry
// policy, a worker has every sum of iteration iter−1); the first time, it
// reports what the node measured during iteration iter−1, unless the
// pace skips that report (Pace: iterations shorter than ReportEvery are
// reported together). modelBytes is
// the bytes one iteration pushes (0 on servers). version is the latest
// retry decision the worker applied: a newer one reports again from iter
// (after a lost worker, sums of iterations already reported change).
// Safe from any goroutine.
func (a *Agent) IterationBegan(iter, modelBytes uint64, version uint32) {
	a.began(iter, modelBytes, version, true)
}

// began is IterationBegan on a worker or a server.
func (a *Agent) began(iter, modelBytes uint64, version uint32, worker bool) {
	if iter == 0 || iter <= a.considered.Load() && version <= a.version.Load() {
		return
	}
	a.mu.Lock()
	if iter <= a.considered.Load() && version <= a.version.Load() {
		a.mu.Unlock()
		return
	}
	a.considered.Store(max(iter, a.considered.Load()))
	r := report{iter: iter, modelBytes: modelBytes, version: version}
	if !a.pace.Due(iter, version, worker, time.Now()) {
		a.skipped = &r
		a.armFlush()
		a.mu.Unlock()
		return
	}
	a.send(r)
}

// armFlush starts the timer that sends the skipped report when it falls
// due, unless it runs already. a.mu is held.
func (a *Agent) armFlush() {
	at, ok := a.pace.Pending()
	if !ok || a.flush != nil {
		return
	}
	select {
	case <-a.quit:
		return
	default:
	}
	a.flush = time.AfterFunc(time.Until(at), a.flushSkipped)
}

// flushSkipped sends the report the pace skipped last, where no later one
// went meanwhile.
func (a *Agent) flushSkipped() {
	a.mu.Lock()
	a.flush = nil
	select {
	case <-a.quit:
		a.mu.Unlock()
		return
	default:
	}
	if a.skipped == nil || !a.pace.Flush(time.Now()) {
		a.armFlush() // early, by the clock: again when due
		a.mu.Unlock()
		return
	}
	a.send(*a.skipped)
}

// send reports r: what the node measured during the iteration before
// r.iter. a.mu is held, and send releases it.
func (a *Agent) send(r report) {
	a.skipped = nil
	a.version.Store(max(r.version, a.version.Load()))
	s := lb.Sample{Node: a.node.Self().ID, Iteration: r.iter - 1, ModelBytes: r.modelBytes, Version: r.version}
	s.UpRate, s.DownRate, s.SentBytes, s.ReceivedBytes = a.meter.Take()
	a.mu.Unlock()
	body, err := s.MarshalBinary()
	if err == nil {
		// Posted, not sent: the caller is a worker's push (or a server's
		// first frame of the iteration), which should not wait for the
		// control plane; the outbox keeps the report in order with the
		// node's other control messages.
		err = a.node.PostScheduler(&control.Message{Command: control.Report, Body: body})
	}
	switch {
	case errors.Is(err, control.ErrClosed):
		// The node is leaving: its plane closed as the program's last
		// pushes went out, and nobody waits for their report.
		a.node.Logger().Debug("lb: report not sent", "iteration", s.Iteration, "err", err)
	case err != nil:
		a.node.Logger().Warn("lb: report not sent", "iteration", s.Iteration, "err", err)
	}
}

// ServerIterationBegan is IterationBegan for a server, which pushes no
// model of its own.
func (a *Agent) ServerIterationBegan(iter uint64) { a.began(iter, 0, 0, false) }

func (a *Agent) handleControl(m *control.Message) {
	if m.Command != control.Decision {
		a.node.Logger().Warn("unexpected control message", "command", m.Command, "from", m.Sender)
		return
	}
	d, err := lb.UnmarshalDirective(m.Body)
	if err != nil {
		a.node.Fail(fmt.Errorf("lbagent: directive from %s: %w", m.Sender, err))
		return
	}
	if a.apply != nil {
		if err := a.apply(d); err != nil {
			a.node.Fail(fmt.Errorf("lbagent: %w", err))
			return
		}
	}
	a.follow(d)
}

// follow sets the van's shaping and weights for a directive. Weights change
// as soon as the decision is known, not at its iteration: they only shape
// how the node's link is shared, never where a byte goes.
func (a *Agent) follow(d lb.Directive) {
	v := a.node.Van()
	a.mu.Lock()
	changed := a.shaping != d.Shaping
	a.shaping = d.Shaping
	a.pace.Follow(d)
	a.mu.Unlock()
	if changed {
		v.SetShaping(d.Shaping)
	}
	if d.Decision == nil {
		return
	}
	self := a.node.Self().ID
	for peer, w := range lb.Weights(*d.Decision, self, a.node.Servers(), a.node.Workers()) {
		v.SetWeight(peer, w)
		v.SetReceiveWeight(peer, w)
	}
}
