// Package cluster is a server's or worker's membership in an fpt cluster
// (ps-lite's Postoffice): it registers with the scheduler over the control
// plane, learns the node table, connects the data plane to every peer, and
// offers barriers, failure detection and an orderly shut-down.
//
// Failure is all-or-nothing, as in synchronous training: when any node dies
// (its data connection drops without a goodbye, or the scheduler stops
// hearing its heartbeats) every other node's Done channel closes and Err
// names the dead node, so that no call waits forever for a value that will
// never come.
package cluster

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fptps/fpt/auth"
	"github.com/fptps/fpt/classic"
	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/control"
	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/metrics"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/trace"
	"github.com/fptps/fpt/van"
)

// ErrTerminated is returned by calls made after the cluster shut down.
var ErrTerminated = errors.New("cluster: terminated")

// lostPeerGrace is how long a node that saw a peer's connection drop waits
// for the scheduler's verdict before failing on its own account: when one
// node dies, its peers' connections to each other may drop too (they are
// exiting), and the scheduler's notice names the node that died first.
const lostPeerGrace = 2 * time.Second

// portAttempts bounds the search for a free control port whose successor
// (the data port) is free as well.
const portAttempts = 32

// Member is this process's membership in a cluster.
type Member struct {
	cfg     config.Config
	log     *slog.Logger
	handler Handler
	planes  Planes

	plane   control.Transport
	van     van.Transport
	metrics *metrics.Node   // nil: none
	tracer  *trace.Recorder // nil: none
	sched   string
	// schedOrigin is the connection (control.Message.Origin) the node
	// table came over: the scheduler's. Later control messages are acted
	// on only from it; others are refused through reject.
	schedOrigin string
	reject      *control.Rejecter
	// topo is published once, when the node table arrives; the van's
	// callbacks may read it from other goroutines before that.
	topo atomic.Pointer[topology]

	mu          sync.Mutex
	barrierSeq  map[node.Group]uint64
	barrierWait map[barrierKey]chan struct{}
	lastAck     time.Time
	onControl   func(*control.Message)
	onLeft      func(id node.ID, graceful bool) error
	onLayout    func(classic.Layout)
	onTable     func(context.Context) error
	// layout is the newest classic key layout: the job's first from the
	// node table, a joining node's in its table, later ones from the
	// scheduler's Layout messages.
	layout classic.Layout
	// tableLayout is the layout the node table came with.
	tableLayout classic.Layout
	// forRole carries the messages for onControl to roleLoop, so that a
	// role busy under its own lock never holds up heartbeat answers,
	// barriers or failure notices (a worker copying a 2 GiB result once
	// delayed them past PS_HEARTBEAT_TIMEOUT).
	forRole chan *control.Message
	// progress is what a worker has pushed (SetProgress), sent to the
	// scheduler with every heartbeat for its stall check.
	progress atomic.Uint64
	// joining: the node table made this server or worker a member of a
	// running job (control.FlagJoin): it skips the start barriers.
	joining atomic.Bool

	failOnce   sync.Once
	failed     chan struct{}
	err        error
	termOnce   sync.Once
	terminated chan struct{}
	leftOnce   sync.Once
	departed   chan struct{} // closed when the scheduler says this node left in order (Leave)
	stop       chan struct{}
	wg         sync.WaitGroup
	closeOnce  sync.Once
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
}

type barrierKey struct {
	group node.Group
	seq   uint64
}

// Planes makes a member's two transports. Start calls Control for the
// control port it tries (0: any free one), then Data for the data plane on
// the port after it, and tries again when that one is taken: factories
// rather than transports, because the ports are found by trying.
type Planes struct {
	Control func(port int, log *slog.Logger) (control.Transport, error)
	Data    func(cfg van.Config) (van.Transport, error)
}

// Network is the real planes of the node cfg describes: the control plane
// over ZeroMQ (CURVE with cfg.Secret), bound on ListenHost(cfg), the data
// plane over TCP with the van of kind cfg.Van (FPT_VAN). Refusals are
// counted in m (nil: none).
func Network(cfg config.Config, m *metrics.Node) Planes {
	return Planes{
		Control: func(port int, log *slog.Logger) (control.Transport, error) {
			host, _, err := ListenHost(cfg)
			if err != nil {
				return nil, err
			}
			return control.Listen(control.Config{BindHost: host, Port: port, Logger: log, Secret: cfg.Secret,
				OnReject: func(reason string) { m.Rejected("control", reason) }})
		},
		Data: func(vc van.Config) (van.Transport, error) { return van.New(cfg.Van, vc) },
	}
}

// New prepares a node that will join the cluster over planes (Network for
// a real one). Nothing is bound until Start.
func New(cfg config.Config, log *slog.Logger, planes Planes) *Member {
	if log == nil {
		log = slog.Default()
	}
	return &Member{
		cfg:         cfg,
		log:         log,
		planes:      planes,
		sched:       cfg.SchedulerEndpoint(),
		barrierSeq:  make(map[node.Group]uint64),
		barrierWait: make(map[barrierKey]chan struct{}),
		failed:      make(chan struct{}),
		terminated:  make(chan struct{}),
		departed:    make(chan struct{}),
		stop:        make(chan struct{}),
	}
}

