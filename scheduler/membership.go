package scheduler

import (
	"encoding/binary"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fptps/fpt/classic"
	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/control"
	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/localagg"
	"github.com/fptps/fpt/node"
)

// lose handles the loss of node id (why says how it was noticed). A
// server or worker still joining leaves without consequence. Once the
// job has started, a server lost under FPT_ON_SERVER_LOSS=retry, or a
// worker lost under FPT_ON_WORKER_LOSS=continue or wait, leaves it
// instead of ending it: the LB issues a retry decision without it, every
// member hears NodeLeft and then the directive, and barriers and the
// stall watch stop waiting for it. Under wait the grants are then held
// until a worker joins (waitForWorker). handled is false when the loss
// must end the job (another role, the policy fail, before the start, or
// the last server or worker). final is set when the departure released
// the final barrier: the scheduler terminates those members.
func (c *core) lose(id node.ID, why string) (handled bool, final []node.ID) {
	info, ok := c.byID[id]
	if c.lb == nil || !ok {
		return false, nil
	}
	_, joining := c.joining[id]
	switch {
	case c.leaving[id]:
		// Lost while it handed its keys over: the LB and the layout
		// went on without it when it asked to leave. It is told, in case
		// it is alive (a peer's report), as a stalled worker is.
		c.log.Warn("server lost while leaving the job; the classic keys it had not handed over are lost", "node", info, "reason", why)
		c.send(id, &control.Message{Command: control.NodeFailed, Sender: node.SchedulerID, Target: id, Text: why})
		return true, c.depart(id, why, false)
	case info.Role == node.Server:
		if !joining && (!c.cfg.RetryServerLoss || !c.running) {
			return false, nil
		}
	case info.Role == node.Worker:
		// Until every worker has the init round's values, losing worker
		// 0 would lose them: a worker lost that early ends the job.
		if !joining && (!c.cfg.WorkersMayLeave() || !c.running || c.lb.Done() == 0) {
			return false, nil
		}
	default:
		return false, nil
	}
	var d lb.Directive
	if !joining {
		var err error
		if d, err = c.lb.Lose(id, why); err != nil {
			c.log.Error("node lost; the job cannot go on without it", "node", info, "err", err)
			return false, nil
		}
	}
	c.drop(id, why, false)
	if joining {
		// The LB did not count it yet: nothing to push again.
		c.log.Warn("joining "+info.Role.String()+" lost before the LB counted it; the job goes on without it", "node", info, "reason", why)
		return true, c.leaveBarriers(id)
	}
	if info.Role == node.Server {
		// Before a joiner is admitted below: its layout must not name
		// the lost server.
		c.setLayout(c.layout.Without(id), "server left")
	}
	c.admitJoiners()
	c.changed(info, d, why)
	if info.Role == node.Worker && c.cfg.WorkerLoss == config.WorkerLossWait {
		c.waitForWorker(info, d.Horizon, c.now)
	}
	return true, c.leaveBarriers(id)
}

// changed counts, logs and publishes the membership change the LB's
// directive d made for info's departure, and sends d.
func (c *core) changed(info node.Info, d lb.Directive, why string) {
	c.membership++
	msg := msgServerLeft
	if info.Role == node.Worker {
		msg = msgWorkerLeft
	}
	c.log.Warn(msg,
		"node", info, "reason", why, "membership_version", c.membership,
		"retry_from_iteration", d.Decision.Iteration, "decision_version", d.Decision.Version,
		"servers", len(c.lb.Servers()), "workers", len(c.lb.Workers()))
	c.direct(d)
	c.obs.rec.Changed(c.table, d, c.lb.State())
	c.obs.Metrics.Membership(c.table, c.membership)
	c.obs.Metrics.Decision(*d.Decision, false)
	c.publish()
}

// admitJoiners admits the joining nodes that were waiting for a member's
// connection only, after that member left.
func (c *core) admitJoiners() {
	for j := range c.joining {
		c.admitIfReady(j)
	}
}

