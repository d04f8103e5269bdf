package scheduler

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/fptps/fpt/classic"
	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/control"
	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/localagg"
	"github.com/fptps/fpt/node"
)

// core is the scheduler's state and logic without I/O: registration, the
// node table, barriers, heartbeats, the stall watch, joins, leaves,
// losses, layouts and the LB. It holds no lock, opens no socket, starts
// no goroutine and reads no clock: each input (step: a message; tick: the
// heartbeat interval's tick, or registration's deadline) comes with the
// time, and returns a ready saying what the shell (Serve) must do. Like
// lb.Balancer beside balance.go, it is tested with tables, without a
// plane. It logs, counts rejections and feeds the metrics and the status
// recorder itself: those only record.
type core struct {
	cfg config.Config
	log *slog.Logger
	// self is the scheduler's own entry in the table, its id aside.
	self node.Info
	// reg collects the registrations until the cluster is complete;
	// deadline is when it gives up (FPT_START_TIMEOUT).
	reg         registry
	registering bool
	deadline    time.Time

	table    []node.Info
	byID     map[node.ID]node.Info
	lastSeen map[node.ID]time.Time
	// lastTick is the time of the last tick: a gap much longer than the
	// heartbeat interval means the scheduler itself was paused.
	lastTick time.Time
	bars     *barriers
	stalls   *stallWatch
	lb       *lb.Balancer // nil when the LB is off
	// serversDirected says whether the servers were sent a directive,
	// serversShaping the Shaping of the last one (lb.Directive.ForServers).
	serversDirected, serversShaping bool
	// written is the split of the last decision line written
	// (writeDecision).
	written  *lb.Decision
	byOrigin map[string]node.ID
	// left holds the nodes that left the job (FPT_ON_SERVER_LOSS=retry,
	// FPT_ON_WORKER_LOSS=continue); membership counts such changes.
	left       map[node.ID]bool
	membership int
	// leaving holds the servers that asked to leave and are handing
	// their classic keys over (leave); leaveLater those whose leave waits
	// for a worker's join to take effect (leaveDeferred).
	leaving, leaveLater map[node.ID]bool
	// servers and workers count the ids of each role ever assigned: a
	// joining node gets the next one, so no id is ever used twice in a
	// job. joining holds the nodes admitted but not yet connected to
	// every member.
	servers, workers int
	joining          map[node.ID]*joining
	// layout is the classic key ranges' current version (package
	// classic): a server joining or lost changes it, and every member
	// hears of it (setLayout).
	layout classic.Layout
	// stamp is the job's: the scheduler's clock when it sent the node
	// table (Unix ns), in every table (the first 8 bytes of its Body). It
	// orders the checkpoints of a job's runs (package server).
	stamp uint64
	// waitLost are the workers lost under FPT_ON_WORKER_LOSS=wait since
	// the LB's grants were held (at waitSince) for a worker to join
	// (waitForWorker).
	waitLost  []node.Info
	waitSince time.Time
	// running: the start barrier passed, every worker has started. A
	// server lost before that ends the job even under retry: a worker
	// cannot follow a retry before it has started.
	running bool
	// hostIDs are the hosts registering nodes named (FPT_HOST_ID), by
	// connection; groups the workers' local groups, formed at the table;
	// hostOf every node's host (named, else its address); lbHostIndex the
	// LB's index of each host, when it balances by host; joinerHosts the
	// hosts the nodes that joined the running job named, by id.
	hostIDs     map[string]string
	joinerHosts map[node.ID]string
	groups      []localagg.Group
	hostOf      map[node.ID]string
	lbHostIndex map[string]int
	// finalSeq is the final barrier's number, once a member reached it.
	finalSeq  uint64
	finalSeen bool
	// lateSince: since when the only members missing from the final
	// barrier are workers that joined too late to train (tooLate).
	lateSince time.Time
	reject    *control.Rejecter
	obs       observer

	// now is the time of the input being handled; out collects what it
	// asks of the shell.
	now time.Time
	out ready
}

// ready is what one input asks of the shell, in order: send the
// messages, write the decision lines, post the status; then, when
// terminate is set, terminate those members and end with nil, or, when
// err is set, end with it.
type ready struct {
	sends     []outgoing
	decisions []string // DecisionLine's, for Serve's decisions writer
	publish   bool     // the status changed: post a snapshot
	// terminate: the final barrier passed; Terminate went to these
	// members (in sends) and the shell waits for their echoes.
	terminate bool
	members   []node.ID
	err       error
	// table: the node table is out (for Observers.Apps); apps are
	// members' messages for the scheduler's customers.
	table []node.Info
	apps  []*control.Message
}

// outgoing is a message for the node at to's control endpoint. quiet:
// a failure to send it is not worth a log line (a refusal to a node that
// may not exist).
type outgoing struct {
	to    node.Info
	m     *control.Message
	quiet bool
}