// SetProgress records that this worker has pushed its first iterations
// iterations in full. Every heartbeat carries it to the scheduler, which
// fails the job naming a worker that stays behind the others without
// pushing for longer than FPT_STALL_TIMEOUT.
func (n *Member) SetProgress(iterations uint64) { n.progress.Store(iterations) }

// SetMetrics makes the node record its figures in m (nil: none). Call it
// before Start.
func (n *Member) SetMetrics(m *metrics.Node) { n.metrics = m }

// Metrics is the node's metrics, nil when it has none.
func (n *Member) Metrics() *metrics.Node { return n.metrics }

// SetTracer makes the node's worker and aggregator record their timeline
// in r (nil: none). Call it before Start.
func (n *Member) SetTracer(r *trace.Recorder) { n.tracer = r }

// Tracer is the node's timeline recorder, nil when it traces nothing.
func (n *Member) Tracer() *trace.Recorder { return n.tracer }

// OnControl installs a handler for control messages the node does not
// handle itself (the LB's reports and decisions). Call it before Start.
// It runs on a goroutine of its own, in the order the messages came, and
// may block without delaying the node's own traffic (heartbeats, barriers,
// failure notices).
func (n *Member) OnControl(f func(*control.Message)) { n.onControl = f }

// roleQueue bounds the messages waiting for OnControl's handler. The
// scheduler sends a role at most a decision per iteration, so a full
// queue means the role has been stuck for that many iterations; the
// control loop then waits for it.
const roleQueue = 64

// Handler is what a role gives Start to receive the data plane's frames:
// a van.Handler that also chooses where payloads are read to (van.Sink),
// so that tensors land in their destination without a copy. A frame it
// has no buffer for gets nil from PayloadBuffer and is copied.
type Handler interface {
	van.Handler
	van.Sink
}

// Start joins the cluster: it binds both planes, registers, waits for the
// node table, connects to every peer and passes the start barrier. h
// receives the data plane's frames; it may be called as soon as Start has
// bound the van, but frames only arrive once peers passed the barrier.
func (n *Member) Start(ctx context.Context, h Handler) (err error) {
	if n.cfg.Role != node.Server && n.cfg.Role != node.Worker {
		return fmt.Errorf("cluster: Start is for servers and workers, not the %s", n.cfg.Role)
	}
	n.handler = h
	n.reject = control.NewRejecter(n.log, func(reason string) { n.metrics.Rejected("control", reason) })
	ctx, cancel := context.WithTimeout(ctx, n.cfg.StartTimeout)
	defer cancel()
	host, err := n.cfg.ResolveHost()
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	listen, _, err := ListenHost(n.cfg)
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	if err := n.bind(host, listen); err != nil {
		n.tellUnbound(host, err)
		return err
	}
	ok := false
	own := false // err is the node's own failure (OnTable's), not a wait's
	defer func() {
		if ok {
			return
		}
		if ferr := n.Err(); ferr != nil && !own {
			// The scheduler's notice (or a lost peer) is the cause: say
			// that, not the wait it cut short.
			err = ferr
		} else {
			n.reportStartFailure(err)
		}
		n.shutdown()
	}()
	self := n.Self()
	if n.cfg.RankVar != "" {
		// The launcher pinned the rank: ask the scheduler for its id.
		self.ID = node.RankID(n.cfg.Role, n.cfg.Rank)
	}
	n.log.Info("registering", "control", self.ControlEndpoint(), "data", self.DataAddr(), "scheduler", n.sched)
	if err := n.plane.Send(n.sched, &control.Message{Command: control.AddNode, Nodes: []node.Info{self}}); err != nil {
		return fmt.Errorf("cluster: register: %w", err)
	}
	if err := n.awaitTable(ctx); err != nil {
		return err
	}
	n.van.SetSelf(n.Self().ID)
	n.lastAck = time.Now()
	if n.onControl != nil || n.onLayout != nil {
		n.forRole = make(chan *control.Message, roleQueue)
		n.wg.Add(1)
		go n.roleLoop()
	}
	n.wg.Add(2)
	go n.controlLoop()
	go n.heartbeatLoop()
	// From here on the scheduler's failure notice reaches n.failed: it
	// ends every wait of the start-up (dials, barriers) at once, rather
	// than after FPT_START_TIMEOUT.
	ctx, cancelOnFail := context.WithCancel(ctx)
	defer cancelOnFail()
	go func() {
		select {
		case <-n.failed:
			cancelOnFail()
		case <-ctx.Done():
		}
	}()
	if n.onTable != nil {
		if err := n.onTable(ctx); err != nil {
			own = ctx.Err() == nil // else the start was cut short: say why
			return err
		}
	}
	if n.joining.Load() {
		if err := n.join(ctx); err != nil {
			return err
		}
		ok = true
		n.log.Info("joined the running job", "id", n.Self().ID, "servers", len(n.Servers()), "workers", len(n.Workers()))
		return nil
	}
	// Every node knows its id before anyone dials: a Hello must find its
	// recipient ready to check it.
	if err := n.Barrier(ctx, node.AllGroup); err != nil {
		return fmt.Errorf("cluster: table barrier: %w", err)
	}
	if err := n.connectPeers(ctx); err != nil {
		return err
	}
	if err := n.Barrier(ctx, node.AllGroup); err != nil {
		return fmt.Errorf("cluster: start barrier: %w", err)
	}
	ok = true
	n.log.Info("started", "id", n.Self().ID, "servers", n.cfg.NumServers, "workers", n.cfg.NumWorkers)
	return nil
}