// depart ends the membership of a server the LB's decisions no longer
// count (it left them when it asked to leave): it is dropped (drop),
// the joiners that waited for it only are admitted, the change is
// published, and it leaves the barriers, whose releases are returned.
func (c *core) depart(id node.ID, why string, graceful bool) (final []node.ID) {
	c.drop(id, why, graceful)
	c.admitJoiners()
	c.obs.rec.Changed(c.table, lb.Directive{}, c.lb.State())
	c.obs.Metrics.Membership(c.table, c.membership)
	c.publish()
	return c.leaveBarriers(id)
}

// drop takes id out of the node table and the stall watch; every member
// hears NodeLeft. A server that left in order (graceful) hears it too,
// and its members know that every frame it sent arrives before its
// connections end. The caller takes it out of the barriers last
// (leaveBarriers), once the members heard what its departure changes.
func (c *core) drop(id node.ID, why string, graceful bool) {
	var flags uint8
	if graceful {
		flags = control.FlagGraceful
		c.send(id, &control.Message{Command: control.NodeLeft, Flags: flags, Sender: node.SchedulerID, Target: id, Text: why})
	}
	delete(c.joining, id)
	delete(c.leaving, id)
	delete(c.leaveLater, id)
	c.table = slices.DeleteFunc(c.table, func(n node.Info) bool { return n.ID == id })
	delete(c.byID, id)
	delete(c.lastSeen, id)
	for origin, owner := range c.byOrigin {
		if owner == id {
			delete(c.byOrigin, origin)
		}
	}
	if c.left == nil {
		c.left = make(map[node.ID]bool)
	}
	c.left[id] = true
	c.stalls.remove(id)
	for _, n := range c.table[1:] {
		c.send(n.ID, &control.Message{Command: control.NodeLeft, Flags: flags, Sender: node.SchedulerID, Target: id, Text: why})
	}
}

// leave handles a server's Leave. Asked to (Seq 0), the scheduler takes
// it out of the LB's decisions, as a loss would (its incomplete
// iterations are pushed again to the others), and out of the classic
// layout, which has it hand its keys over; it stays a member meanwhile.
// Ready (Seq 1: its keys are handed over, every worker's requests to it
// answered), it leaves the job: every member and the server itself hear
// NodeLeft with FlagGraceful. A server may leave when it could be lost
// (FPT_ON_SERVER_LOSS=retry, the job running, another server remains);
// else it is told why not, with NodeFailed, which ends it. While a
// worker's join is ahead, the LB can re-cut no iteration: the leave
// waits until it is not (leaveDeferred).
func (c *core) leave(m *control.Message) (final []node.ID) {
	id := m.Sender
	info := c.byID[id]
	_, joining := c.joining[id]
	if m.Seq == 1 {
		if !c.leaving[id] {
			c.reject.Reject("leave", "from", id, "seq", m.Seq, "err", "not leaving")
			return nil
		}
		c.log.Warn(msgServerLeftInOrder, "node", info, "servers", len(c.lb.Servers()))
		return c.depart(id, "left the job in order", true)
	}
	var refused string
	switch {
	case m.Seq != 0 || info.Role != node.Server || c.leaving[id] || c.leaveLater[id]:
		c.reject.Reject("leave", "from", id, "seq", m.Seq)
		return nil
	case c.lb == nil || !c.cfg.RetryServerLoss:
		refused = "a server may leave a running job only with FPT_ON_SERVER_LOSS=retry"
	case !c.running || joining:
		refused = "a server may leave only once the job has started and counts it"
	}
	var d lb.Directive
	if refused == "" {
		var err error
		if d, err = c.lb.Lose(id, "leaving the job"); err != nil && len(c.lb.JoinsAhead()) > 0 && len(c.lb.Servers()) > 1 {
			c.log.Info("server's leave waits for a worker's join to take effect", "node", info, "reason", err)
			if c.leaveLater == nil {
				c.leaveLater = make(map[node.ID]bool)
			}
			c.leaveLater[id] = true
			return nil
		} else if err != nil {
			refused = err.Error()
		}
	}
	if refused != "" {
		c.log.Warn("server may not leave the job", "node", info, "reason", refused)
		c.send(id, &control.Message{Command: control.NodeFailed, Sender: node.SchedulerID, Target: id, Text: "may not leave the job: " + refused})
		return nil
	}
	if c.leaving == nil {
		c.leaving = make(map[node.ID]bool)
	}
	c.leaving[id] = true
	c.stalls.remove(id)
	c.setLayout(c.layout.Without(id), "server leaving")
	c.changed(info, d, "leaving the job")
	return nil
}