// newCore is a scheduler awaiting cfg's nodes from now, at self's address
// (its control port: the plane's).
func newCore(cfg config.Config, log *slog.Logger, self node.Info, reject *control.Rejecter, obs observer, now time.Time) *core {
	return &core{cfg: cfg, log: log, self: self, reject: reject, obs: obs,
		reg:         registry{servers: cfg.NumServers, workers: cfg.NumWorkers},
		registering: true, deadline: now.Add(cfg.StartTimeout)}
}

// take hands the shell what the input asked for.
func (c *core) take() ready {
	r := c.out
	c.out = ready{}
	return r
}

// step handles message m, received at now.
func (c *core) step(m *control.Message, now time.Time) ready {
	c.now = now
	if c.registering {
		c.registerStep(m)
		return c.take()
	}
	if m.Command == control.AddNode {
		if m.Seq != 0 {
			// A worker customer after the start: DMLC_NUM_WORKER was
			// met without it.
			c.reject.Reject("register", "customer", m.Seq-1, "err", "a worker customer registered after the cluster started")
			return c.take()
		}
		// A server or worker joining the running job: the only
		// message a connection of no member may send.
		c.admit(m)
		return c.take()
	}
	if !c.authentic(m) {
		return c.take()
	}
	// Only the nodes watched have a heartbeat clock: a message of one
	// no longer watched must not start one again.
	_, watched := c.lastSeen[m.Sender]
	if watched {
		c.lastSeen[m.Sender] = now
	}
	switch m.Command {
	case control.Heartbeat:
		if watched {
			// A worker's heartbeat carries the iterations it has pushed.
			c.stalls.report(m.Sender, m.Seq, now)
			c.send(m.Sender, &control.Message{Command: control.HeartbeatAck, Sender: node.SchedulerID})
		}
	case control.Barrier:
		final := m.Flags&control.FlagFinal != 0 && m.Group == node.AllGroup
		if final {
			c.finalSeq, c.finalSeen = m.Seq, true
		}
		release, err := c.bars.arrive(m.Sender, m.Group, m.Seq)
		if err != nil {
			c.reject.Reject("barrier", "from", m.Sender, "err", err)
			break
		}
		if release == nil {
			if final {
				c.tooLate() // starts its grace
			}
			break
		}
		if final {
			c.log.Info("final barrier passed; terminating the cluster")
			c.terminate(release)
			break
		}
		for _, id := range release {
			c.send(id, &control.Message{Command: control.BarrierDone, Sender: node.SchedulerID, Group: m.Group, Seq: m.Seq})
		}
		if m.Group == node.AllGroup && m.Seq >= startBarrier {
			c.running = true
		}
	case control.NodeFailed:
		target := culprit(m, c.table)
		if _, member := c.byID[target]; !member && c.left[target] {
			break // a peer's report of a node that already left
		}
		c.lost(target, m.Text)
	case control.Report:
		c.report(m)
		c.leaveDeferred() // a join may have taken effect
	case control.Joined:
		c.joined(m)
	case control.App:
		if m.Target != node.SchedulerID || c.obs.Apps == nil {
			c.reject.Reject("app", "from", m.Sender, "target", m.Target)
			break
		}
		c.out.apps = append(c.out.apps, m)
	case control.Leave:
		if final := c.leave(m); final != nil {
			c.terminate(final)
		}
	default:
		c.log.Warn("unexpected control message", "command", m.Command, "from", m.Sender)
	}
	return c.take()
}