// reportStartFailure tells the scheduler that this node cannot start, so
// that it stops the others at once instead of letting them wait out
// FPT_START_TIMEOUT. Before the node table, the node has no id yet: Nodes
// carries its address, by which the scheduler names it.
func (n *Member) reportStartFailure(err error) {
	if n.plane == nil {
		return
	}
	self := n.Self()
	_ = n.plane.Send(n.sched, &control.Message{Command: control.NodeFailed, Sender: self.ID, Target: self.ID,
		Nodes: []node.Info{self}, Text: "failed while starting: " + err.Error()})
}

// tellUnbound reports a failure to bind this node's ports (a port taken)
// through a control socket on any free port, opened only for that: the
// node has no plane of its own to say it with.
func (n *Member) tellUnbound(host string, err error) {
	plane, perr := n.planes.Control(0, n.log)
	if perr != nil {
		return
	}
	defer plane.Close()
	self := node.Info{Role: n.cfg.Role, Host: host, ControlPort: n.cfg.NodePort, DataPort: n.cfg.NodePort + 1}
	_ = plane.Send(n.sched, &control.Message{Command: control.NodeFailed, Nodes: []node.Info{self},
		Text: "failed while starting: " + err.Error()})
}

// bind opens the control socket and the van on ports p and p+1; the van
// listens on listen (ListenHost), the node is reached at host.
func (n *Member) bind(host, listen string) error {
	var helloKey []byte
	if n.cfg.Secret != "" {
		k, err := auth.HelloKey(n.cfg.Secret)
		if err != nil {
			return fmt.Errorf("cluster: %w", err)
		}
		helloKey = k
	}
	var lastErr error
	for attempt := 0; attempt < portAttempts; attempt++ {
		plane, err := n.planes.Control(n.cfg.NodePort, n.log)
		if err != nil {
			return fmt.Errorf("cluster: %w", err)
		}
		port := plane.Port()
		tr, err := n.planes.Data(van.Config{
			ListenAddr:     net.JoinHostPort(listen, strconv.Itoa(port+1)),
			Handler:        (*vanHandler)(n),
			MaxPayload:     n.cfg.MaxFrameBytes,
			PartitionBytes: n.cfg.PartitionBytes,
			PoolBytes:      n.cfg.PoolBytes,
			Logger:         n.log,
			HelloKey:       helloKey,
			Admit:          n.admitPeer,
			OnReject:       func(reason string) { n.metrics.Rejected("data", reason) },
		})
		if err == nil {
			n.plane, n.van = plane, tr
			n.metrics.Watch(tr)
			n.topo.Store(&topology{self: node.Info{Role: n.cfg.Role, Host: host, ControlPort: port, DataPort: port + 1}})
			return nil
		}
		plane.Close()
		lastErr = err
		if n.cfg.NodePort != 0 {
			break // the user chose the port; do not wander off it
		}
	}
	return fmt.Errorf("cluster: data port: %w", lastErr)
}

func (n *Member) awaitTable(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("cluster: interrupted while waiting for the node table: %w", ctx.Err())
			}
			return fmt.Errorf("cluster: no node table from the scheduler at %s after %s (is it running, and were DMLC_NUM_SERVER=%d and DMLC_NUM_WORKER=%d nodes started?): %w",
				n.sched, n.cfg.StartTimeout, n.cfg.NumServers, n.cfg.NumWorkers, ctx.Err())
		case m, ok := <-n.plane.Incoming():
			if !ok {
				return fmt.Errorf("cluster: control plane closed while registering")
			}
			switch m.Command {
			case control.NodeTable:
				// Only the scheduler knows this node's address before
				// the table; with a secret, only members can reach it.
				if err := n.setTable(m); err != nil {
					return err
				}
				n.schedOrigin = m.Origin
				if m.Flags&control.FlagJoin != 0 {
					return n.startBarriers(m.Body[8:]) // setTable checked the stamp is there
				}
				return nil
			case control.NodeFailed:
				return fmt.Errorf("cluster: the scheduler gave up before the cluster started: %s", m.Text)
			case control.Terminate:
				return fmt.Errorf("cluster: terminated by the scheduler while registering")
			default:
				n.log.Debug("ignoring control message before the node table", "command", m.Command)
			}
		}
	}
}