// leaveDeferred takes up the leaves that waited for workers' joins, once
// none is ahead; the scheduler's loop asks at every tick.
func (c *core) leaveDeferred() {
	if len(c.leaveLater) == 0 || len(c.lb.JoinsAhead()) > 0 {
		return
	}
	for _, id := range slices.Sorted(maps.Keys(c.leaveLater)) {
		delete(c.leaveLater, id)
		c.leave(&control.Message{Command: control.Leave, Sender: id})
	}
}

// waitForWorker holds the LB's grants after worker info was lost under
// FPT_ON_WORKER_LOSS=wait: the iterations granted finish, summed over the
// workers left, and no further one starts until a worker joins
// (admitWorker), or the job fails after FPT_WORKER_WAIT_TIMEOUT
// (waitExpired). The wait runs from the first loss it covers: a worker
// lost while it runs does not extend it, and one worker joining ends it,
// however many were lost.
func (c *core) waitForWorker(info node.Info, horizon uint64, now time.Time) {
	if len(c.waitLost) == 0 {
		c.waitSince = now
	}
	c.waitLost = append(c.waitLost, info)
	c.lb.Hold(c.waitLostNames() + " lost: waiting for a worker to join")
	c.log.Warn(msgHold, "lost", c.waitLostNames(),
		"last_iteration", horizon, "timeout", c.cfg.WorkerWaitTimeout-now.Sub(c.waitSince))
}

// waitLostNames names the workers lost since the wait began.
func (c *core) waitLostNames() string {
	names := make([]string, len(c.waitLost))
	for i, info := range c.waitLost {
		names[i] = info.String()
	}
	return strings.Join(names, ", ")
}

// waitExpired ends the job, as a lost worker ends it under fail, once no
// worker has joined within FPT_WORKER_WAIT_TIMEOUT of a loss under wait;
// nil otherwise. The scheduler's loop asks at every tick, so the timeout
// is kept to within a heartbeat interval.
func (c *core) waitExpired(now time.Time) error {
	if len(c.waitLost) == 0 || now.Sub(c.waitSince) < c.cfg.WorkerWaitTimeout {
		return nil
	}
	reason := fmt.Sprintf("%s lost and no worker joined within %s (FPT_ON_WORKER_LOSS=wait, FPT_WORKER_WAIT_TIMEOUT)",
		c.waitLostNames(), c.cfg.WorkerWaitTimeout)
	return c.failed(c.waitLost[0].ID, reason)
}

// leaveBarriers takes id out of the barriers and releases those it was
// the last one missing from; it returns the members to terminate when
// that was the final barrier.
func (c *core) leaveBarriers(id node.ID) (final []node.ID) {
	for _, r := range c.bars.remove(id) {
		if r.g == node.AllGroup && c.finalSeen && r.seq == c.finalSeq {
			return r.members
		}
		for _, m := range r.members {
			c.send(m, &control.Message{Command: control.BarrierDone, Sender: node.SchedulerID, Group: r.g, Seq: r.seq})
		}
	}
	return nil
}