// tick is the heartbeat interval's tick at now (while registering, the
// registration deadline's): it finds the nodes silent too long, the
// stalled workers, a wait for a worker that expired, the leaves that may
// go ahead and the joiners too late to train.
func (c *core) tick(now time.Time) ready {
	c.now = now
	if c.registering {
		if !now.Before(c.deadline) {
			c.startFailed(fmt.Errorf("scheduler: only %d of %d servers and %d of %d workers registered within %s",
				c.reg.count(node.Server), c.cfg.NumServers, c.reg.count(node.Worker), c.cfg.NumWorkers, c.cfg.StartTimeout))
		}
		return c.take()
	}
	c.publish()
	// Ticks come every interval while the scheduler runs: a gap of half
	// a timeout (the heartbeat's or the stall's) is time it did not run
	// (stopped, suspended), which no member's silence or stall may be
	// blamed for. Shorter gaps, as under a heavy load, count: they cannot
	// make a member look lost or stalled alone.
	limit := c.cfg.HeartbeatTimeout
	if st := c.cfg.StallTimeout; st > 0 && st < limit {
		limit = st
	}
	if gap := now.Sub(c.lastTick); gap > limit/2 && gap > 2*c.cfg.HeartbeatInterval {
		c.paused(gap-c.cfg.HeartbeatInterval, now)
	}
	c.lastTick = now
	for id, seen := range c.lastSeen {
		if silent := now.Sub(seen); silent > c.cfg.HeartbeatTimeout {
			if c.lost(id, fmt.Sprintf("no heartbeat for %s", silent.Round(time.Millisecond))) {
				return c.take()
			}
		}
	}
	if err := c.waitExpired(now); err != nil {
		c.out.err = err
		return c.take()
	}
	c.leaveDeferred()
	if final := c.tooLate(); final != nil {
		c.log.Info("final barrier passed; terminating the cluster")
		c.terminate(final)
		return c.take()
	}
	if st, stalled := c.stalls.check(now); stalled {
		// Under FPT_ON_WORKER_LOSS=continue a stalled worker is lost
		// like a dead one; it is told so, since it is alive.
		why := st.reason()
		info := c.byID[st.worker]
		handled, final := c.lose(st.worker, why)
		switch {
		case final != nil:
			c.terminate(final)
		case !handled:
			c.out.err = c.stalled(st)
		default:
			c.sendTo(info, &control.Message{Command: control.NodeFailed, Sender: node.SchedulerID, Target: st.worker, Text: why}, true)
		}
	}
	return c.take()
}

// paused discounts d, time the scheduler did not run up to now, from the
// members' silence and the workers' stalls.
func (c *core) paused(d time.Duration, now time.Time) {
	c.log.Warn("the scheduler did not run for a while; the members' silence and stalls are counted from now", "paused", d.Round(time.Millisecond))
	for id, seen := range c.lastSeen {
		if seen = seen.Add(d); seen.After(now) {
			seen = now
		}
		c.lastSeen[id] = seen
	}
	c.stalls.shift(d, now)
}

// lost handles the loss of node id (lose): the job goes on, or the final
// barrier it was missing from passes (terminate), or the job fails. It
// reports whether the job ended.
func (c *core) lost(id node.ID, why string) (ended bool) {
	handled, final := c.lose(id, why)
	switch {
	case final != nil:
		c.terminate(final)
	case !handled:
		c.out.err = c.failed(id, why)
	default:
		return false
	}
	return true
}

// interrupt ends the scheduler with err (the shell's context ended):
// every node known is told, registered or not.
func (c *core) interrupt(err error) ready {
	if c.registering {
		c.startFailed(err)
	} else {
		c.abort(err.Error())
		c.out.err = err
	}
	return c.take()
}

// registerStep handles m while the nodes register: an AddNode, or a
// node's report that it cannot start.
func (c *core) registerStep(m *control.Message) {
	if m.Command == control.NodeFailed {
		c.startFailed(startFailure(m))
		return
	}
	if m.Command != control.AddNode || len(m.Nodes) != 1 {
		c.log.Debug("ignoring message while registering", "command", m.Command)
		return
	}
	info := m.Nodes[0]
	if m.Seq != 0 {
		// A further worker customer of a process that registered.
		if err := c.reg.addCustomer(info, m.Origin, m.Seq); err != nil {
			c.reject.Reject("register", "node", info, "err", err)
			return
		}
		c.log.Info("worker customer registered", "node", info, "customer", m.Seq-1, "workers", c.reg.count(node.Worker))
		if c.reg.complete() {
			c.begin()
		}
		return
	}
	if err := c.reg.add(info, m.Origin); err != nil {
		// Two nodes pinned to one rank: no later registration mends
		// that, so the start fails now, naming both.
		var re *rankError
		if errors.As(err, &re) {
			c.sendTo(info, &control.Message{Command: control.NodeFailed, Sender: node.SchedulerID, Text: "registration refused: " + err.Error()}, true)
			c.startFailed(&startFailedError{fmt.Errorf("scheduler: registration refused: %w", err)})
			return
		}
		// Never tell a registered node it was refused: the AddNode
		// naming its address may come from someone else.
		if c.reg.registered(info) {
			c.reject.Reject("register", "node", info, "err", err)
			return
		}
		c.log.Warn("registration refused", "node", info, "err", err)
		c.sendTo(info, &control.Message{Command: control.NodeFailed, Sender: node.SchedulerID, Text: "registration refused: " + err.Error()}, true)
		return
	}
	c.noteHost(m)
	c.log.Info("node registered", "node", info, "servers", c.reg.count(node.Server), "workers", c.reg.count(node.Worker))
	if c.reg.complete() {
		c.begin()
	}
}

// startFailed ends the start with err. The registered nodes have no
// table yet: they are told directly, or they wait out their own start
// timeout.
func (c *core) startFailed(err error) {
	for _, info := range c.reg.pending {
		c.sendTo(info, &control.Message{Command: control.NodeFailed, Sender: node.SchedulerID, Target: node.SchedulerID, Text: err.Error()}, true)
	}
	c.out.err = err
}

