package lb

import (
	"fmt"
	"slices"
	"time"

	"github.com/fptps/fpt/node"
)

// One host. When every server and worker of the job runs on one host and
// its workers sum there (local aggregation), the host's sum of a
// partition is already the job's: sent to a server it only crosses
// loopback twice, and the servers take the cores the workers need. The
// split that puts every partition on the group's leader moves no byte
// through a socket at all. There is no link to measure, so no probe: the
// Balancer times the even split over the servers, issues the leader's
// split, and keeps it only while the guard finds it no slower (the leader
// alone sums every member's contribution, which many members and large
// tensors on few cores can make the slower of the two).

// shortDriftRun: on one host, iterations shorter than MinIteration count
// as drifted only after this many times DriftIterations in a row, and
// the leader's split is timed (its drift baseline, which the guard
// compares with the even split's) over this many times
// baselineIterations. Three millisecond iterations in a row take 1.5
// times the baseline from the scheduling of shared cores alone (or from
// the job's start: the segment's first pages, the workers' first steps),
// and each false drift or guard costs the even split's retiming, or
// its back-off: iterations slower than the leader's.
const shortDriftRun = 4

// hostLeader returns the leader of the job's one local group: every
// server and worker placed on one host, whose workers sum there (none
// alone, without shared memory; a single worker leads itself, summing
// its own pushes). ok is false otherwise.
func (b *Balancer) hostLeader() (lead node.ID, ok bool) {
	h := b.cfg.Hosts
	if h == nil || !h.Local {
		return 0, false
	}
	host := -1
	for _, id := range b.all {
		x, placed := h.Of[id]
		if !placed || h.Alone[id] || host >= 0 && x != host {
			return 0, false
		}
		host = x
	}
	// The group's leader is its lowest worker id (localagg.Groups).
	return slices.Min(b.cfg.Workers), true
}

// defaultOnHost is a step in Default on one host: once the even split
// over the servers has evenIterations timed iterations, where a probe
// would start (or where the even split's time drifted up while the
// guard backed off), the leader's split instead. A decision already on
// the leader (a join kept it) is Balanced at once, unguarded: no even
// time says otherwise.
func (b *Balancer) defaultOnHost(i, prev uint64, lead node.ID, drift string, now time.Time) Directive {
	if b.onLeader(b.current, lead) {
		b.enterBalanced(i, b.current.Iteration)
		return Directive{}
	}
	why := drift
	if why != "" {
		b.even = slices.Clone(b.evenRun[max(0, len(b.evenRun)-evenIterations):])
	} else if i >= b.probeAt && !now.Before(b.probeAfter) && len(b.even) >= evenIterations {
		why = b.probeWhy
	} else {
		return Directive{}
	}
	dec, err := b.issue(i, prev, []node.ID{lead}, []float64{1})
	if err != nil { // cannot happen: the worker is a valid aggregator
		return Directive{}
	}
	b.good = *dec
	b.enterBalanced(i, dec.Iteration)
	b.backingOff, b.evenRun = false, nil
	return Directive{
		Decision: dec,
		Reason: clip(fmt.Sprintf("one host: every partition on its group's leader %s (the even split over the servers took %s; %s)",
			lead, ms(median(b.even)), why)),
	}
}

// onLeader reports whether d puts every partition on lead.
func (b *Balancer) onLeader(d Decision, lead node.ID) bool {
	return d.SplitWithin(Decision{Aggregators: []node.ID{lead}, Shares: []float64{1}}, ShareTolerance)
}

// timeAfresh is drift on the leader's split, on one host: back to the
// even split over the servers, timed afresh, and the leader again once it
// is (a probe would measure links there are none of).
func (b *Balancer) timeAfresh(i, prev uint64, why string) Directive {
	dec, err := b.issue(i, prev, b.cfg.Servers, Even(0, 0, b.cfg.Servers).Shares)
	if err != nil { // cannot happen: the servers are valid aggregators
		return Directive{}
	}
	b.good = *dec
	b.measureAfresh(i + 1)
	b.even, b.evenRun, b.backingOff = nil, nil, false // conditions changed
	b.probeAt = i + 1
	b.probeWhy = why
	return Directive{
		Decision: dec,
		Reason:   clip(why + "; the even split over the servers again, to time both afresh"),
	}
}