// admit handles an AddNode after the start. A server or a worker that is
// not a member joins the running job when the LB's grants run (FPT_LB
// on, FPT_ON_SERVER_LOSS=retry or FPT_ON_WORKER_LOSS=continue|wait): it
// gets the next id of its role, which no node of the job had before, and
// a node table marked FlagJoin with the barrier numbers it starts at.
// Anything else is refused: a member's own AddNode is ignored (it learns
// nothing from a reply), one naming a member's address is dropped (a
// refusal would reach that member), and other nodes are told why.
func (c *core) admit(m *control.Message) {
	if _, member := c.byOrigin[m.Origin]; member {
		// A confused member, which learns nothing from a reply naming
		// another address.
		c.log.Warn("registration refused: the cluster has already started", "from", m.Sender)
		return
	}
	if len(m.Nodes) != 1 {
		c.reject.Reject("register", "nodes", len(m.Nodes))
		return
	}
	info := m.Nodes[0]
	for _, n := range c.table {
		if n.Host == info.Host && n.ControlPort == info.ControlPort {
			c.reject.Reject("register", "node", info, "err", "a member's address")
			return
		}
	}
	if (info.Role != node.Server && info.Role != node.Worker) || c.lb == nil {
		why := "registration refused: the cluster has already started (a server or a worker joins a running job only with FPT_LB=on, FPT_ON_SERVER_LOSS=retry or FPT_ON_WORKER_LOSS=continue or wait)"
		c.log.Warn(why, "node", info)
		c.sendTo(info, &control.Message{Command: control.NodeFailed, Sender: node.SchedulerID, Text: why}, true)
		return
	}
	if info.Role == node.Server {
		info.ID = node.ServerID(c.servers)
		c.servers++
	} else {
		info.ID = node.WorkerID(c.workers)
		c.workers++
	}
	c.table = append(c.table, info)
	c.byID[info.ID] = info
	c.lastSeen[info.ID] = c.now
	c.byOrigin[m.Origin] = info.ID
	c.noteJoiner(info, m)
	if c.joining == nil {
		c.joining = make(map[node.ID]*joining)
	}
	c.joining[info.ID] = &joining{dialled: make(map[node.ID]bool)}
	seqs := c.bars.nextSeqs()
	body := binary.LittleEndian.AppendUint64(make([]byte, 0, 8+8*len(seqs)), c.stamp)
	for _, n := range seqs {
		body = binary.LittleEndian.AppendUint64(body, n)
	}
	body = c.layout.AppendBinary(body)
	body = localagg.AppendJoined(body, c.joinedGroups())
	c.log.Info(info.Role.String()+" joining the running job", "node", info)
	c.send(info.ID, &control.Message{Command: control.NodeTable, Flags: control.FlagJoin, Recipient: info.ID, Nodes: c.table, Body: body})
}

// joining is a server or worker admitted to the running job but not yet
// counted by the LB: it waits for its connections.
type joining struct {
	connected bool             // every member's connection reached it (Joined, Seq 1)
	dialled   map[node.ID]bool // members whose connection to it is ready (Joined, Seq 2)
}

// joined follows a joining server or worker: once it has its table (Seq
// 0) the members dial it; once it has every member's connection (Seq 1)
// and every member's connection to it is ready (Seq 2 from each: the
// joiner can see a connection a moment before the member that dialled may
// send on it), it is a member, and the LB counts it: a server gets a
// share, a worker's pushes are summed.
func (c *core) joined(m *control.Message) {
	id := m.Sender
	if m.Seq == 2 {
		id = m.Target
	}
	j := c.joining[id]
	if j == nil || (m.Seq == 2) == (m.Sender == id) {
		c.reject.Reject("joined", "from", m.Sender, "seq", m.Seq, "target", m.Target)
		return
	}
	switch m.Seq {
	case 0:
		info := c.byID[id]
		for _, n := range c.table[1:] {
			if n.ID != id {
				c.send(n.ID, &control.Message{Command: control.NodeJoined, Sender: node.SchedulerID, Nodes: []node.Info{info}, Text: c.joinerHosts[id]})
			}
		}
	case 1:
		// Its start is over: its barriers (the final one) may follow at
		// once on this route, so it counts in them from now on, before
		// the LB counts it.
		j.connected = true
		c.bars.add(id)
		c.admitIfReady(id)
	case 2:
		j.dialled[m.Sender] = true
		c.admitIfReady(id)
	default:
		c.reject.Reject("joined", "from", id, "seq", m.Seq)
	}
}

