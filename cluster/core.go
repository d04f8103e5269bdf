package cluster

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/fptps/fpt/classic"
	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/control"
	"github.com/fptps/fpt/localagg"
	"github.com/fptps/fpt/node"
)

// core is a member's state and logic without I/O: the node table, the
// classic key layout, barrier numbers, the heartbeat clocks and the
// node's failure. It holds no lock, opens no socket, starts no goroutine
// and reads no clock (every input that needs the time carries it). Each
// method takes one input (a control message, a heartbeat tick, a call, a
// lost peer) and returns a ready: what the shell (Member) must do, once
// it has released its lock. Like worker/core.go beside worker/worker.go,
// it is tested with tables, without a cluster.
type core struct {
	cfg   config.Config
	sched string // the scheduler's endpoint, for messages

	// topo is nil until the ports are bound, and has no table until the
	// scheduler's NodeTable. Each change is a new value, published by the
	// shell (ready.topo): the van's callbacks read it without the lock.
	topo *topology
	// schedOrigin is the connection (control.Message.Origin) the node
	// table came over: the scheduler's. Later control messages are acted
	// on only from it; others are refused.
	schedOrigin string

	// layout is the newest classic key layout: the job's first from the
	// node table, a joining node's in its table, later ones from the
	// scheduler's Layout messages.
	layout classic.Layout
	// tableLayout is the layout the node table came with.
	tableLayout classic.Layout

	barrierSeq map[node.Group]uint64
	waiting    map[barrierKey]struct{} // barriers sent and not yet released

	// seen is when the scheduler's port last answered a probe while
	// registering (zero: never yet); probing: a probe is out.
	seen    time.Time
	probing bool
	// shakeFailingSince is when the handshakes with the scheduler's port began
	// to fail, with none succeeding since (zero: none failed, or one
	// succeeded); shakeFailure says why the latest failed.
	shakeFailingSince time.Time
	shakeFailure      string
	// refused rate-limits the log of probes refused while the scheduler
	// has not listened yet; refusals counts them.
	refused  logLimit
	refusals int

	// beating: the table came and heartbeats run (begin).
	beating bool
	lastAck time.Time // the scheduler's latest HeartbeatAck
	// lastTick is the latest tick that found this process had run: once
	// one finds it was stopped, every later one does, and sends nothing.
	lastTick time.Time

	err error // the node's failure: the first one
	// schedLost: the scheduler stopped answering heartbeats; nothing sent
	// to it will be taken.
	schedLost  bool
	terminated bool // the scheduler's Terminate came
	departed   bool // the scheduler's NodeLeft for this node, after Leave
}

type topology struct {
	self  node.Info
	table []node.Info // sorted by id
	byID  map[node.ID]node.Info
	// left holds the nodes that left the job (FPT_ON_SERVER_LOSS=retry),
	// so that messages can still name them.
	left map[node.ID]node.Info
	// stamp is the job's, from the node table (JobStamp).
	stamp uint64
	// join: the node table made this server or worker a member of a
	// running job (control.FlagJoin): it skips the start barriers.
	join bool
	// hosts are the hosts nodes named (FPT_HOST_ID), by id (HostOf).
	hosts map[node.ID]string
	// joined is what the scheduler told a joining node of the local
	// groups (nil: a node of the start, or a scheduler that told none).
	joined *localagg.Joined
}

type barrierKey struct {
	group node.Group
	seq   uint64
}

// ready is what the shell does after a core call, in this order: publish
// topo (still under its lock), log the notes and refusals, fail the node,
// release the barriers, send, close Terminated and Departed, hand the role
// its messages, call OnLeft, dial a joining node, start a lost peer's
// grace timer.
type ready struct {
	topo    *topology
	notes   []note
	rejects []note // refusals: msg is the reason
	// fail is the node's failure, set once: the first.
	fail    error
	release []barrierKey
	// send are messages for the scheduler, in order.
	send       []*control.Message
	terminated bool
	departed   bool
	// role are messages for the role's goroutine (OnControl, and Layout
	// messages for OnLayout), in order.
	role []*control.Message
	// left is a server or worker gone from the table, for OnLeft.
	left *departure
	// dial is a node joining the running job: every member dials it.
	dial *node.Info
	// grace is a lost peer whose verdict the node waits for
	// (lostPeerGrace), then calls graceOver.
	grace *lostPeer
	// apps are messages from the scheduler's customers, for this
	// node's (OnApp).
	apps []*control.Message

	// While registering: table is set when the node table came and was
	// taken; startErr ends the start; probe asks whether the scheduler's
	// port still answers (probed takes the answer).
	table    bool
	startErr error
	probe    bool
}

