package worker

import (
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fptps/fpt/cluster"
	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/localagg"
	"github.com/fptps/fpt/node"
)

// localGroups is a worker's side of its host's groups over the job: the
// group the job started with, and one re-formed, in a segment of its
// own, at each decision that changes the iterations' workers (a retry
// for a lost worker or server, a join; localagg.Regroup). Each sums the
// iterations from its decision's to the next's; every node forms the
// same groups from the same decision (localagg.GroupsOver), the
// aggregators included, so the host sums count for the right workers.
type localGroups struct {
	n       *cluster.Member
	deliver func(*frame.Header, []byte)
	agg     ownAggregator

	mu sync.Mutex
	// group is this worker's group from the latest decision on (one
	// worker, or none: it sums alone).
	group localagg.Group
	// aggs are the groups it summed in, oldest first, each from its
	// first iteration until it was dissolved. A dissolved one keeps its
	// segment mapped until the LB's Done passes its iterations (retire),
	// and its notice socket until the worker closes.
	aggs []*localAgg
}

// startLocal sets up this worker's side of its host's groups, once the
// cluster started; nil when it sums nothing locally (off). The group it
// starts in, if of several workers, is formed before it returns.
func startLocal(n *cluster.Member, deliver func(*frame.Header, []byte), agg ownAggregator) (*localGroups, error) {
	if !n.SumsLocally() {
		return nil, nil
	}
	cfg := n.Config()
	self := n.Self().ID
	if n.Joined() {
		// The decision that admits it, its first directive, places it in
		// its host's group from its first iteration (regroup), as every
		// node of the job does.
		n.Logger().Info("local aggregation: joined a running job; the decision that admits it places it in its host's group", "host", n.HostOf(self))
		return &localGroups{n: n, deliver: deliver, agg: agg}, nil
	}
	groups, err := localagg.GroupsOver(n.Workers(), n.HostOf)
	if err != nil {
		return nil, fmt.Errorf("worker: local aggregation: %w", err)
	}
	g := &localGroups{n: n, deliver: deliver, agg: agg, group: localagg.GroupOf(groups, self)}
	if len(g.group.Workers) < 2 {
		n.Logger().Info("local aggregation: alone on this host", "host", g.group.Host)
		return g, nil
	}
	l := newLocalAgg(n, g.group, localagg.Name(n.JobStamp(), g.group.Host), 0, 0, deliver, agg)
	if err := l.form(time.Now().Add(cfg.StartTimeout)); err != nil {
		l.close()
		return nil, fmt.Errorf("worker: local aggregation on host %q (FPT_LOCAL_AGGREGATION=%s; off sends every worker's push over the network): %w", g.group.Host, cfg.LocalAggregation, err)
	}
	g.aggs = append(g.aggs, l)
	l.log.Info("local aggregation", "host", g.group.Host, "group", g.group.Workers, "leader", g.group.Leader(), "segment_bytes_per_slot", l.layout.SlotBytes)
	return g, nil
}

// regroup follows the LB's directive d before the worker's core takes
// it: a decision that changes this worker's group (localagg.Regroup) ends
// the group it sums in from the decision's iteration, and forms the new
// one, which sums from there: every push cut under d goes to the new
// group, none to one its leader may have left. workersAt is the workers
// of an iteration before d (d's Workers, when it names none).
func (g *localGroups) regroup(d lb.Directive, workersAt func(uint64) []node.ID) {
	if g == nil || d.Decision == nil {
		return
	}
	from, ws := d.Decision.Iteration, d.Decision.Workers
	if ws == nil {
		if !d.Retry {
			return
		}
		ws = workersAt(from)
	}
	cfg := g.n.Config()
	groups, err := localagg.GroupsOver(ws, g.n.HostOf)
	if err != nil {
		g.n.Fail(fmt.Errorf("worker: local aggregation: groups of %v from iteration %d: %w", ws, from, err))
		return
	}
	self := g.n.Self().ID
	g.mu.Lock()
	defer g.mu.Unlock()
	ch := localagg.Regroup(g.group, localagg.GroupOf(groups, self), d.Retry)
	if !ch.Dissolve && !ch.Form && !d.Retry {
		if len(g.group.Workers) == 0 && len(ch.New.Workers) == 1 {
			// A joiner, with no other worker on its host.
			g.group = ch.New
			g.n.Logger().Info("local aggregation: alone on this host", "host", ch.New.Host, "from_iteration", from)
		}
		return
	}
	g.group = ch.New
	for _, l := range g.aggs {
		l.dissolve(from)
	}
	if !ch.Form {
		if len(ch.New.Workers) > 0 {
			g.n.Logger().Info("local aggregation: alone on this host from the decision's iteration on", "host", ch.New.Host, "from_iteration", from)
		}
		return
	}
	name := localagg.Name(g.n.JobStamp(), ch.New.Host) + "-v" + strconv.FormatUint(uint64(d.Decision.Version), 10)
	l := newLocalAgg(g.n, ch.New, name, from, d.Decision.Version, g.deliver, g.agg)
	l.forming = true
	g.aggs = append(g.aggs, l)
	l.log.Info("local aggregation: group re-formed", "host", ch.New.Host, "group", ch.New.Workers, "leader", ch.New.Leader(), "from_iteration", from, "version", d.Decision.Version)
	deadline := time.Now().Add(cfg.StartTimeout)
	go func() {
		err := l.form(deadline)
		if err == nil {
			err = l.formed()
		}
		if err == nil {
			return
		}
		abandoned := l.abandoned()
		l.close()
		if !abandoned {
			l.fail(fmt.Errorf("worker: local aggregation: re-forming the group %v of host %q from iteration %d: %w", ch.New.Workers, ch.New.Host, from, err))
		}
	}()
}