// admitIfReady makes joining node id a member, and has the LB count it,
// once it has every member's connection and every member can send on it
// (the nodes still joining aside: of two, the later one is dialled by the
// earlier, which then reports).
func (c *core) admitIfReady(id node.ID) {
	j := c.joining[id]
	if j == nil || !j.connected {
		return
	}
	for _, n := range c.table[1:] {
		if _, other := c.joining[n.ID]; !other && !j.dialled[n.ID] {
			return
		}
	}
	info := c.byID[id]
	delete(c.joining, id)
	if info.Role == node.Worker {
		c.admitWorker(info)
		return
	}
	d, ok, err := c.lb.Join(id, c.now)
	if err != nil {
		c.log.Error("joining server not given a share", "node", info, "err", err)
		return
	}
	c.membership++
	share := "after the next probe"
	if ok {
		share = fmt.Sprintf("from iteration %d", d.Decision.Iteration)
	}
	c.log.Warn(msgServerJoined, "node", info, "membership_version", c.membership,
		"servers", len(c.lb.Servers()), "share", share)
	if ok {
		c.direct(d)
		c.obs.Metrics.Decision(*d.Decision, false)
	}
	c.setLayout(c.layout.With(id), "server joined")
	c.obs.rec.Changed(c.table, d, c.lb.State())
	c.obs.Metrics.Membership(c.table, c.membership)
	c.publish()
}

// admitWorker has the LB count joining worker info (lb.Balancer.JoinWorker):
// every member, the joiner too, hears the decision that adds its pushes
// to every sum from the first iteration not granted yet. It is the first
// directive the joiner hears (direct skips a worker still joining), and
// it ends a wait under FPT_ON_WORKER_LOSS=wait.
func (c *core) admitWorker(info node.Info) {
	now := c.now
	d, err := c.lb.JoinWorker(info.ID, now)
	if err != nil {
		c.log.Error("joining worker not counted", "node", info, "err", err)
		return
	}
	c.placeJoiner(info)
	c.joinerGrouped(info)
	c.membership++
	c.log.Warn(msgWorkerJoined, "node", info, "membership_version", c.membership,
		"workers", len(c.lb.Workers()), "from_iteration", d.Decision.Iteration)
	if len(c.waitLost) > 0 {
		c.log.Info("the wait for a worker is over", "lost", c.waitLostNames(), "joined", info, "waited", now.Sub(c.waitSince).Round(time.Millisecond))
		c.waitLost = nil
	}
	c.direct(d)
	c.stalls.add(info.ID, d.Decision.Iteration, now)
	c.obs.Metrics.Decision(*d.Decision, false)
	c.obs.rec.Changed(c.table, d, c.lb.State())
	c.obs.Metrics.Membership(c.table, c.membership)
	c.publish()
}

// setLayout makes l the classic key ranges' layout and tells every
// member, those still joining too (their table had the one before).
func (c *core) setLayout(l classic.Layout, why string) {
	c.layout = l
	body := l.AppendBinary(nil)
	for _, n := range c.table[1:] {
		c.send(n.ID, &control.Message{Command: control.Layout, Sender: node.SchedulerID, Body: body})
	}
	c.log.Info("classic key ranges re-cut", "reason", why, "layout_version", l.Version, "servers", fmt.Sprint(l.Servers))
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
	msgWorkerJoined = "membership change: worker joined"
	// msgServerLeftInOrder follows msgServerLeft for a server that left
	// in order, once its keys are handed over.
	msgServerLeftInOrder = "server left the job in order: its classic keys are handed over"
)

// msgHold is the scheduler's log message for a hold under
// FPT_ON_WORKER_LOSS=wait, which ParseHoldLine reads back.
const msgHold = "no further iteration starts until a worker joins (FPT_ON_WORKER_LOSS=wait)"

// holdLine matches msgHold's line; last_iteration is the last one
// granted.
var holdLine = regexp.MustCompile(`msg="` + regexp.QuoteMeta(msgHold) + `".*? last_iteration=(\d+)`)

// ParseHoldLine reads, from one line of the scheduler's log, the last
// iteration granted before it held the job for a worker to join
// (FPT_ON_WORKER_LOSS=wait); ok is false for any other line.
func ParseHoldLine(line string) (lastIteration uint64, ok bool) {
	m := holdLine.FindStringSubmatch(line)
	if m == nil {
		return 0, false
	}
	n, err := strconv.ParseUint(m[1], 10, 64)
	return n, err == nil
}