func (n *Member) setTable(m *control.Message) error {
	table := slices.Clone(m.Nodes)
	slices.SortFunc(table, func(a, b node.Info) int { return int(a.ID) - int(b.ID) })
	byID := make(map[node.ID]node.Info, len(table))
	var servers, workers int
	for _, info := range table {
		if r, ok := info.ID.Role(); !ok || r != info.Role {
			return fmt.Errorf("cluster: node table: id %d does not fit role %s", info.ID, info.Role)
		}
		if _, dup := byID[info.ID]; dup {
			return fmt.Errorf("cluster: node table: id %d twice", info.ID)
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
		return fmt.Errorf("cluster: node table without the job's stamp (%d bytes of body): a scheduler of another fpt version?", len(m.Body))
	}
	self := n.Self()
	me, ok := byID[m.Recipient]
	if !ok || me.Host != self.Host || me.ControlPort != self.ControlPort {
		return fmt.Errorf("cluster: node table does not list this node (%s) as id %d", self, m.Recipient)
	}
	join := m.Flags&control.FlagJoin != 0
	switch {
	case join && n.cfg.RankVar != "":
		n.log.Warn("joining a running job: the rank asked for is ignored; a joining node gets an id no node of the job had", "asked", n.cfg.RankVar, "id", m.Recipient)
	case n.cfg.RankVar != "" && m.Recipient != node.RankID(n.cfg.Role, n.cfg.Rank):
		return fmt.Errorf("cluster: the scheduler made this node %s, not rank %d as %s asks", m.Recipient, n.cfg.Rank, n.cfg.RankVar)
	}
	// A node joining a running job finds the servers and workers there
	// are now, not DMLC_NUM_SERVER and DMLC_NUM_WORKER: servers joined
	// and left (FPT_ON_SERVER_LOSS=retry), workers left
	// (FPT_ON_WORKER_LOSS=continue) or joined.
	if join && (servers < 1 || workers < 1) ||
		!join && (workers != n.cfg.NumWorkers || servers != n.cfg.NumServers) {
		return fmt.Errorf("cluster: node table has %d servers and %d workers; DMLC_NUM_SERVER=%d, DMLC_NUM_WORKER=%d",
			servers, workers, n.cfg.NumServers, n.cfg.NumWorkers)
	}
	n.topo.Store(&topology{self: me, table: table, byID: byID, stamp: binary.LittleEndian.Uint64(m.Body)})
	if !join {
		var servers []node.ID
		for _, info := range table {
			if info.Role == node.Server {
				servers = append(servers, info.ID)
			}
		}
		n.mu.Lock()
		n.layout = classic.Initial(servers)
		n.tableLayout = n.layout
		n.mu.Unlock()
	}
	return nil
}

// Layout is the newest classic key layout this node knows of.
func (n *Member) Layout() classic.Layout {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.layout
}

// ServerRank is a server's dense rank among the job's servers, 0 to S-1:
// its place in the classic key layout, which the scheduler re-cuts at
// every server's join, leave and loss, so that the ranks of the servers
// left close up. It is -1 while the server is not in the layout (a
// joining server until the LB counts it, a leaving one) and for a
// worker.
func (n *Member) ServerRank() int { return n.Layout().Index(n.Self().ID) }

// TableLayout is the classic key layout the node table came with: the
// job's first, or the one a joining node found (which does not name it).
// The layouts after it reach OnLayout's f.
func (n *Member) TableLayout() classic.Layout {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.tableLayout
}

// OnLayout installs f, which hears every newer classic key layout, in
// version order, off the control plane's goroutine (as OnControl's
// messages: f may take its role's lock). Call it before Start.
func (n *Member) OnLayout(f func(classic.Layout)) { n.onLayout = f }

// OnTable installs f, which Start calls once the node has its table, id
// and job stamp, before the start barriers (or a joining node's join):
// what the node must have before the job may start (a server's
// checkpoint). An error from f is the start's, and ends the job as any
// node's failure to start does. Its ctx is the start's: it ends at
// FPT_START_TIMEOUT, which f counts against, or when the job fails
// meanwhile. Heartbeats go on while f runs. Call it before Start.
func (n *Member) OnTable(f func(ctx context.Context) error) { n.onTable = f }

// newLayout takes the scheduler's Layout message: a newer version is
// kept, and handed to the role (OnLayout) in order with its other
// messages.
func (n *Member) newLayout(m *control.Message) {
	l, err := classic.ParseLayout(m.Body)
	if err != nil {
		n.reject.Reject("layout", "err", err)
		return
	}
	n.mu.Lock()
	newer := l.Version > n.layout.Version
	if newer {
		n.layout = l
	}
	n.mu.Unlock()
	if !newer || n.onLayout == nil {
		return
	}
	select { // roleLoop runs: Start starts it when OnLayout is installed
	case n.forRole <- m:
	case <-n.stop:
	}
}

// admitPeer is the van's Admit: a data connection is accepted only once
// the node table exists, only from a server or worker in it, and only
// from a node that should dial this one (the smaller id, see
// connectPeers).
func (n *Member) admitPeer(id node.ID) string {
	t := n.topo.Load()
	if t == nil || t.table == nil {
		return "early"
	}
	info, ok := t.byID[id]
	switch {
	case !ok || info.Role == node.Scheduler:
		return "stranger"
	case id >= t.self.ID && !n.joining.Load():
		// A joining node is dialled by every member (welcome).
		return "direction"
	}
	return ""
}

// connectPeers dials every data-plane peer with a larger id and waits for
// the others to dial in: one connection per pair.
func (n *Member) connectPeers(ctx context.Context) error {
	var lower []node.ID
	self := n.Self()
	for _, info := range n.Nodes() {
		if info.Role == node.Scheduler || info.ID == self.ID {
			continue
		}
		if info.ID < self.ID {
			lower = append(lower, info.ID)
			continue
		}
		if err := n.van.Dial(ctx, info.ID, info.DataAddr()); err != nil {
			return fmt.Errorf("cluster: connect to %s: %w", info, err)
		}
	}
	if err := n.van.AwaitPeers(ctx, lower); err != nil {
		return fmt.Errorf("cluster: waiting for %d peers to connect: %w", len(lower), err)
	}
	return nil
}

// SendScheduler sends m to the scheduler over the control plane, as this
// node (the LB's reports use it).
func (n *Member) SendScheduler(m *control.Message) error {
	m.Sender = n.Self().ID
	return n.plane.Send(n.sched, m)
}

// Self describes this node (its ID is 0 until the node table arrived).
func (n *Member) Self() node.Info {
	if t := n.topo.Load(); t != nil {
		return t.self
	}
	return node.Info{Role: n.cfg.Role}
}

// Nodes is the node table, sorted by id (empty before Start registered).
func (n *Member) Nodes() []node.Info {
	if t := n.topo.Load(); t != nil {
		return t.table
	}
	return nil
}

// Info describes the node with id; ok is false for an unknown id.
func (n *Member) Info(id node.ID) (node.Info, bool) {
	if t := n.topo.Load(); t != nil {
		info, ok := t.byID[id]
		return info, ok
	}
	return node.Info{}, false
}

// Servers lists the servers' ids by rank.
func (n *Member) Servers() []node.ID { return n.idsOf(node.Server) }

// Workers lists the workers' ids by rank.
func (n *Member) Workers() []node.ID { return n.idsOf(node.Worker) }

func (n *Member) idsOf(r node.Role) []node.ID {
	var ids []node.ID
	for _, info := range n.Nodes() {
		if info.Role == r {
			ids = append(ids, info.ID)
		}
	}
	return ids
}

// Config is the configuration the node started with.
func (n *Member) Config() config.Config { return n.cfg }

// Joined reports whether this node joined a running job (its node table
// was marked control.FlagJoin) rather than starting with it.
func (n *Member) Joined() bool { return n.joining.Load() }

// JobStamp is the job's stamp from the node table: the scheduler's clock
// when it started the job (Unix ns), the same on every node of the job,
// larger in a later run of it (package server orders its checkpoints by
// it). 0 before the table.
func (n *Member) JobStamp() uint64 {
	if t := n.topo.Load(); t != nil {
		return t.stamp
	}
	return 0
}

// Logger is the node's logger, tagged with its id.
func (n *Member) Logger() *slog.Logger { return n.log }

// Van is the node's data plane.
func (n *Member) Van() van.Transport { return n.van }

// Done is closed when the node fails or the cluster terminates.
func (n *Member) Done() <-chan struct{} { return n.failed }

// Closed is closed once the node has left the cluster (Finalize or Close),
// failed or not.
func (n *Member) Closed() <-chan struct{} { return n.stop }

// Err is why the node failed, or nil.
func (n *Member) Err() error {
	select {
	case <-n.failed:
		return n.err
	default:
		return nil
	}
}

// Fail records a fatal error, wakes every waiting call, and tells the
// scheduler (which tells everyone else). The first error wins.
func (n *Member) Fail(err error) {
	n.fail(err, 0)
}

// fail records err and reports it, naming the lost peer when there is one.
func (n *Member) fail(err error, lost node.ID) {
	if n.record(err) {
		n.report(lost, err)
	}
}

// record makes err the node's failure unless it already failed, and wakes
// every waiting call. It reports whether err was the first.
func (n *Member) record(err error) (first bool) {
	n.failOnce.Do(func() {
		n.err = err
		close(n.failed)
		n.log.Error("node failed", "err", err)
		first = true
	})
	return first
}

// report tells the scheduler, which relays it to every node: naming the
// lost peer (target), rather than this node, points their messages at the
// culprit.
func (n *Member) report(target node.ID, err error) {
	if n.plane == nil {
		return
	}
	self := n.Self().ID
	if target == 0 {
		target = self
	}
	_ = n.plane.Send(n.sched, &control.Message{Command: control.NodeFailed, Sender: self, Target: target, Text: err.Error()})
}

// Barrier blocks until every node of group g has called Barrier the same
// number of times, the node fails, or ctx ends.
func (n *Member) Barrier(ctx context.Context, g node.Group) error {
	return n.barrier(ctx, g, 0)
}

func (n *Member) barrier(ctx context.Context, g node.Group, flags uint8) error {
	self := n.Self().ID
	if !self.InGroup(g) {
		return fmt.Errorf("cluster: barrier: %s is not in group %d", self, g)
	}
	n.mu.Lock()
	seq := n.barrierSeq[g]
	n.barrierSeq[g] = seq + 1
	ch := make(chan struct{})
	n.barrierWait[barrierKey{g, seq}] = ch
	n.mu.Unlock()
	err := n.plane.Send(n.sched, &control.Message{Command: control.Barrier, Flags: flags, Sender: self, Group: g, Seq: seq})
	if err != nil {
		return fmt.Errorf("cluster: barrier: %w", err)
	}
	select {
	case <-ch:
		return nil
	case <-n.failed:
		return n.err
	case <-n.terminated:
		if flags&control.FlagFinal != 0 {
			return nil // Terminate is the final barrier's release
		}
		return ErrTerminated
	case <-n.stop:
		return fmt.Errorf("cluster: barrier over group %d: the node was closed", g)
	case <-ctx.Done():
		return fmt.Errorf("cluster: barrier over group %d: %w", g, ctx.Err())
	}
}

// Finalize passes the final barrier over all nodes, waits for the
// scheduler's Terminate, and releases every socket and goroutine. It
// returns the node's failure, if any.
func (n *Member) Finalize(ctx context.Context) error {
	err := n.barrier(ctx, node.AllGroup, control.FlagFinal)
	n.shutdown()
	if ferr := n.Err(); ferr != nil {
		return ferr
	}
	return err
}

// Close leaves at once without the final barrier (after a failure).
func (n *Member) Close() { n.shutdown() }

// CloseVan closes the data plane: draining what is queued (van Close),
// unless the node failed (van Abort): a failed node's queued frames are
// worth nothing to peers that are failing too, and one that stopped
// reading would hold a draining Close for IOTimeout. Close calls it; a
// role may call it first (a worker's must before it fails its requests).
func (n *Member) CloseVan() error {
	if n.Err() != nil {
		return n.van.Abort()
	}
	return n.van.Close()
}

func (n *Member) shutdown() {
	n.closeOnce.Do(func() {
		close(n.stop)
		if n.van != nil {
			if err := n.CloseVan(); err != nil {
				n.log.Warn("closing the data plane", "err", err)
			}
		}
		if n.plane != nil {
			if err := n.plane.Close(); err != nil {
				n.log.Warn("closing the control plane", "err", err)
			}
		}
		n.wg.Wait()
	})
}

func (n *Member) controlLoop() {
	defer n.wg.Done()
	for {
		select {
		case <-n.stop:
			return
		case m, ok := <-n.plane.Incoming():
			if !ok {
				return
			}
			n.handleControl(m)
		}
	}
}

func (n *Member) handleControl(m *control.Message) {
	// Nodes talk to each other over the data plane only: every control
	// message a node receives is the scheduler's, from its connection.
	if m.Origin != n.schedOrigin || m.Sender != node.SchedulerID {
		n.reject.Reject("sender", "command", m.Command, "claims", m.Sender)
		return
	}
	switch m.Command {
	case control.BarrierDone:
		n.mu.Lock()
		k := barrierKey{m.Group, m.Seq}
		ch := n.barrierWait[k]
		delete(n.barrierWait, k)
		n.mu.Unlock()
		if ch != nil {
			close(ch)
		}
	case control.HeartbeatAck:
		n.mu.Lock()
		n.lastAck = time.Now()
		n.mu.Unlock()
	case control.NodeFailed:
		n.fail(fmt.Errorf("cluster: %s failed: %s", n.describe(m.Target), m.Text), m.Target)
	case control.NodeLeft:
		n.leave(m.Target, m.Text, m.Flags&control.FlagGraceful != 0)
	case control.NodeJoined:
		n.welcome(m)
	case control.Layout:
		n.newLayout(m)
	case control.Terminate:
		// Confirm, so that the scheduler knows it may exit.
		_ = n.plane.Send(n.sched, &control.Message{Command: control.Terminate, Sender: n.Self().ID})
		n.termOnce.Do(func() { close(n.terminated) })
	default:
		if n.onControl != nil {
			select {
			case n.forRole <- m:
			case <-n.stop:
			}
			return
		}
		n.log.Warn("unexpected control message", "command", m.Command, "from", m.Sender)
	}
}

// roleLoop hands the role its control messages (OnControl) and layouts
// (OnLayout), in order.
func (n *Member) roleLoop() {
	defer n.wg.Done()
	for {
		select {
		case <-n.stop:
			return
		case m := <-n.forRole:
			if m.Command == control.Layout {
				l, _ := classic.ParseLayout(m.Body) // newLayout checked it
				n.onLayout(l)
				continue
			}
			if n.onControl != nil {
				n.onControl(m)
			}
		}
	}
}

func (n *Member) heartbeatLoop() {
	defer n.wg.Done()
	t := time.NewTicker(n.cfg.HeartbeatInterval)
	defer t.Stop()
	lastTick := time.Now()
	for {
		select {
		case <-n.stop:
			return
		case <-n.terminated:
			return
		case <-t.C:
		}
		// A tick far later than the interval means this process did not
		// run (SIGSTOP, a frozen VM): the scheduler stopped hearing it, not
		// the other way round, so the culprit is this node.
		if gap := selfSilence(lastTick, time.Now(), n.cfg.HeartbeatTimeout); gap > 0 {
			n.fail(fmt.Errorf("cluster: this node (%s) was stopped or starved for %s, longer than PS_HEARTBEAT_TIMEOUT (%s); the scheduler has declared it dead",
				n.describe(n.Self().ID), gap.Round(time.Millisecond), n.cfg.HeartbeatTimeout), 0)
			return
		}
		lastTick = time.Now()
		_ = n.plane.Send(n.sched, &control.Message{Command: control.Heartbeat, Sender: n.Self().ID, Seq: n.progress.Load()})
		n.mu.Lock()
		silent := time.Since(n.lastAck)
		n.mu.Unlock()
		if silent > n.cfg.HeartbeatTimeout {
			n.fail(fmt.Errorf("cluster: scheduler at %s unreachable: no heartbeat answer for %s", n.sched, silent.Round(time.Millisecond)), node.SchedulerID)
		}
	}
}

// selfSilence is how long this process went without running, when that
// exceeds timeout (else 0): the time since its previous heartbeat tick.
func selfSilence(lastTick, now time.Time, timeout time.Duration) time.Duration {
	if gap := now.Sub(lastTick); gap > timeout {
		return gap
	}
	return 0
}

// describe names a node for an error message: id, role, rank and address.
func (n *Member) describe(id node.ID) string {
	if info, ok := n.Info(id); ok {
		return info.String()
	}
	if t := n.topo.Load(); t != nil {
		if info, ok := t.left[id]; ok {
			return info.String()
		}
	}
	return id.String()
}

// startBarriers takes a joining node's barrier numbers (FlagJoin's
// Body): the running members' next ones.
func (n *Member) startBarriers(body []byte) error {
	if len(body) < 8*int(node.AllGroup) {
		return fmt.Errorf("cluster: joining node table with %d bytes of barrier numbers, want %d", len(body), 8*int(node.AllGroup))
	}
	l, err := classic.ParseLayout(body[8*int(node.AllGroup):])
	if err != nil {
		return fmt.Errorf("cluster: joining node table: %w", err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.layout, n.tableLayout = l, l
	for g := node.Group(1); g <= node.AllGroup; g++ {
		n.barrierSeq[g] = binary.LittleEndian.Uint64(body[8*(g-1):])
	}
	n.joining.Store(true)
	return nil
}

// join is a joining node's start, in place of the two start barriers:
// it tells the scheduler it has its table (the members then dial it),
// waits for every member to connect, and says so (the LB then gives it a
// share).
func (n *Member) join(ctx context.Context) error {
	if err := n.plane.Send(n.sched, &control.Message{Command: control.Joined, Sender: n.Self().ID, Seq: 0}); err != nil {
		return fmt.Errorf("cluster: join: %w", err)
	}
	var members []node.ID
	for _, info := range n.Nodes() {
		if info.Role != node.Scheduler && info.ID != n.Self().ID {
			members = append(members, info.ID)
		}
	}
	if err := n.van.AwaitPeers(ctx, members); err != nil {
		return fmt.Errorf("cluster: join: waiting for %d members to connect: %w", len(members), err)
	}
	if err := n.plane.Send(n.sched, &control.Message{Command: control.Joined, Sender: n.Self().ID, Seq: 1}); err != nil {
		return fmt.Errorf("cluster: join: %w", err)
	}
	return nil
}

// welcome adds a server or worker joining the running job (the
// scheduler's NodeJoined) to the table and dials it. Every member dials a
// joining node, whatever the ids' order: it knows the joiner's table is
// set, whereas the joiner cannot know when each member has heard of it.
func (n *Member) welcome(m *control.Message) {
	if len(m.Nodes) != 1 || m.Nodes[0].Role != node.Server && m.Nodes[0].Role != node.Worker {
		n.log.Warn("NodeJoined for a node that cannot join ignored", "nodes", m.Nodes)
		return
	}
	info := m.Nodes[0]
	t := n.topo.Load()
	if _, known := t.byID[info.ID]; known {
		n.log.Warn("NodeJoined for a member ignored", "node", info)
		return
	}
	nt := &topology{self: t.self, byID: maps.Clone(t.byID), left: t.left, stamp: t.stamp}
	nt.byID[info.ID] = info
	nt.table = append(slices.Clone(t.table), info)
	slices.SortFunc(nt.table, func(a, b node.Info) int { return cmp.Compare(a.ID, b.ID) })
	n.topo.Store(nt)
	n.log.Info(info.Role.String()+" joining; connecting to it", "node", info)
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), n.cfg.StartTimeout)
		defer cancel()
		go func() {
			select {
			case <-n.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		if err := n.van.Dial(ctx, info.ID, info.DataAddr()); err != nil {
			n.Fail(fmt.Errorf("cluster: connect to joining %s: %w", info, err))
			return
		}
		// The joiner sees this connection before Dial returns here: the
		// scheduler waits for this word too before any decision may
		// send to it.
		_ = n.plane.Send(n.sched, &control.Message{Command: control.Joined, Sender: n.Self().ID, Target: info.ID, Seq: 2})
	}()
}

// OnLeft installs f, which learns that a server or a worker left the job
// (FPT_ON_SERVER_LOSS=retry, FPT_ON_WORKER_LOSS=continue) once the node
// table no longer lists it; graceful: a server that left in order
// (Leave), whose frames all arrive before its connections end. An error
// fails this node (a role that cannot go on without it). Call it before
// Start.
func (n *Member) OnLeft(f func(id node.ID, graceful bool) error) { n.onLeft = f }

// Leave leaves the running job in order, for a server: it asks the
// scheduler, which takes the server out of the LB's decisions and of the
// classic key layout; ready then waits until the server has handed its
// keys over and answered every request to it, and Leave tells the
// scheduler so and waits for its NodeLeft. The node is still to be
// closed (Close, which drains what it still sends). A scheduler that
// refuses fails the node, and Leave returns why. A job that ends
// meanwhile (Terminate) ends the leave too, without error: nobody needs
// the keys any more.
func (n *Member) Leave(ctx context.Context, ready func(context.Context) error) error {
	select {
	case <-n.terminated:
		return nil // the job is over: there is nothing to leave
	default:
	}
	self := n.Self().ID
	if err := n.plane.Send(n.sched, &control.Message{Command: control.Leave, Sender: self}); err != nil {
		return fmt.Errorf("cluster: leave: %w", err)
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-n.terminated:
		case <-n.stop:
		case <-rctx.Done():
		}
		cancel()
	}()
	if err := ready(rctx); err != nil {
		select {
		case <-n.terminated:
			n.log.Info("the job ended while this node was leaving it")
			return nil
		default:
		}
		if ferr := n.Err(); ferr != nil {
			return ferr
		}
		return fmt.Errorf("cluster: leave: %w", err)
	}
	if err := n.plane.Send(n.sched, &control.Message{Command: control.Leave, Sender: self, Seq: 1}); err != nil {
		return fmt.Errorf("cluster: leave: %w", err)
	}
	select {
	case <-n.departed:
		return nil
	case <-n.terminated:
		return nil
	case <-n.failed:
		return n.err
	case <-n.stop:
		return errors.New("cluster: leave: the node was closed")
	case <-ctx.Done():
		return fmt.Errorf("cluster: leave: waiting for the scheduler: %w", ctx.Err())
	}
}

// leave takes server or worker id out of the node table on the
// scheduler's NodeLeft: the job goes on without it. (The scheduler tells
// the members left; the node itself only when it left in order, Leave: a
// live one it takes out, a stalled worker, hears NodeFailed.)
func (n *Member) leave(id node.ID, why string, graceful bool) {
	t := n.topo.Load()
	if id == t.self.ID && graceful {
		n.log.Info("left the job in order", "reason", why)
		n.leftOnce.Do(func() { close(n.departed) })
		return
	}
	info, ok := t.byID[id]
	if !ok || id == t.self.ID || (info.Role != node.Server && info.Role != node.Worker) {
		n.log.Warn("NodeLeft for a node that is not another server or worker of the table ignored", "node", id)
		return
	}
	nt := &topology{self: t.self, byID: maps.Clone(t.byID), left: maps.Clone(t.left), stamp: t.stamp}
	if nt.left == nil {
		nt.left = make(map[node.ID]node.Info)
	}
	delete(nt.byID, id)
	nt.left[id] = info
	nt.table = slices.DeleteFunc(slices.Clone(t.table), func(i node.Info) bool { return i.ID == id })
	n.topo.Store(nt)
	n.log.Warn(info.Role.String()+" left the job; going on without it", "node", info, "reason", why)
	if n.onLeft != nil {
		if err := n.onLeft(id, graceful); err != nil {
			n.Fail(err)
		}
	}
}

// WasMember reports whether id is a member of the job or was one (it
// left): a frame of its may still be on its way.
func (n *Member) WasMember(id node.ID) bool {
	_, ok := n.Info(id)
	return ok || n.HasLeft(id)
}

// HasLeft reports whether id left the job (lost or in order).
func (n *Member) HasLeft(id node.ID) bool {
	t := n.topo.Load()
	_, ok := t.left[id]
	return ok
}

// vanHandler adapts the node to van.Handler and van.Sink: frames and the
// choice of their payload buffers go to the role's handler, lost peers
// become a cluster failure. The van finds Sink by a type assertion on the
// handler it is given, so the adapter must have it too: without it every
// payload would be read into the van's buffer and copied.
type vanHandler Member

var (
	_ van.Handler = (*vanHandler)(nil)
	_ van.Sink    = (*vanHandler)(nil)
)

func (h *vanHandler) HandleFrame(hdr *frame.Header, payload []byte, inPlace bool) {
	h.handler.HandleFrame(hdr, payload, inPlace)
}

func (h *vanHandler) PayloadBuffer(hdr *frame.Header) []byte {
	return h.handler.PayloadBuffer(hdr)
}

func (h *vanHandler) PeerLost(id node.ID, err error) {
	n := (*Member)(h)
	h.handler.PeerLost(id, err) // the role releases what the peer's last frame held
	if _, known := n.Info(id); !known {
		n.log.Warn("connection from a node not in the table dropped", "peer", id, "err", err)
		return
	}
	select {
	case <-n.terminated:
		return // the final barrier is over: peers may leave
	default:
	}
	lostErr := fmt.Errorf("cluster: lost %s: %w", n.describe(id), err)
	n.log.Warn("peer lost; waiting for the scheduler's verdict", "peer", n.describe(id), "err", err)
	n.report(id, lostErr)
	time.AfterFunc(lostPeerGrace, func() {
		// Under FPT_ON_SERVER_LOSS=retry the scheduler's verdict on this
		// very report may be that the job goes on without it.
		if !n.HasLeft(id) {
			n.record(lostErr)
		}
	})
}