// begin assigns the ids once every node registered, sends everyone the
// node table and starts the LB.
func (c *core) begin() {
	c.registering = false
	c.table = c.reg.assign(c.self)
	c.servers, c.workers = c.cfg.NumServers, c.cfg.NumWorkers
	c.byID = make(map[node.ID]node.Info, len(c.table))
	c.lastSeen = make(map[node.ID]time.Time, len(c.table))
	c.byOrigin = make(map[string]node.ID, len(c.table))
	now := c.now
	c.lastTick = now
	for _, info := range c.table {
		c.byID[info.ID] = info
		if info.ID != node.SchedulerID {
			c.lastSeen[info.ID] = now
			c.byOrigin[c.reg.originOf(info)] = info.ID
		}
	}
	var servers []node.ID
	c.stamp = uint64(now.UnixNano())
	// The stamp, the hosts the nodes named (local groups), then the
	// worker processes of several customers: id and count.
	body := localagg.AppendHosts(binary.LittleEndian.AppendUint64(nil, c.stamp), c.namedHosts())
	for _, info := range c.table[1:] {
		if w := c.reg.weightOf(info); w > 1 {
			body = binary.LittleEndian.AppendUint32(body, uint32(info.ID))
			body = binary.LittleEndian.AppendUint32(body, uint32(w))
		}
	}
	for _, info := range c.table[1:] {
		c.send(info.ID, &control.Message{Command: control.NodeTable, Recipient: info.ID, Nodes: c.table, Body: body})
		if info.Role == node.Server {
			servers = append(servers, info.ID)
		}
	}
	c.out.table = c.table
	c.layout = classic.Initial(servers) // as every node derives it from the table
	c.log.Info("node table sent", "nodes", len(c.table))
	c.formGroups()
	// A retry after a lost node rides on the LB's grants, so it runs
	// them even with the LB off (fixed at the even split).
	if c.cfg.Grants() {
		if err := c.startLB(); err != nil {
			c.startFailed(err)
			return
		}
	}
	c.started()
	c.bars = newBarriers(c.table)
	c.stalls = newStallWatch(c.cfg.StallTimeout, c.workerIDs(), now)
}

// terminate sends Terminate to members: the final barrier passed.
func (c *core) terminate(members []node.ID) {
	for _, id := range members {
		c.send(id, &control.Message{Command: control.Terminate, Sender: node.SchedulerID})
	}
	c.out.terminate, c.out.members = true, members
}

// echoed reports whether m is a member's echo of Terminate.
func (c *core) echoed(m *control.Message) bool {
	return m.Command == control.Terminate && c.authentic(m)
}

// authentic reports whether m comes from the connection its Sender
// registered over; it refuses (counts and logs) the others.
func (c *core) authentic(m *control.Message) bool {
	id, ok := c.byOrigin[m.Origin]
	switch {
	case !ok:
		c.reject.Reject("stranger", "command", m.Command, "claims", m.Sender)
		return false
	case m.Sender == 0 && m.Command == control.NodeFailed:
		// A node that rejected the node table does not know its id; its
		// connection does.
		m.Sender = id
	case id != m.Sender:
		c.reject.Reject("sender", "command", m.Command, "claims", m.Sender, "connection_of", id)
		return false
	}
	return true
}

// failed tells every node that target died; the scheduler ends with the
// error returned.
func (c *core) failed(target node.ID, reason string) error {
	name := target.String()
	if info, ok := c.byID[target]; ok {
		name = info.String()
	}
	c.log.Error("node failed; stopping the cluster", "node", name, "reason", reason)
	for _, info := range c.table[1:] {
		if info.ID != target {
			c.send(info.ID, &control.Message{Command: control.NodeFailed, Sender: node.SchedulerID, Target: target, Text: reason})
		}
	}
	return fmt.Errorf("scheduler: %s failed: %s", name, reason)
}

// abort tells every known node that the scheduler is giving up.
func (c *core) abort(reason string) {
	for _, info := range c.table {
		if info.ID != node.SchedulerID {
			c.send(info.ID, &control.Message{Command: control.NodeFailed, Sender: node.SchedulerID, Target: node.SchedulerID, Text: reason})
		}
	}
}

// send has the shell send m to member id; nothing for a node that is not
// one.
func (c *core) send(id node.ID, m *control.Message) {
	if info, ok := c.byID[id]; ok {
		c.sendTo(info, m, false)
	}
}

// sendTo has the shell send m to the node at info's address.
func (c *core) sendTo(info node.Info, m *control.Message, quiet bool) {
	c.out.sends = append(c.out.sends, outgoing{to: info, m: m, quiet: quiet})
}