// localStart holds the LB's directives that come before the worker's
// side of its host's groups is set up (startLocal), for it to follow them
// then, in order: directives may come as soon as the node started, and a
// joiner's first one, the decision that admits it, is the one that places
// it in its host's group. No push is intercepted before: the program has
// no Worker yet.
type localStart struct {
	mu    sync.Mutex
	set   bool
	early []lb.Directive
}

// follow has p's groups follow d (regroup), or keeps d until they are set.
func (s *localStart) follow(p *atomic.Pointer[localGroups], d lb.Directive, workersAt func(uint64) []node.ID) {
	s.mu.Lock()
	if !s.set {
		s.early = append(s.early, d)
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	p.Load().follow(d, workersAt)
}

// started sets p to g (nil: no local aggregation) and has g follow the
// directives kept meanwhile.
func (s *localStart) started(p *atomic.Pointer[localGroups], g *localGroups, workersAt func(uint64) []node.ID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p.Store(g)
	for _, d := range s.early {
		g.follow(d, workersAt)
	}
	s.early, s.set = nil, true
}

// follow has the groups follow LB decision d: re-formed where it changes
// them, and those it leaves behind retired once its Done passed them.
func (g *localGroups) follow(d lb.Directive, workersAt func(uint64) []node.ID) {
	g.regroup(d, workersAt)
	g.retire(d.Done)
}

// retire unmaps the segments of the groups dissolved before done, the
// LB's Done (localAgg.due): every worker has the sums of their
// iterations, so a worker that lived through many retries or joins holds
// only the segments it may still use. Each is unmapped on a goroutine of
// its own once the calls using it are out (localAgg.unmap); a retry
// never touches them again, since it re-cuts from an iteration some
// worker lacks.
func (g *localGroups) retire(done uint64) {
	if g == nil || done == 0 {
		return
	}
	g.mu.Lock()
	var due []*localAgg
	for _, l := range g.aggs {
		if l.due(done) {
			due = append(due, l)
		}
	}
	g.mu.Unlock()
	for _, l := range due {
		go l.unmap()
	}
}

// mapped counts the groups' segments this worker has mapped.
func (g *localGroups) mapped() int {
	n := 0
	g.each(func(l *localAgg) {
		if l.mapped() {
			n++
		}
	})
	return n
}

// at is the group that sums iteration iter; nil where this worker sums
// it alone.
func (g *localGroups) at(iter uint64) *localAgg {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i := len(g.aggs) - 1; i >= 0; i-- {
		if l := g.aggs[i]; l.from <= iter {
			l.mu.Lock()
			sums := iter < l.until
			l.mu.Unlock()
			if sums {
				return l
			}
			return nil
		}
	}
	return nil
}

// intercept takes the pushes of sends that a group sums (localAgg's
// intercept) and returns the frames left to send.
func (g *localGroups) intercept(sends []frame.Message) ([]frame.Message, error) {
	if g == nil {
		return sends, nil
	}
	rest := sends[:0:0]
	for i := range sends {
		l := g.at(sends[i].Header.Iteration)
		if l == nil {
			rest = append(rest, sends[i])
			continue
		}
		r, err := l.intercept(sends[i : i+1])
		if err != nil {
			return nil, err
		}
		rest = append(rest, r...)
	}
	return rest, nil
}

// publish hands the result h, data, to the group of its iteration, where
// this worker leads one.
func (g *localGroups) publish(h *frame.Header, data []byte) error {
	if g == nil {
		return nil
	}
	l := g.at(h.Iteration)
	if l == nil || h.Aux < l.version {
		// Of a cut before the group's decision: a sum of a group this
		// worker was a member of, handed to it, or one the retry that
		// formed the group re-sums.
		return nil
	}
	return l.publish(h, data)
}

// stop wakes every wait on a group's chunks, and has later calls use
// none, without waiting for the calls under way (close does).
func (g *localGroups) stop() {
	g.each((*localAgg).stop)
}

// close closes every group's side.
func (g *localGroups) close() { g.each((*localAgg).close) }

// each calls f on every group's side, outside the lock.
func (g *localGroups) each(f func(*localAgg)) {
	if g == nil {
		return
	}
	g.mu.Lock()
	aggs := g.aggs
	g.mu.Unlock()
	for _, l := range aggs {
		f(l)
	}
}