// Membership is a membership change as the scheduler logs it.
type Membership struct {
	// Joined: the node joined the job; else it left it.
	Joined bool
	// Role is the node's: node.Server or node.Worker.
	Role node.Role
	// Node is the node as logged, "server2(12)@10.0.0.3:9100".
	Node string
	// RetryFrom is, for a node that left, the iteration the workers
	// push again from.
	RetryFrom uint64
	// From is, for a worker that joined, the first iteration whose sums
	// count its pushes.
	From uint64
}

// membershipOf is what the membership change logged as msg says.
func membershipOf(msg string) Membership {
	switch msg {
	case msgServerJoined:
		return Membership{Joined: true, Role: node.Server}
	case msgWorkerLeft:
		return Membership{Role: node.Worker}
	case msgWorkerJoined:
		return Membership{Joined: true, Role: node.Worker}
	}
	return Membership{Role: node.Server} // msgServerLeft
}

// membershipLine matches the scheduler's line for a membership change
// (log/slog's text format): the message, the node, and the iteration a
// retry starts at or a joined worker counts from.
var membershipLine = regexp.MustCompile(`msg="(` + regexp.QuoteMeta(msgServerLeft) + `|` + regexp.QuoteMeta(msgWorkerLeft) + `|` +
	regexp.QuoteMeta(msgServerJoined) + `|` + regexp.QuoteMeta(msgWorkerJoined) +
	`)".*? node=(\S+)(?:.*? retry_from_iteration=(\d+))?(?:.*? from_iteration=(\d+))?`)

// ParseMembershipLine reads a membership change from one line of the
// scheduler's log (stderr, log/slog's text format); ok is false for any
// other line. Programs that watch a job (fpt bench) use it, as
// ParseDecisionLine for the LB's decisions.
func ParseMembershipLine(line string) (m Membership, ok bool) {
	sub := membershipLine.FindStringSubmatch(line)
	if sub == nil {
		return Membership{}, false
	}
	m = membershipOf(sub[1])
	m.Node = sub[2]
	var err error
	switch {
	case !m.Joined:
		m.RetryFrom, err = strconv.ParseUint(sub[3], 10, 64)
	case m.Role == node.Worker:
		m.From, err = strconv.ParseUint(sub[4], 10, 64)
	}
	if err != nil {
		return Membership{}, false
	}
	return m, true
}

// tooLateGrace is how long the joiners missing from the final barrier
// must look too late to train before they are ended: a joiner that did
// train may have its report of its first iteration still on its way when
// the others reach the barrier.
const tooLateGrace = time.Second

// tooLate ends the workers that joined too late to train: when every
// other member has reached the final barrier, the job's last iteration is
// done, and a joiner whose first iteration comes after it waits for
// parameters no worker will hand over. Once that has held for
// tooLateGrace, each is told why and leaves the barriers; the members to
// terminate are returned once that releases the final barrier. The
// scheduler calls it on the final barrier's arrivals and on every tick.
func (c *core) tooLate() (final []node.ID) {
	now := c.now
	if c.lb == nil || !c.finalSeen {
		return nil
	}
	missing := c.bars.missing(node.AllGroup, c.finalSeq)
	ahead := c.lb.JoinsAhead()
	if len(missing) == 0 || slices.ContainsFunc(missing, func(id node.ID) bool { return !slices.Contains(ahead, id) }) {
		c.lateSince = time.Time{}
		return nil
	}
	if c.lateSince.IsZero() {
		c.lateSince = now
	}
	if now.Sub(c.lateSince) < tooLateGrace {
		return nil
	}
	for _, id := range missing {
		why := fmt.Sprintf("the job ended with iteration %d, before iteration %d, this worker's first: it joined too late to train", c.lb.Done()-1, c.lb.JoinIteration(id))
		c.log.Warn("worker joined too late to train; ending it", "node", c.byID[id], "reason", why)
		c.send(id, &control.Message{Command: control.NodeFailed, Sender: node.SchedulerID, Target: id, Text: why})
		if f := c.leaveBarriers(id); f != nil {
			final = f
		}
	}
	return final
}
