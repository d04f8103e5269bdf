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
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
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

	// plane is an Outbox over the node's control transport: every control
	// message the member sends leaves through its one queue, in order.
	plane   *control.Outbox
	van     van.Transport
	metrics *metrics.Node   // nil: none
	tracer  *trace.Recorder // nil: none
	sched   string
	reject  *control.Rejecter
	// topo is the core's, published on every change: the van's callbacks
	// and the role read it from other goroutines, without mu.
	topo atomic.Pointer[topology]

	mu sync.Mutex
	// core is the membership's state and logic; mu guards it, and
	// waiters, whose channels the barriers it releases close.
	core      *core
	waiters   map[barrierKey]chan struct{}
	onControl func(*control.Message)
	onLeft    func(id node.ID, graceful bool) error
	onLayout  func(classic.Layout)
	onTable   func(context.Context) error
	// forRole carries the messages for onControl to roleLoop, so that a
	// role busy under its own lock never holds up heartbeat answers,
	// barriers or failure notices (a worker copying a 2 GiB result once
	// delayed them past PS_HEARTBEAT_TIMEOUT).
	forRole chan *control.Message
	// customers are a worker process's further customers (nil: none).
	customers *Customers
	// onApp takes the messages of the scheduler's customers (OnApp).
	onApp atomic.Pointer[func(from node.ID, priority int32, payload []byte)]
	// progress is what a worker has pushed (SetProgress), sent to the
	// scheduler with every heartbeat for its stall check.
	progress atomic.Uint64

	failed     chan struct{}
	err        error // set once, before failed is closed (the core's first failure)
	terminated chan struct{}
	departed   chan struct{} // closed when the scheduler says this node left in order (Leave)
	stop       chan struct{}
	wg         sync.WaitGroup
	closeOnce  sync.Once
}

// Planes makes a member's two transports. Start calls Control for the
// control port it tries (0: any free one), then Data for the data plane on
// the port after it, and tries again when that one is taken: factories
// rather than transports, because the ports are found by trying.
type Planes struct {
	Control func(port int, log *slog.Logger) (control.Transport, error)
	Data    func(cfg van.Config) (van.Transport, error)
	// Probe, if set, reports whether the scheduler's control endpoint
	// takes a connection: while the node waits for its table, it is how
	// the node learns that the scheduler died (the control plane shows no
	// connection's end, and the scheduler answers nothing until every
	// node registered). Nil: the node waits out FPT_START_TIMEOUT.
	Probe func(ctx context.Context, endpoint string) error
	// Handshakes, if set, carries the outcomes of the control plane's
	// handshakes with its peers (control.Config.OnHandshake): a node whose
	// every handshake with the scheduler fails says so within
	// PS_HEARTBEAT_TIMEOUT rather than waiting out FPT_START_TIMEOUT.
	Handshakes <-chan Handshake
}

// Handshake is the outcome of one control-plane handshake with a peer's
// endpoint: Err nil for a success.
type Handshake struct {
	Endpoint string
	Err      error
}

// Network is the real planes of the node cfg describes: the control plane
// over ZeroMQ (CURVE with cfg.Secret), bound on ListenHost(cfg), the data
// plane over TCP with the van of kind cfg.Van (FPT_VAN). Refusals are
// counted in m (nil: none).
func Network(cfg config.Config, m *metrics.Node) Planes {
	// Outcomes past the buffer are dropped rather than stall the plane's
	// thread: only the start reads them, and it reads them as they come.
	handshakes := make(chan Handshake, 64)
	return Planes{
		Control: func(port int, log *slog.Logger) (control.Transport, error) {
			host, _, err := ListenHost(cfg)
			if err != nil {
				return nil, err
			}
			return control.Listen(control.Config{BindHost: host, Port: port, Logger: log, Secret: cfg.Secret,
				OnReject: func(reason string) { m.Rejected("control", reason) },
				OnHandshake: func(endpoint string, err error) {
					select {
					case handshakes <- Handshake{Endpoint: endpoint, Err: err}:
					default:
					}
				}})
		},
		Data:       func(vc van.Config) (van.Transport, error) { return van.New(cfg.Van, vc) },
		Probe:      probeTCP,
		Handshakes: handshakes,
	}
}

