package scheduler

import (
	"slices"
	"time"

	"github.com/fptps/fpt/control"
	"github.com/fptps/fpt/node"
)

// lose handles the loss of node id (why says how it was noticed). Under
// FPT_ON_SERVER_LOSS=retry a lost server leaves the job instead of ending
// it: the LB issues a retry decision without it, every member hears
// NodeLeft and then the directive, and barriers stop waiting for it.
// handled is false when the loss must end the job (not a server, retry
// off, or the last server). final is set when the departure released
// the final barrier: the scheduler terminates those members.
func (s *sched) lose(bars *barriers, id node.ID, why string) (handled bool, final []node.ID) {
	info, ok := s.byID[id]
	if !s.cfg.RetryServerLoss || s.lb == nil || !ok || info.Role != node.Server {
		return false, nil
	}
	d, err := s.lb.Lose(id, why)
	if err != nil {
		s.log.Error("server lost; the job cannot go on without it", "node", info, "err", err)
		return false, nil
	}
	s.table = slices.DeleteFunc(s.table, func(n node.Info) bool { return n.ID == id })
	delete(s.byID, id)
	delete(s.lastSeen, id)
	for origin, owner := range s.byOrigin {
		if owner == id {
			delete(s.byOrigin, origin)
		}
	}
	if s.left == nil {
		s.left = make(map[node.ID]bool)
	}
	s.left[id] = true
	s.membership++
	s.log.Warn("membership change: server left; its incomplete iterations are pushed again",
		"node", info, "reason", why, "membership_version", s.membership,
		"retry_from_iteration", d.Decision.Iteration, "decision_version", d.Decision.Version,
		"servers", len(s.lb.Servers()))
	for _, n := range s.table[1:] {
		s.send(n.ID, &control.Message{Command: control.NodeLeft, Sender: node.SchedulerID, Target: id, Text: why})
	}
	s.direct(d)
	s.obs.rec.Left(s.table, d, s.lb.State())
	s.obs.Metrics.Membership(s.table, s.membership)
	s.obs.Metrics.Decision(*d.Decision, false)
	s.publish(time.Now())
	for _, r := range bars.remove(id) {
		if r.g == node.AllGroup && s.finalSeen && r.seq == s.finalSeq {
			return true, r.members
		}
		for _, m := range r.members {
			s.send(m, &control.Message{Command: control.BarrierDone, Sender: node.SchedulerID, Group: r.g, Seq: r.seq})
		}
	}
	return true, nil
}