// note is a line for the node's log.
type note struct {
	level slog.Level
	msg   string
	args  []any
}

type departure struct {
	id       node.ID
	graceful bool
}

type lostPeer struct {
	id  node.ID
	err error
}

func newCore(cfg config.Config) *core {
	return &core{
		cfg:        cfg,
		sched:      cfg.SchedulerEndpoint(),
		barrierSeq: make(map[node.Group]uint64),
		waiting:    make(map[barrierKey]struct{}),
	}
}

func (r *ready) note(level slog.Level, msg string, args ...any) {
	r.notes = append(r.notes, note{level, msg, args})
}

func (r *ready) merge(o ready) {
	if o.topo != nil {
		r.topo = o.topo
	}
	r.notes = append(r.notes, o.notes...)
	r.rejects = append(r.rejects, o.rejects...)
	if o.fail != nil {
		r.fail = o.fail
	}
	r.release = append(r.release, o.release...)
	r.send = append(r.send, o.send...)
	r.terminated = r.terminated || o.terminated
	r.departed = r.departed || o.departed
	r.role = append(r.role, o.role...)
}

// self describes this node (its ID is 0 until the node table came).
func (c *core) self() node.Info {
	if c.topo != nil {
		return c.topo.self
	}
	return node.Info{Role: c.cfg.Role}
}

// bound takes the address the node's ports were bound at.
func (c *core) bound(self node.Info) ready {
	c.topo = &topology{self: self}
	return ready{topo: c.topo}
}

// begin starts the heartbeat clocks: the table came at now.
func (c *core) begin(now time.Time) {
	c.beating = true
	c.lastAck, c.lastTick = now, now
}

// step takes a control message that arrived at now.
func (c *core) step(m *control.Message, now time.Time) ready {
	if c.topo == nil || c.topo.table == nil {
		return c.register(m)
	}
	// Nodes talk to each other over the data plane only: every control
	// message a node receives is the scheduler's, from its connection.
	if m.Origin != c.schedOrigin || m.Sender != node.SchedulerID {
		return ready{rejects: []note{{msg: "sender", args: []any{"command", m.Command, "claims", m.Sender}}}}
	}
	var r ready
	switch m.Command {
	case control.BarrierDone:
		k := barrierKey{m.Group, m.Seq}
		if _, ok := c.waiting[k]; ok {
			delete(c.waiting, k)
			r.release = []barrierKey{k}
		}
	case control.HeartbeatAck:
		c.lastAck = now
	case control.NodeFailed:
		r = c.fail(fmt.Errorf("cluster: %s failed: %s", c.describe(m.Target), m.Text), m.Target)
	case control.NodeLeft:
		r = c.leave(m.Target, m.Text, m.Flags&control.FlagGraceful != 0)
	case control.NodeJoined:
		r = c.welcome(m)
	case control.Layout:
		r = c.newLayout(m)
	case control.App:
		r.apps = []*control.Message{m}
	case control.Terminate:
		// Confirm, so that the scheduler knows it may exit.
		r.send = []*control.Message{{Command: control.Terminate, Sender: c.self().ID}}
		if !c.terminated {
			c.terminated, r.terminated = true, true
		}
	default:
		r.role = []*control.Message{m}
	}
	return r
}

// register takes a control message before the node table.
func (c *core) register(m *control.Message) ready {
	switch m.Command {
	case control.NodeTable:
		// Only the scheduler knows this node's address before the
		// table; with a secret, only members can reach it.
		r, err := c.setTable(m)
		if err != nil {
			r.startErr = err
			return r
		}
		c.schedOrigin = m.Origin
		r.table = true
		return r
	case control.NodeFailed:
		return ready{startErr: fmt.Errorf("cluster: the scheduler gave up before the cluster started: %s", m.Text)}
	case control.Terminate:
		return ready{startErr: fmt.Errorf("cluster: terminated by the scheduler while registering")}
	}
	var r ready
	r.note(slog.LevelDebug, "ignoring control message before the node table", "command", m.Command)
	return r
}

