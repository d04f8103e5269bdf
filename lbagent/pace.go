package lbagent

import (
	"time"

	"github.com/fptps/fpt/lb"
)

// ReportEvery is the least time between two reports of a worker whose
// iterations are shorter, outside a probe and away from its horizon; its
// pace is half of FPT_LB_AHEAD (50 ms by default), never less than this.
// Its rates change no faster than the meter's Tick, and the scheduler
// needs its progress only to grant horizons, which cover FPT_LB_AHEAD of
// iterations: a report per iteration of a millisecond would put a control
// message to the scheduler, and a grant back to every worker, beside
// every step's frames.
const ReportEvery = 10 * time.Millisecond

// ServerReportEvery is ReportEvery for a server. The LB needs a server's
// reports only in a probe (its rates in the measuring window, and its
// progress to end the window), when every iteration is reported anyway:
// the workers' reports alone mark iterations done and earn the grants.
// Outside a probe a server's report carries rates the LB does not use and
// costs a control message on every node it crosses, beside the step's
// frames; once per meter Window keeps the scheduler's view of its rates
// and progress as fresh as the rates themselves.
const ServerReportEvery = Window

// Pace decides which iterations a node reports to the LB. A node reports
// iteration i−1 as it begins iteration i (Agent.IterationBegan); Pace
// skips that report while the node reported less than ReportEvery ago,
// unless
//   - it is the node's first, or a retry's version is newer than the last
//     report's (sums already reported changed);
//   - a probe is on (shaping off): the LB measures its window's
//     iterations, and must hear from every node within it;
//   - the worker is past half the lookahead of its latest grant: it must
//     not reach its horizon before the scheduler has heard of its
//     progress (with FPT_LB_AHEAD=0, two iterations, it reports every
//     iteration).
//
// A skipped report is not lost: the next one reports a later iteration,
// which tells the LB of every one before it (lb.Balancer.Observe), with
// the peak rates of the windows since the last report (Meter.Take); and
// where no next one comes in time (the node waits, or its job ends), the
// skipped one is sent once it falls due (Pending, Flush): the LB's Done
// and the status page must not stop at an iteration the node finished.
// Pace is pure: the caller passes the clock. It is not safe for
// concurrent use.
type Pace struct {
	every    time.Duration
	last     time.Time // the latest report
	reported bool
	version  uint32 // the latest report's retry version
	// The latest grant received: one past the last iteration done, and
	// the horizon. Only a worker's pace heeds it: a server receives a
	// directive only when its decision or shaping changes
	// (lb.Directive.ForServers), so its grant is out of date.
	done, horizon uint64
	probing       bool
	// skipped: a report was skipped since the latest one sent.
	skipped bool
}

// NewPace returns a Pace that reports at most once per every outside
// the cases above (every ≤ 0: every iteration).
func NewPace(every time.Duration) *Pace { return &Pace{every: every} }

// Due reports whether the report made as iteration iter begins on a
// worker (or a server), under retry version version, at now, should be
// sent; if so the Pace counts it as sent.
func (p *Pace) Due(iter uint64, version uint32, worker bool, now time.Time) bool {
	due := !p.reported || version > p.version || p.probing || p.every <= 0 ||
		now.Sub(p.last) >= p.every || now.Before(p.last) ||
		worker && iter >= p.done+(p.horizon-p.done)/2
	if due {
		p.last, p.reported, p.skipped = now, true, false
		p.version = max(p.version, version)
	} else {
		p.skipped = true
	}
	return due
}

// Pending reports whether a report was skipped since the latest one sent,
// and when it falls due.
func (p *Pace) Pending() (at time.Time, ok bool) {
	return p.last.Add(p.every), p.skipped
}

// Flush reports whether the report skipped last should be sent at now (it
// is pending and due); if so the Pace counts it as sent.
func (p *Pace) Flush(now time.Time) bool {
	at, ok := p.Pending()
	if !ok || now.Before(at) {
		return false
	}
	p.last, p.skipped = now, false
	return true
}

// Follow takes a directive the node received: its grant, and whether a
// probe is on.
func (p *Pace) Follow(d lb.Directive) {
	p.probing = !d.Shaping
	p.done = max(p.done, d.Done)
	p.horizon = max(p.horizon, d.Horizon, p.done)
}
