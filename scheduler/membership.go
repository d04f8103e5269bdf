package scheduler

import (
	"encoding/binary"
	"fmt"
	"slices"
	"time"

	"github.com/fptps/fpt/control"
	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/node"
)

// lose handles the loss of node id (why says how it was noticed). A
// server still joining leaves without consequence. Under
// FPT_ON_SERVER_LOSS=retry any other server lost once the job has started
// leaves it instead of ending it: the LB issues a retry decision without
// it, every member hears NodeLeft and then the directive, and barriers
// stop waiting for it. handled is false when the loss must end the job
// (not a server, retry off, before the start, or the last server). final
// is set when the departure released the final barrier: the scheduler
// terminates those members.
func (s *sched) lose(bars *barriers, id node.ID, why string) (handled bool, final []node.ID) {
	info, ok := s.byID[id]
	if s.lb == nil || !ok || info.Role != node.Server {
		return false, nil
	}
	joining := s.joining[id]
	if !joining && (!s.cfg.RetryServerLoss || !s.running) {
		return false, nil
	}
	var d lb.Directive
	if !joining {
		var err error
		if d, err = s.lb.Lose(id, why); err != nil {
			s.log.Error("server lost; the job cannot go on without it", "node", info, "err", err)
			return false, nil
		}
	}
	delete(s.joining, id)
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
	for _, n := range s.table[1:] {
		s.send(n.ID, &control.Message{Command: control.NodeLeft, Sender: node.SchedulerID, Target: id, Text: why})
	}
	if joining {
		// It had no share yet: nothing to push again.
		s.log.Warn("joining server lost before it had a share; the job goes on without it", "node", info, "reason", why)
		return true, nil
	}
	s.membership++
	s.log.Warn("membership change: server left; its incomplete iterations are pushed again",
		"node", info, "reason", why, "membership_version", s.membership,
		"retry_from_iteration", d.Decision.Iteration, "decision_version", d.Decision.Version,
		"servers", len(s.lb.Servers()))
	s.direct(d)
	s.obs.rec.Changed(s.table, d, s.lb.State())
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

// admit handles an AddNode after the start. A server that is not a member
// joins the running job when the LB's grants run (FPT_LB on, or
// FPT_ON_SERVER_LOSS=retry): it gets the next server id, which no node of
// the job had before, and a node table marked FlagJoin with the barrier
// numbers it starts at. Anything else is refused: a member's own AddNode
// is ignored (it learns nothing from a reply), one naming a member's
// address is dropped (a refusal would reach that member), and other nodes
// are told why.
func (s *sched) admit(bars *barriers, m *control.Message) {
	if _, member := s.byOrigin[m.Origin]; member {
		// A confused member, which learns nothing from a reply naming
		// another address.
		s.log.Warn("registration refused: the cluster has already started", "from", m.Sender)
		return
	}
	if len(m.Nodes) != 1 {
		s.reject.Reject("register", "nodes", len(m.Nodes))
		return
	}
	info := m.Nodes[0]
	for _, n := range s.table {
		if n.Host == info.Host && n.ControlPort == info.ControlPort {
			s.reject.Reject("register", "node", info, "err", "a member's address")
			return
		}
	}
	if info.Role != node.Server || s.lb == nil {
		why := "registration refused: the cluster has already started (only a server joins a running job, with FPT_LB=on or FPT_ON_SERVER_LOSS=retry)"
		s.log.Warn(why, "node", info)
		_ = s.plane.Send(info.ControlEndpoint(), &control.Message{Command: control.NodeFailed, Sender: node.SchedulerID, Text: why})
		return
	}
	if s.servers == 0 {
		s.servers = s.cfg.NumServers
	}
	info.ID = node.ServerID(s.servers)
	s.servers++
	s.table = append(s.table, info)
	s.byID[info.ID] = info
	s.lastSeen[info.ID] = time.Now()
	s.byOrigin[m.Origin] = info.ID
	if s.joining == nil {
		s.joining = make(map[node.ID]bool)
	}
	s.joining[info.ID] = true
	seqs := bars.nextSeqs()
	body := make([]byte, 0, 8*len(seqs))
	for _, n := range seqs {
		body = binary.LittleEndian.AppendUint64(body, n)
	}
	s.log.Info("server joining the running job", "node", info)
	s.send(info.ID, &control.Message{Command: control.NodeTable, Flags: control.FlagJoin, Recipient: info.ID, Nodes: s.table, Body: body})
}

// joined follows a joining server: once it has its table (Seq 0) the
// members dial it; once it is connected to every member (Seq 1) it is a
// member, and the LB gives it a share (at once with the LB off, after a
// probe of its links with the LB on).
func (s *sched) joined(bars *barriers, m *control.Message) {
	id := m.Sender
	if !s.joining[id] {
		s.reject.Reject("joined", "from", id)
		return
	}
	info := s.byID[id]
	switch m.Seq {
	case 0:
		for _, n := range s.table[1:] {
			if n.ID != id {
				s.send(n.ID, &control.Message{Command: control.NodeJoined, Sender: node.SchedulerID, Nodes: []node.Info{info}})
			}
		}
	case 1:
		delete(s.joining, id)
		bars.add(id)
		d, ok, err := s.lb.Join(id, time.Now())
		if err != nil {
			s.log.Error("joining server not given a share", "node", info, "err", err)
			return
		}
		s.membership++
		share := "after the next probe"
		if ok {
			share = fmt.Sprintf("from iteration %d", d.Decision.Iteration)
		}
		s.log.Warn("membership change: server joined", "node", info, "membership_version", s.membership,
			"servers", len(s.lb.Servers()), "share", share)
		if ok {
			s.direct(d)
			s.obs.Metrics.Decision(*d.Decision, false)
		}
		s.obs.rec.Changed(s.table, d, s.lb.State())
		s.obs.Metrics.Membership(s.table, s.membership)
		s.publish(time.Now())
	default:
		s.reject.Reject("joined", "from", id, "seq", m.Seq)
	}
}

// startBarrier is the number of the start barrier over all nodes (the
// second of a node's start, after the table barrier): once it passes,
// every server and worker has started.
const startBarrier = 1