func (c *core) setTable(m *control.Message) (ready, error) {
	var r ready
	table := slices.Clone(m.Nodes)
	slices.SortFunc(table, func(a, b node.Info) int { return int(a.ID) - int(b.ID) })
	byID := make(map[node.ID]node.Info, len(table))
	var servers, workers int
	for _, info := range table {
		if role, ok := info.ID.Role(); !ok || role != info.Role {
			return r, fmt.Errorf("cluster: node table: id %d does not fit role %s", info.ID, info.Role)
		}
		if _, dup := byID[info.ID]; dup {
			return r, fmt.Errorf("cluster: node table: id %d twice", info.ID)
		}
		byID[info.ID] = info
		switch info.Role {
		case node.Server:
			servers++
		case node.Worker:
			workers++
		}
	}
	if len(m.Body) < 8 {
		return r, fmt.Errorf("cluster: node table without the job's stamp (%d bytes of body): a scheduler of another fpt version?", len(m.Body))
	}
	self := c.self()
	me, ok := byID[m.Recipient]
	if !ok || me.Host != self.Host || me.ControlPort != self.ControlPort {
		return r, fmt.Errorf("cluster: node table does not list this node (%s) as id %d", self, m.Recipient)
	}
	join := m.Flags&control.FlagJoin != 0
	var hosts map[node.ID]string
	if !join {
		// The hosts the nodes named, then the worker processes of
		// several customers, each counted once per customer (AddNode).
		named, extra, err := readHosts(m.Nodes, m.Body[8:])
		if err != nil {
			return r, fmt.Errorf("cluster: %w", err)
		}
		hosts = named
		if len(extra)%8 != 0 {
			return r, fmt.Errorf("cluster: node table: %d bytes of customer counts, not pairs of 32-bit words", len(extra))
		}
		for ; len(extra) > 0; extra = extra[8:] {
			id, k := node.ID(binary.LittleEndian.Uint32(extra)), binary.LittleEndian.Uint32(extra[4:])
			if info, ok := byID[id]; !ok || info.Role != node.Worker || k < 2 || k > uint32(c.cfg.NumWorkers) {
				return r, fmt.Errorf("cluster: node table: worker %d of %d customers", id, k)
			}
			workers += int(k) - 1
		}
	}
	switch {
	case join && c.cfg.RankVar != "":
		r.note(slog.LevelWarn, "joining a running job: the rank asked for is ignored; a joining node gets an id no node of the job had", "asked", c.cfg.RankVar, "id", m.Recipient)
	case c.cfg.RankVar != "" && m.Recipient != node.RankID(c.cfg.Role, c.cfg.Rank):
		return r, fmt.Errorf("cluster: the scheduler made this node %s, not rank %d as %s asks", m.Recipient, c.cfg.Rank, c.cfg.RankVar)
	}
	// A node joining a running job finds the servers and workers there
	// are now, not DMLC_NUM_SERVER and DMLC_NUM_WORKER: servers joined
	// and left (FPT_ON_SERVER_LOSS=retry), workers left
	// (FPT_ON_WORKER_LOSS=continue) or joined.
	if join && (servers < 1 || workers < 1) ||
		!join && (workers != c.cfg.NumWorkers || servers != c.cfg.NumServers) {
		return r, fmt.Errorf("cluster: node table has %d servers and %d workers; DMLC_NUM_SERVER=%d, DMLC_NUM_WORKER=%d",
			servers, workers, c.cfg.NumServers, c.cfg.NumWorkers)
	}
	c.topo = &topology{self: me, table: table, byID: byID, stamp: binary.LittleEndian.Uint64(m.Body), join: join, hosts: hosts}
	r.topo = c.topo
	if join {
		rest, err := c.startBarriers(m.Body[8:])
		if err != nil {
			return r, err
		}
		if err := c.topo.joinGroups(m.Nodes, rest); err != nil {
			return r, fmt.Errorf("cluster: %w", err)
		}
	} else {
		var servers []node.ID
		for _, info := range table {
			if info.Role == node.Server {
				servers = append(servers, info.ID)
			}
		}
		c.layout = classic.Initial(servers)
		c.tableLayout = c.layout
	}
	return r, nil
}

// startBarriers takes a joining node's barrier numbers (FlagJoin's
// Body): the running members' next ones, then the layout; it returns the
// bytes after them (the local groups, joinGroups).
func (c *core) startBarriers(body []byte) ([]byte, error) {
	if len(body) < 8*int(node.AllGroup)+8 {
		return nil, fmt.Errorf("cluster: joining node table with %d bytes of barrier numbers and layout, want at least %d", len(body), 8*int(node.AllGroup)+8)
	}
	layout := body[8*int(node.AllGroup):]
	// The layout's length is in its header: 8 bytes, then 4 per server.
	if n := uint64(binary.LittleEndian.Uint32(layout[4:])); 8+4*n < uint64(len(layout)) {
		layout = layout[:8+4*n]
	}
	l, err := classic.ParseLayout(layout)
	if err != nil {
		return nil, fmt.Errorf("cluster: joining node table: %w", err)
	}
	c.layout, c.tableLayout = l, l
	for g := node.Group(1); g <= node.AllGroup; g++ {
		c.barrierSeq[g] = binary.LittleEndian.Uint64(body[8*(g-1):])
	}
	return body[8*int(node.AllGroup)+len(layout):], nil
}