// probeTCP connects to a ZeroMQ tcp:// endpoint and hangs up at once,
// before any greeting: the socket behind it sees no peer and no
// handshake.
func probeTCP(ctx context.Context, endpoint string) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", strings.TrimPrefix(endpoint, "tcp://"))
	if err != nil {
		return err
	}
	return c.Close()
}

// New prepares a node that will join the cluster over planes (Network for
// a real one). Nothing is bound until Start.
func New(cfg config.Config, log *slog.Logger, planes Planes) *Member {
	if log == nil {
		log = slog.Default()
	}
	return &Member{
		cfg:        cfg,
		log:        log,
		planes:     planes,
		sched:      cfg.SchedulerEndpoint(),
		core:       newCore(cfg),
		waiters:    make(map[barrierKey]chan struct{}),
		failed:     make(chan struct{}),
		terminated: make(chan struct{}),
		departed:   make(chan struct{}),
		stop:       make(chan struct{}),
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
	// Text names the host for its local group (FPT_HOST_ID; empty: the address does).
	add := &control.Message{Command: control.AddNode, Nodes: []node.Info{self}, Text: n.hostNamed(self)}
	if err := n.plane.Send(n.sched, add); err != nil {
		return fmt.Errorf("cluster: register: %w", err)
	}
	err = n.customers.attach(func(id int) error {
		if err := n.plane.Send(n.sched, customerMessage(add, id)); err != nil {
			return fmt.Errorf("cluster: register customer %d: %w", id, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	err = n.awaitTable(ctx)
	n.customers.detach()
	if err != nil {
		return err
	}
	n.van.SetSelf(n.Self().ID)
	n.mu.Lock()
	n.core.begin(time.Now())
	n.mu.Unlock()
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
	if n.Joined() {
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
			Channels:       n.cfg.Channels,
			Logger:         n.log,
			HelloKey:       helloKey,
			Admit:          n.admitPeer,
			OnReject:       func(reason string) { n.metrics.Rejected("data", reason) },
		})
		if err == nil {
			n.plane, n.van = control.NewOutbox(plane, n.log), tr
			n.metrics.Watch(tr)
			n.run(func(c *core) ready {
				return c.bound(node.Info{Role: n.cfg.Role, Host: host, ControlPort: port, DataPort: port + 1})
			})
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
	var tick <-chan time.Time
	if n.planes.Probe != nil {
		t := time.NewTicker(n.cfg.HeartbeatInterval)
		defer t.Stop()
		tick = t.C
	}
	probes := make(chan bool, 1) // the core has one probe out at most
	for {
		select {
		case <-tick:
			r := n.run(func(c *core) ready { return c.tick(time.Now(), 0) })
			if r.startErr != nil {
				return r.startErr
			}
			if r.probe {
				go func() {
					pctx, cancel := context.WithTimeout(ctx, n.cfg.HeartbeatTimeout)
					defer cancel()
					probes <- n.planes.Probe(pctx, n.sched) == nil
				}()
			}
		case ok := <-probes:
			n.run(func(c *core) ready { return c.probed(ok, time.Now()) })
		case h := <-n.planes.Handshakes:
			n.run(func(c *core) ready {
				c.handshake(h.Endpoint, h.Err, time.Now())
				return ready{}
			})
		case <-ctx.Done():
			if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("cluster: interrupted while waiting for the node table: %w", ctx.Err())
			}
			n.mu.Lock()
			err := n.core.startTimedOut(ctx.Err())
			n.mu.Unlock()
			return err
		case m, ok := <-n.plane.Incoming():
			if !ok {
				return fmt.Errorf("cluster: control plane closed while registering")
			}
			r := n.run(func(c *core) ready { return c.step(m, time.Now()) })
			if r.startErr != nil {
				return r.startErr
			}
			if r.table {
				return nil
			}
		}
	}
}

// Layout is the newest classic key layout this node knows of.
func (n *Member) Layout() classic.Layout {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.core.layout
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
	return n.core.tableLayout
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
	case id >= t.self.ID && !t.join:
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

// PostScheduler is SendScheduler without waiting for the control plane:
// m is queued behind the node's earlier control messages and ahead of its
// later ones, and sent from the plane's outbox (control.Outbox.Post). The
// LB's per-iteration reports use it, from inside a worker's push. m must
// not change after the call.
func (n *Member) PostScheduler(m *control.Message) error {
	m.Sender = n.Self().ID
	return n.plane.Post(n.sched, m)
}

// SendApp sends an app message (package appmsg's encoding) to the
// scheduler's customers over the control plane: the scheduler has no data
// plane. to must be the scheduler.
func (n *Member) SendApp(to node.ID, priority int32, payload []byte) error {
	if to != node.SchedulerID {
		return fmt.Errorf("cluster: app message over the control plane to %s, not the scheduler", to)
	}
	if len(payload) > control.MaxMessageLen-1024 {
		return fmt.Errorf("cluster: app message of %d bytes for the scheduler: the control plane carries at most %d", len(payload), control.MaxMessageLen-1024)
	}
	return n.SendScheduler(&control.Message{Command: control.App, Target: to, Seq: uint64(uint32(priority)), Body: payload})
}

// OnApp installs deliver, which takes the messages of the scheduler's
// customers to this node's (customer.ControlApps). It must not block.
func (n *Member) OnApp(deliver func(from node.ID, priority int32, payload []byte)) {
	n.onApp.Store(&deliver)
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
func (n *Member) Joined() bool {
	t := n.topo.Load()
	return t != nil && t.join
}

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
	n.run(func(c *core) ready { return c.fail(err, 0) })
}

// Barrier blocks until every node of group g has called Barrier the same
// number of times, the node fails, or ctx ends.
func (n *Member) Barrier(ctx context.Context, g node.Group) error {
	return n.barrier(ctx, g, 0)
}

func (n *Member) barrier(ctx context.Context, g node.Group, flags uint8) error {
	n.mu.Lock()
	m, err := n.core.barrier(g, flags)
	if err != nil {
		n.mu.Unlock()
		return err
	}
	ch := make(chan struct{})
	n.waiters[barrierKey{g, m.Seq}] = ch
	n.mu.Unlock()
	if err := n.plane.Send(n.sched, m); err != nil {
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
	n.mu.Lock()
	abort := n.core.abortVan()
	n.mu.Unlock()
	if abort {
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
			n.mu.Lock()
			forsake := n.core.forsakeScheduler()
			n.mu.Unlock()
			if forsake {
				n.plane.Forsake(n.sched)
			}
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
	n.run(func(c *core) ready { return c.step(m, time.Now()) })
}

// run calls f on the core under the lock, publishes the table it changed,
// and does the rest of what f's ready says once unlocked (see ready).
func (n *Member) run(f func(c *core) ready) ready {
	n.mu.Lock()
	r := f(n.core)
	if r.topo != nil {
		n.topo.Store(r.topo)
	}
	var release []chan struct{}
	for _, k := range r.release {
		if ch := n.waiters[k]; ch != nil {
			delete(n.waiters, k)
			release = append(release, ch)
		}
	}
	n.mu.Unlock()
	for _, l := range r.notes {
		n.log.Log(context.Background(), l.level, l.msg, l.args...)
	}
	for _, rj := range r.rejects {
		n.reject.Reject(rj.msg, rj.args...)
	}
	// Queued before any waiter wakes: a program that a failure wakes
	// may close the node (and the plane) at once, and the scheduler
	// must still hear why (NodeFailed), not a heartbeat's silence.
	if n.plane != nil {
		for _, m := range r.send {
			_ = n.plane.Send(n.sched, m)
		}
	}
	if r.fail != nil {
		n.err = r.fail
		close(n.failed)
		n.log.Error("node failed", "err", r.fail)
	}
	for _, ch := range release {
		close(ch)
	}
	if r.terminated {
		close(n.terminated)
	}
	if r.departed {
		close(n.departed)
	}
	for _, m := range r.apps {
		if f := n.onApp.Load(); f != nil {
			(*f)(m.Sender, int32(m.Seq), m.Body)
		} else {
			n.log.Warn("app message from the scheduler for a node without customers dropped")
		}
	}
	for _, m := range r.role {
		n.toRole(m)
	}
	if r.left != nil && n.onLeft != nil {
		if err := n.onLeft(r.left.id, r.left.graceful); err != nil {
			n.Fail(err)
		}
	}
	if r.dial != nil {
		n.dial(*r.dial)
	}
	if p := r.grace; p != nil {
		time.AfterFunc(lostPeerGrace, func() {
			n.run(func(c *core) ready { return c.graceOver(*p) })
		})
	}
	return r
}

// toRole hands m to roleLoop: a Layout message for OnLayout, any other
// for OnControl.
func (n *Member) toRole(m *control.Message) {
	if m.Command == control.Layout && n.onLayout == nil {
		return
	}
	if m.Command != control.Layout && n.onControl == nil {
		n.log.Warn("unexpected control message", "command", m.Command, "from", m.Sender)
		return
	}
	select { // roleLoop runs: Start starts it when OnControl or OnLayout is installed
	case n.forRole <- m:
	case <-n.stop:
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
	for {
		select {
		case <-n.stop:
			return
		case <-n.terminated:
			return
		case <-t.C:
		}
		n.run(func(c *core) ready { return c.tick(time.Now(), n.progress.Load()) })
	}
}

// join is a joining node's start, in place of the two start barriers:
// it tells the scheduler it has its table (the members then dial it),
// waits for every member to connect, and says so (the LB then gives it a
// share).
func (n *Member) join(ctx context.Context) error {
	if err := n.plane.Send(n.sched, &control.Message{Command: control.Joined, Sender: n.Self().ID, Seq: 0}); err != nil {
		return fmt.Errorf("cluster: join: %w", err)
	}
	if err := n.awaitMembers(ctx); err != nil {
		return fmt.Errorf("cluster: join: %w", err)
	}
	if err := n.plane.Send(n.sched, &control.Message{Command: control.Joined, Sender: n.Self().ID, Seq: 1}); err != nil {
		return fmt.Errorf("cluster: join: %w", err)
	}
	return nil
}

// joinRecheck is how often a joining node's wait for its members reads
// the node table again.
const joinRecheck = 100 * time.Millisecond

// awaitMembers waits until every server and worker of the node table
// but this one is connected. It follows the table: a member lost or gone
// meanwhile (NodeLeft; it may die between the scheduler's table and its
// dial) is no longer waited for, as the scheduler no longer waits for it
// to dial.
func (n *Member) awaitMembers(ctx context.Context) error {
	for {
		var members []node.ID
		for _, info := range n.Nodes() {
			if info.Role != node.Scheduler && info.ID != n.Self().ID {
				members = append(members, info.ID)
			}
		}
		try, cancel := context.WithTimeout(ctx, joinRecheck)
		err := n.van.AwaitPeers(try, members)
		expired := try.Err() != nil
		cancel()
		if err == nil {
			return nil
		}
		if !expired || ctx.Err() != nil {
			return fmt.Errorf("waiting for %d members to connect: %w", len(members), err)
		}
	}
}

// dial connects to a server or worker joining the running job (the
// core's welcome), and tells the scheduler once it has.
func (n *Member) dial(info node.Info) {
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
	n.run(func(c *core) ready { return c.peerLost(id, err) })
}
