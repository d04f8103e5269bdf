package scheduler

import (
	"encoding/binary"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/control"
	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/node"
)

// lose handles the loss of node id (why says how it was noticed). A
// server still joining leaves without consequence. Once the job has
// started, a server lost under FPT_ON_SERVER_LOSS=retry, or a worker lost
// under FPT_ON_WORKER_LOSS=continue, leaves it instead of ending it: the
// LB issues a retry decision without it, every member hears NodeLeft and
// then the directive, and barriers and the stall watch stop waiting for
// it. handled is false when the loss must end the job (another role, the
// policy fail, before the start, or the last server or worker). final is
// set when the departure released the final barrier: the scheduler
// terminates those members.
func (s *sched) lose(bars *barriers, stalls *stallWatch, id node.ID, why string) (handled bool, final []node.ID) {
	info, ok := s.byID[id]
	if s.lb == nil || !ok {
		return false, nil
	}
	_, joining := s.joining[id]
	switch info.Role {
	case node.Server:
		if !joining && (!s.cfg.RetryServerLoss || !s.running) {
			return false, nil
		}
	case node.Worker:
		// Until every worker has the init round's values, losing worker
		// 0 would lose them: a worker lost that early ends the job.
		if s.cfg.WorkerLoss != config.WorkerLossContinue || !s.running || s.lb.Done() == 0 {
			return false, nil
		}
	default:
		return false, nil
	}
	var d lb.Directive
	if !joining {
		var err error
		if d, err = s.lb.Lose(id, why); err != nil {
			s.log.Error("node lost; the job cannot go on without it", "node", info, "err", err)
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
	stalls.remove(id)
	for _, n := range s.table[1:] {
		s.send(n.ID, &control.Message{Command: control.NodeLeft, Sender: node.SchedulerID, Target: id, Text: why})
	}
	if joining {
		// It had no share yet: nothing to push again.
		s.log.Warn("joining server lost before it had a share; the job goes on without it", "node", info, "reason", why)
		return true, s.leaveBarriers(bars, id)
	}
	// A joining server may have waited for this member's connection only.
	for j := range s.joining {
		s.admitIfReady(j)
	}
	s.membership++
	msg := msgServerLeft
	if info.Role == node.Worker {
		msg = msgWorkerLeft
	}
	s.log.Warn(msg,
		"node", info, "reason", why, "membership_version", s.membership,
		"retry_from_iteration", d.Decision.Iteration, "decision_version", d.Decision.Version,
		"servers", len(s.lb.Servers()), "workers", len(s.lb.Workers()))
	s.direct(d)
	s.obs.rec.Changed(s.table, d, s.lb.State())
	s.obs.Metrics.Membership(s.table, s.membership)
	s.obs.Metrics.Decision(*d.Decision, false)
	s.publish(time.Now())
	return true, s.leaveBarriers(bars, id)
}

// leaveBarriers takes id out of the barriers and releases those it was
// the last one missing from; it returns the members to terminate when
// that was the final barrier.
func (s *sched) leaveBarriers(bars *barriers, id node.ID) (final []node.ID) {
	for _, r := range bars.remove(id) {
		if r.g == node.AllGroup && s.finalSeen && r.seq == s.finalSeq {
			return r.members
		}
		for _, m := range r.members {
			s.send(m, &control.Message{Command: control.BarrierDone, Sender: node.SchedulerID, Group: r.g, Seq: r.seq})
		}
	}
	return nil
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
	info.ID = node.ServerID(s.servers)
	s.servers++
	s.table = append(s.table, info)
	s.byID[info.ID] = info
	s.lastSeen[info.ID] = time.Now()
	s.byOrigin[m.Origin] = info.ID
	if s.joining == nil {
		s.joining = make(map[node.ID]*joining)
	}
	s.joining[info.ID] = &joining{dialled: make(map[node.ID]bool)}
	seqs := bars.nextSeqs()
	body := make([]byte, 0, 8*len(seqs))
	for _, n := range seqs {
		body = binary.LittleEndian.AppendUint64(body, n)
	}
	s.log.Info("server joining the running job", "node", info)
	s.send(info.ID, &control.Message{Command: control.NodeTable, Flags: control.FlagJoin, Recipient: info.ID, Nodes: s.table, Body: body})
}

// joining is a server admitted to the running job but not yet given a
// share: it waits for its connections.
type joining struct {
	connected bool             // every member's connection reached it (Joined, Seq 1)
	dialled   map[node.ID]bool // members whose connection to it is ready (Joined, Seq 2)
}

// joined follows a joining server: once it has its table (Seq 0) the
// members dial it; once it has every member's connection (Seq 1) and
// every member's connection to it is ready (Seq 2 from each: the joiner
// can see a connection a moment before the member that dialled may send
// on it), it is a member, and the LB gives it a share.
func (s *sched) joined(bars *barriers, m *control.Message) {
	id := m.Sender
	if m.Seq == 2 {
		id = m.Target
	}
	j := s.joining[id]
	if j == nil || (m.Seq == 2) == (m.Sender == id) {
		s.reject.Reject("joined", "from", m.Sender, "seq", m.Seq, "target", m.Target)
		return
	}
	switch m.Seq {
	case 0:
		info := s.byID[id]
		for _, n := range s.table[1:] {
			if n.ID != id {
				s.send(n.ID, &control.Message{Command: control.NodeJoined, Sender: node.SchedulerID, Nodes: []node.Info{info}})
			}
		}
	case 1:
		// Its start is over: its barriers (the final one) may follow at
		// once on this route, so it counts in them from now on, before
		// the LB gives it a share.
		j.connected = true
		bars.add(id)
		s.admitIfReady(id)
	case 2:
		j.dialled[m.Sender] = true
		s.admitIfReady(id)
	default:
		s.reject.Reject("joined", "from", id, "seq", m.Seq)
	}
}

// admitIfReady makes joining server id a member, and has the LB give it
// a share, once it has every member's connection and every member can
// send on it (the servers still joining aside: of two, the later one is
// dialled by the earlier, which then reports).
func (s *sched) admitIfReady(id node.ID) {
	j := s.joining[id]
	if j == nil || !j.connected {
		return
	}
	for _, n := range s.table[1:] {
		if _, other := s.joining[n.ID]; !other && !j.dialled[n.ID] {
			return
		}
	}
	info := s.byID[id]
	delete(s.joining, id)
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
	s.log.Warn(msgServerJoined, "node", info, "membership_version", s.membership,
		"servers", len(s.lb.Servers()), "share", share)
	if ok {
		s.direct(d)
		s.obs.Metrics.Decision(*d.Decision, false)
	}
	s.obs.rec.Changed(s.table, d, s.lb.State())
	s.obs.Metrics.Membership(s.table, s.membership)
	s.publish(time.Now())
}

// startBarrier is the number of the start barrier over all nodes (the
// second of a node's start, after the table barrier): once it passes,
// every server and worker has started.
const startBarrier = 1

// The scheduler's log messages for membership changes, which
// ParseMembershipLine reads back.
const (
	msgServerLeft   = "membership change: server left; its incomplete iterations are pushed again"
	msgServerJoined = "membership change: server joined"
	msgWorkerLeft   = "membership change: worker left; the iterations not every worker has the sums of are summed again over the workers left"
)

// Membership is a membership change as the scheduler logs it.
type Membership struct {
	// Joined: a server joined the job; else a server or worker left it.
	Joined bool
	// Node is the node as logged, "server2(12)@10.0.0.3:9100".
	Node string
	// RetryFrom is, for a node that left, the iteration the workers
	// push again from.
	RetryFrom uint64
}

// membershipLine matches the scheduler's line for a membership change
// (log/slog's text format).
var membershipLine = regexp.MustCompile(`msg="(` + regexp.QuoteMeta(msgServerLeft) + `|` + regexp.QuoteMeta(msgWorkerLeft) + `|` + regexp.QuoteMeta(msgServerJoined) +
	`)".*? node=(\S+)(?:.*? retry_from_iteration=(\d+))?`)

// ParseMembershipLine reads a membership change from one line of the
// scheduler's log (stderr, log/slog's text format); ok is false for any
// other line. Programs that watch a job (fpt bench) use it, as
// ParseDecisionLine for the LB's decisions.
func ParseMembershipLine(line string) (m Membership, ok bool) {
	sub := membershipLine.FindStringSubmatch(line)
	if sub == nil {
		return Membership{}, false
	}
	m = Membership{Joined: sub[1] == msgServerJoined, Node: sub[2]}
	if !m.Joined {
		from, err := strconv.ParseUint(sub[3], 10, 64)
		if err != nil {
			return Membership{}, false
		}
		m.RetryFrom = from
	}
	return m, true
}