// tick is the heartbeat timer's, at now; progress is what this worker
// has pushed (SetProgress), for the scheduler's stall check.
func (c *core) tick(now time.Time, progress uint64) ready {
	if c.topo == nil || c.topo.table == nil {
		return c.registerTick(now)
	}
	if !c.beating || c.terminated {
		return ready{}
	}
	// A tick far later than the interval means this process did not run
	// (SIGSTOP, a frozen VM): the scheduler stopped hearing it, not the
	// other way round, so the culprit is this node.
	if gap := selfSilence(c.lastTick, now, c.cfg.HeartbeatTimeout); gap > 0 {
		return c.fail(fmt.Errorf("cluster: this node (%s) was stopped or starved for %s, longer than PS_HEARTBEAT_TIMEOUT (%s); the scheduler has declared it dead",
			c.describe(c.self().ID), gap.Round(time.Millisecond), c.cfg.HeartbeatTimeout), 0)
	}
	c.lastTick = now
	r := ready{send: []*control.Message{{Command: control.Heartbeat, Sender: c.self().ID, Seq: progress}}}
	if silent := now.Sub(c.lastAck); silent > c.cfg.HeartbeatTimeout {
		c.schedLost = true
		r.merge(c.fail(fmt.Errorf("cluster: scheduler at %s unreachable: no heartbeat answer for %s", c.sched, silent.Round(time.Millisecond)), node.SchedulerID))
	}
	return r
}

// registerTick is a tick while the node waits for its table. The
// scheduler answers nothing until every node has registered, and a
// control connection's end is not seen; but a scheduler that died leaves
// its port closed. Once the port has answered, it must go on answering:
// else the start fails after PS_HEARTBEAT_TIMEOUT, not FPT_START_TIMEOUT,
// naming the scheduler. A port that never answered is a scheduler not
// started yet, which FPT_START_TIMEOUT waits for.
func (c *core) registerTick(now time.Time) ready {
	if failing := now.Sub(c.shakeFailingSince); !c.shakeFailingSince.IsZero() && failing > c.cfg.HeartbeatTimeout {
		hint := "is an fpt scheduler listening there, and not another program?"
		if c.cfg.Secret != "" {
			hint = "is FPT_CLUSTER_SECRET (or FPT_CLUSTER_SECRET_FILE) the same on every node, and is an fpt scheduler listening there?"
		}
		return ready{startErr: fmt.Errorf("cluster: the scheduler's port %s answers, but every handshake with it has failed for %s (PS_HEARTBEAT_TIMEOUT is %s), the latest: %s; %s",
			strings.TrimPrefix(c.sched, "tcp://"), failing.Round(time.Millisecond), c.cfg.HeartbeatTimeout, c.shakeFailure, hint)}
	}
	if silent := now.Sub(c.seen); !c.seen.IsZero() && silent > c.cfg.HeartbeatTimeout {
		return ready{startErr: fmt.Errorf("cluster: the scheduler at %s stopped answering while the cluster was assembling: nothing has listened there for %s (PS_HEARTBEAT_TIMEOUT is %s)",
			strings.TrimPrefix(c.sched, "tcp://"), silent.Round(time.Millisecond), c.cfg.HeartbeatTimeout)}
	}
	if c.probing {
		return ready{}
	}
	c.probing = true
	return ready{probe: true}
}

// probed takes a probe's answer, at now: whether the scheduler's port
// took a connection. A scheduler that has not listened yet is waited for
// (the control plane connects again by itself); the first refusal is
// logged, then one per waitLogEvery.
func (c *core) probed(ok bool, now time.Time) ready {
	c.probing = false
	if ok {
		c.seen = now
		return ready{}
	}
	c.refusals++
	var r ready
	if !c.seen.IsZero() {
		return r
	}
	if log, held := c.refused.allow(now); log {
		r.note(slog.LevelWarn, "the scheduler does not take connections yet; waiting for it (FPT_START_TIMEOUT bounds the wait)",
			"scheduler", strings.TrimPrefix(c.sched, "tcp://"), "refused_since_last_log", held, "timeout", c.cfg.StartTimeout)
	}
	return r
}

// startTimedOut is the start's failure once FPT_START_TIMEOUT has passed
// without the node table: it names the scheduler's address, and says
// whether anything ever listened there.
func (c *core) startTimedOut(cause error) error {
	addr := strings.TrimPrefix(c.sched, "tcp://")
	if c.seen.IsZero() && c.refusals > 0 {
		return fmt.Errorf("cluster: the scheduler at %s never took a connection in %s (FPT_START_TIMEOUT; %d tries refused): is it running there, at DMLC_PS_ROOT_URI and DMLC_PS_ROOT_PORT? %w",
			addr, c.cfg.StartTimeout, c.refusals, cause)
	}
	return fmt.Errorf("cluster: no node table from the scheduler at %s after %s (is it running, and were DMLC_NUM_SERVER=%d and DMLC_NUM_WORKER=%d nodes started?): %w",
		addr, c.cfg.StartTimeout, c.cfg.NumServers, c.cfg.NumWorkers, cause)
}

// handshake takes the outcome of a control-plane handshake with endpoint,
// at now (err nil: it succeeded). Only the scheduler's count: a port
// whose every handshake fails ends the start at registerTick.
func (c *core) handshake(endpoint string, err error, now time.Time) {
	if endpoint != c.sched {
		return
	}
	if err == nil {
		c.shakeFailingSince, c.shakeFailure = time.Time{}, ""
		return
	}
	if c.shakeFailingSince.IsZero() {
		c.shakeFailingSince = now
	}
	c.shakeFailure = err.Error()
}

// selfSilence is how long this process went without running, when that
// exceeds timeout (else 0): the time since its previous heartbeat tick.
func selfSilence(lastTick, now time.Time, timeout time.Duration) time.Duration {
	if gap := now.Sub(lastTick); gap > timeout {
		return gap
	}
	return 0
}

// fail makes err the node's failure unless it already failed, and tells
// the scheduler, which relays it to every node: naming the lost peer
// (lost), rather than this node, points their messages at the culprit.
func (c *core) fail(err error, lost node.ID) ready {
	r := c.record(err)
	if r.fail == nil {
		return r
	}
	self := c.self().ID
	if lost == 0 {
		lost = self
	}
	r.send = []*control.Message{{Command: control.NodeFailed, Sender: self, Target: lost, Text: err.Error()}}
	return r
}

// record makes err the node's failure unless it already failed, without
// telling anyone.
func (c *core) record(err error) ready {
	if c.err != nil {
		return ready{}
	}
	c.err = err
	return ready{fail: err}
}

// barrier enters this node's next barrier over group g: the message to
// send, whose release BarrierDone brings.
func (c *core) barrier(g node.Group, flags uint8) (*control.Message, error) {
	self := c.self().ID
	if !self.InGroup(g) {
		return nil, fmt.Errorf("cluster: barrier: %s is not in group %d", self, g)
	}
	seq := c.barrierSeq[g]
	c.barrierSeq[g] = seq + 1
	c.waiting[barrierKey{g, seq}] = struct{}{}
	return &control.Message{Command: control.Barrier, Flags: flags, Sender: self, Group: g, Seq: seq}, nil
}

// newLayout takes the scheduler's Layout message: a newer version is
// kept, and handed to the role in order with its other messages.
func (c *core) newLayout(m *control.Message) ready {
	l, err := classic.ParseLayout(m.Body)
	if err != nil {
		return ready{rejects: []note{{msg: "layout", args: []any{"err", err}}}}
	}
	if l.Version <= c.layout.Version {
		return ready{}
	}
	c.layout = l
	return ready{role: []*control.Message{m}}
}

// welcome adds a server or worker joining the running job (the
// scheduler's NodeJoined) to the table, for the shell to dial. Every
// member dials a joining node, whatever the ids' order: it knows the
// joiner's table is set, whereas the joiner cannot know when each member
// has heard of it.
func (c *core) welcome(m *control.Message) ready {
	var r ready
	if len(m.Nodes) != 1 || m.Nodes[0].Role != node.Server && m.Nodes[0].Role != node.Worker {
		r.note(slog.LevelWarn, "NodeJoined for a node that cannot join ignored", "nodes", m.Nodes)
		return r
	}
	info := m.Nodes[0]
	t := c.topo
	if _, known := t.byID[info.ID]; known {
		r.note(slog.LevelWarn, "NodeJoined for a member ignored", "node", info)
		return r
	}
	nt := &topology{self: t.self, byID: maps.Clone(t.byID), left: t.left, stamp: t.stamp, join: t.join, hosts: joinerHost(t.hosts, info.ID, m.Text), joined: t.joined}
	nt.byID[info.ID] = info
	nt.table = append(slices.Clone(t.table), info)
	slices.SortFunc(nt.table, func(a, b node.Info) int { return cmp.Compare(a.ID, b.ID) })
	c.topo, r.topo = nt, nt
	r.note(slog.LevelInfo, info.Role.String()+" joining; connecting to it", "node", info)
	r.dial = &info
	return r
}

// leave takes server or worker id out of the node table on the
// scheduler's NodeLeft: the job goes on without it. (The scheduler tells
// the members left; the node itself only when it left in order, Leave: a
// live one it takes out, a stalled worker, hears NodeFailed.)
func (c *core) leave(id node.ID, why string, graceful bool) ready {
	var r ready
	t := c.topo
	if id == t.self.ID && graceful {
		r.note(slog.LevelInfo, "left the job in order", "reason", why)
		if !c.departed {
			c.departed, r.departed = true, true
		}
		return r
	}
	info, ok := t.byID[id]
	if !ok || id == t.self.ID || (info.Role != node.Server && info.Role != node.Worker) {
		r.note(slog.LevelWarn, "NodeLeft for a node that is not another server or worker of the table ignored", "node", id)
		return r
	}
	nt := &topology{self: t.self, byID: maps.Clone(t.byID), left: maps.Clone(t.left), stamp: t.stamp, join: t.join, hosts: t.hosts, joined: t.joined}
	if nt.left == nil {
		nt.left = make(map[node.ID]node.Info)
	}
	delete(nt.byID, id)
	nt.left[id] = info
	nt.table = slices.DeleteFunc(slices.Clone(t.table), func(i node.Info) bool { return i.ID == id })
	c.topo, r.topo = nt, nt
	r.note(slog.LevelWarn, info.Role.String()+" left the job; going on without it", "node", info, "reason", why)
	r.left = &departure{id, graceful}
	return r
}

// peerLost takes the data plane's word that the connection to id
// dropped: the node tells the scheduler, and fails on its own account
// unless a verdict comes within lostPeerGrace (graceOver).
func (c *core) peerLost(id node.ID, err error) ready {
	var r ready
	known := false
	if c.topo != nil {
		_, known = c.topo.byID[id]
	}
	if !known {
		r.note(slog.LevelWarn, "connection from a node not in the table dropped", "peer", id, "err", err)
		return r
	}
	if c.terminated {
		return r // the final barrier is over: peers may leave
	}
	lostErr := fmt.Errorf("cluster: lost %s: %w", c.describe(id), err)
	r.note(slog.LevelWarn, "peer lost; waiting for the scheduler's verdict", "peer", c.describe(id), "err", err)
	r.send = []*control.Message{{Command: control.NodeFailed, Sender: c.self().ID, Target: id, Text: lostErr.Error()}}
	r.grace = &lostPeer{id, lostErr}
	return r
}

// graceOver is a lost peer's grace ending: under FPT_ON_SERVER_LOSS=retry
// the scheduler's verdict on the report may be that the job goes on
// without it; else the loss is the node's failure.
func (c *core) graceOver(p lostPeer) ready {
	if c.hasLeft(p.id) {
		return ready{}
	}
	return c.record(p.err)
}

func (c *core) hasLeft(id node.ID) bool {
	if c.topo == nil {
		return false
	}
	_, ok := c.topo.left[id]
	return ok
}

// describe names a node for an error message: id, role, rank and address.
func (c *core) describe(id node.ID) string {
	if c.topo != nil {
		if info, ok := c.topo.byID[id]; ok {
			return info.String()
		}
		if info, ok := c.topo.left[id]; ok {
			return info.String()
		}
	}
	return id.String()
}

// abortVan reports whether closing the data plane should abort it rather
// than drain it: a failed node's queued frames are worth nothing to peers
// that are failing too, and one that stopped reading would hold a
// draining Close for IOTimeout.
func (c *core) abortVan() bool { return c.err != nil }

// forsakeScheduler reports whether closing the control plane should drop
// what is still queued for the scheduler rather than linger to deliver
// it: the scheduler stopped answering, so a node that failed for it
// (waiting in any barrier, the final one included) exits at once.
func (c *core) forsakeScheduler() bool { return c.schedLost }
