package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/fptps/fpt/cluster"
	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/customer"
	"github.com/fptps/fpt/metrics"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/scheduler"
	"github.com/fptps/fpt/server"
	"github.com/fptps/fpt/status"
	"github.com/fptps/fpt/statusweb"
	"github.com/fptps/fpt/trace"
	"github.com/fptps/fpt/worker"
)

// Node is a started node of any role: the scheduler running in the
// background, a server serving, or a worker ready for its training
// program. It owns what the node serves besides the cluster: its metrics
// registry and HTTP server (FPT_METRICS_ADDR). The binaries (Run) and the
// C library (package capi) start every node through Start, so that a node
// behaves the same whichever program runs it.
type Node struct {
	cfg     config.Config
	log     *slog.Logger
	member  *cluster.Member // servers and workers
	server  *server.Server
	worker  *worker.Worker
	metrics *metrics.Server // nil without FPT_METRICS_ADDR
	// The scheduler's: its metrics (nil without FPT_METRICS_ADDR) and its
	// status page (nil without FPT_STATUS_ADDR).
	schedMetrics *metrics.Scheduler
	status       *statusweb.Server
	tracer       *trace.Recorder // nil without FPT_TRACE_FILE
	// board is the scheduler's status (its phase is its readiness); nil
	// without a status page or metrics.
	board *status.Board
	// started is set once Start succeeded; Ready reads it from the
	// metrics server's goroutines.
	started atomic.Bool

	// The scheduler's run: stop ends it, schedDone is closed when it
	// returned schedErr.
	stop      context.CancelFunc
	schedDone chan struct{}
	// schedCustomers are the scheduler's customers (ps-lite's apps on
	// the scheduler), over the control plane.
	schedCustomers *customer.Set
	schedErr       error

	closeOnce sync.Once
}

// Deps are what a node is given rather than what it makes for itself.
type Deps struct {
	// Log is the node's logger; nil: slog.Default().
	Log *slog.Logger
	// Decisions receives the scheduler's LB decisions, one line each (the
	// binaries and the C library pass stdout); nil: only logged.
	Decisions io.Writer
	// Planes are the node's transports; zero: the real ones,
	// cluster.Network(cfg, metrics). In-process clusters pass in-memory ones.
	Planes cluster.Planes
	// Lookup resolves the host names the node waits for before it starts
	// (the scheduler's); nil: the system's resolver.
	Lookup cluster.Lookup
	// Customers, for a worker, are its process's further worker
	// customers, which register beside it (nil: none).
	Customers *cluster.Customers
}

// Start starts the node cfg.Role names and returns once it runs: a server
// or worker once the whole cluster has started (ctx bounds that, as does
// FPT_START_TIMEOUT), the scheduler at once, running in the background
// until Finalize or Close, its outcome (a port taken, say) Finalize's.
// With cfg.MetricsAddr set the node serves its metrics there until it is
// finalized or closed. A failed Start has released everything it bound.
func Start(ctx context.Context, cfg config.Config, deps Deps) (*Node, error) {
	log := deps.Log
	if log == nil {
		log = slog.Default()
	}
	// FPT_START_TIMEOUT bounds the whole start: waiting for the names to
	// resolve, then for the cluster.
	ctx, cancel := context.WithTimeout(ctx, cfg.StartTimeout)
	defer cancel()
	planes := deps.Planes
	real := planes.Control == nil || planes.Data == nil
	n := &Node{cfg: cfg, log: log}
	if err := checkTraceDir(cfg); err != nil {
		return nil, err
	}
	// Metrics and probes first: /healthz answers while the node waits for
	// its peers.
	m, err := n.serveMetrics()
	if err != nil {
		return nil, err
	}
	if real {
		if err := awaitNames(ctx, cfg, log, deps.Lookup); err != nil {
			n.Close()
			return nil, fmt.Errorf("launch: %w", err)
		}
		// Protected mode: refuse a job across machines without a secret,
		// and say once how the node is exposed.
		_, warning, err := cluster.ListenHost(cfg)
		if err != nil {
			n.Close()
			return nil, fmt.Errorf("launch: %w", err)
		}
		if warning != "" {
			log.Warn(warning)
		}
		planes = cluster.Network(cfg, m)
	}
	switch cfg.Role {
	case node.Scheduler:
		board, err := n.serveStatus()
		if err != nil {
			n.Close()
			return nil, err
		}
		n.board = board
		n.startScheduler(ctx, planes, deps.Decisions, func(reason string) { m.Rejected("control", reason) },
			scheduler.Observers{Status: board, Metrics: n.schedMetrics, Apps: n.schedApps()})
		n.started.Store(true)
		return n, nil
	case node.Server:
		n.member = n.newMember(planes, m)
		n.server, err = server.Start(ctx, n.member)
	case node.Worker:
		n.member = n.newMember(planes, m)
		n.member.SetCustomers(deps.Customers)
		n.worker, err = worker.Start(ctx, n.member)
	default:
		err = fmt.Errorf("launch: no node of role %s", cfg.Role)
	}
	if err == nil {
		err = n.startTrace()
	}
	if err != nil {
		n.Close()
		return nil, err
	}
	n.started.Store(true)
	return n, nil
}

// Ready is nil when the node is a member of a running cluster: a server or
// worker whose Start returned, the scheduler once every node registered;
// else why not (starting, failed, the cluster terminated). It is what
// /readyz on the metrics port answers.
func (n *Node) Ready() error {
	if !n.started.Load() {
		return errors.New("starting: not a member of a running cluster yet")
	}
	select {
	case <-n.Done():
		if err := n.Err(); err != nil {
			return fmt.Errorf("failed: %w", err)
		}
		return errors.New("the cluster has terminated")
	default:
	}
	if n.board != nil {
		if p := n.board.Latest().Phase; p != "running" {
			return fmt.Errorf("the cluster is %s", p)
		}
	}
	return nil
}

// newMember makes a server's or worker's membership, with its metrics and,
// with FPT_TRACE_FILE, its timeline recorder.
func (n *Node) newMember(planes cluster.Planes, m *metrics.Node) *cluster.Member {
	mem := cluster.New(n.cfg, n.log, planes)
	mem.SetMetrics(m)
	if n.cfg.TraceFile != "" {
		n.tracer = trace.New(n.cfg.TraceIters, trace.DefaultCapacity)
		mem.SetTracer(n.tracer)
	}
	return mem
}

// checkTraceDir refuses, before the node joins, a trace file whose
// directory does not exist: the file itself is made only once the node
// knows its rank, when failing would stop the whole cluster.
func checkTraceDir(cfg config.Config) error {
	if cfg.TraceFile == "" || cfg.Role == node.Scheduler {
		return nil
	}
	dir := filepath.Dir(trace.Path(cfg.TraceFile, cfg.Role.String(), 0))
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return &config.VarError{Var: "FPT_TRACE_FILE", Value: cfg.TraceFile, Reason: "its directory " + dir + " does not exist"}
	}
	return nil
}

// startTrace opens the node's trace file, once the node knows its rank
// (the file's name may contain it); spans recorded meanwhile are queued.
func (n *Node) startTrace() error {
	if n.tracer == nil {
		return nil
	}
	self := n.member.Self()
	role := n.cfg.Role.String()
	path := trace.Path(n.cfg.TraceFile, role, self.ID.Rank())
	if err := n.tracer.Create(path, trace.Meta{Role: role, Rank: self.ID.Rank(), ID: uint32(self.ID), Host: self.Host}); err != nil {
		return fmt.Errorf("launch: %w", err)
	}
	n.log.Info("tracing the communication timeline", "file", path, "iterations", n.cfg.TraceIters.String())
	return nil
}

// serveMetrics makes the node's registry and serves it, when asked to: the
// metrics the cluster member records into (nil: none).
func (n *Node) serveMetrics() (*metrics.Node, error) {
	if n.cfg.MetricsAddr == "" {
		return nil, nil
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m, err := metrics.New(reg, n.cfg.Role)
	if err != nil {
		return nil, fmt.Errorf("launch: %w", err)
	}
	if n.cfg.Role == node.Scheduler {
		if n.schedMetrics, err = metrics.NewScheduler(reg); err != nil {
			return nil, fmt.Errorf("launch: %w", err)
		}
	}
	if n.metrics, err = metrics.ServeProbed(n.cfg.MetricsAddr, reg, n.Ready, n.log); err != nil {
		return nil, err
	}
	return m, nil
}

// serveStatus serves the scheduler's status page, when asked to, and
// returns the board the scheduler publishes to (nil: neither the page nor
// /readyz reads one). Without a
// secret or FPT_INSECURE it binds loopback only, as the nodes do.
func (n *Node) serveStatus() (*status.Board, error) {
	if n.cfg.StatusAddr == "" {
		if n.metrics != nil {
			// The board still tells /readyz when the cluster runs.
			return new(status.Board), nil
		}
		return nil, nil
	}
	addr, err := statusweb.ListenAddr(n.cfg.StatusAddr, n.cfg.Secret == "" && !n.cfg.Insecure)
	if err != nil {
		return nil, fmt.Errorf("launch: %w", err)
	}
	board := new(status.Board)
	if n.status, err = statusweb.Serve(addr, board, n.log); err != nil {
		return nil, err
	}
	n.log.Info("status page", "url", n.status.URL())
	return board, nil
}

// startScheduler runs the scheduler in the background. It gets a context of
// its own, keeping ctx's values but not its end: ctx bounds starting, and
// the scheduler runs until the cluster terminates, Finalize's context ends
// or Close.
func (n *Node) startScheduler(ctx context.Context, planes cluster.Planes, decisions io.Writer, rejected func(reason string), obs scheduler.Observers) {
	ctx, n.stop = context.WithCancel(context.WithoutCancel(ctx))
	n.schedDone = make(chan struct{})
	go func() {
		defer close(n.schedDone)
		plane, err := planes.Control(n.cfg.RootPort, n.log)
		if err != nil {
			n.schedErr = fmt.Errorf("scheduler: %w", bindError(n.cfg.RootPort, err))
			return
		}
		n.schedErr = scheduler.Serve(ctx, plane, n.cfg, n.log, decisions, rejected, obs)
	}()
}

// awaitNames waits until the names the node needs resolve: the
// scheduler's DMLC_PS_ROOT_URI (the scheduler's own, which it binds) and
// a server's or worker's DMLC_NODE_HOST. Under a cluster engine a node
// often starts before its peers' names, or its own, exist (a Kubernetes
// pod's headless-service name resolves once the pod runs), so a name that
// does not resolve yet is waited for, up to FPT_START_TIMEOUT, rather than
// refused.
func awaitNames(ctx context.Context, cfg config.Config, log *slog.Logger, lookup cluster.Lookup) error {
	if err := cluster.AwaitResolve(ctx, "DMLC_PS_ROOT_URI", cfg.RootURI, cfg.StartTimeout, log, lookup); err != nil {
		return err
	}
	if cfg.Role == node.Scheduler {
		return nil
	}
	return cluster.AwaitResolve(ctx, "DMLC_NODE_HOST", cfg.NodeHost, cfg.StartTimeout, log, lookup)
}

// bindError names DMLC_PS_ROOT_PORT in the scheduler's failure to listen,
// as a configuration error (exit 2) when the port or address cannot be
// had (in use, not this host's, privileged).
func bindError(port int, err error) error {
	for _, e := range []error{syscall.EADDRINUSE, syscall.EADDRNOTAVAIL, syscall.EACCES} {
		if errors.Is(err, e) {
			return &config.VarError{Var: "DMLC_PS_ROOT_PORT", Value: strconv.Itoa(port),
				Reason: fmt.Sprintf("the scheduler cannot listen: %v", err)}
		}
	}
	return fmt.Errorf("DMLC_PS_ROOT_PORT=%d: %w", port, err)
}

// Worker is the started worker, nil unless the node is one.
func (n *Node) Worker() *worker.Worker { return n.worker }

// Server is the node's server, nil unless it is one.
func (n *Node) Server() *server.Server { return n.server }

// Customers is the node's customers: a server's or worker's, or the
// scheduler's, whose messages travel over the control plane.
func (n *Node) Customers() *customer.Set {
	switch {
	case n.worker != nil:
		return n.worker.Customers()
	case n.server != nil:
		return n.server.Customers()
	}
	return n.schedCustomers
}

// schedApps makes the scheduler's customers and the port their messages
// go through.
func (n *Node) schedApps() *scheduler.Apps {
	apps := scheduler.NewApps(n.cfg, n.log)
	n.schedCustomers = customer.New(apps)
	return apps
}

// Member is a server's or worker's cluster membership, nil for the
// scheduler.
func (n *Node) Member() *cluster.Member { return n.member }

// Rank is the node's rank among the workers or the servers; 0 for the
// scheduler. A worker's is the one it started with (its dense rank of an
// iteration is worker.Worker.RankAt); a server's is dense at every moment
// (cluster.Member.ServerRank).
func (n *Node) Rank() int {
	switch {
	case n.member == nil:
		return 0
	case n.server != nil:
		return n.member.ServerRank()
	}
	return n.member.Self().ID.Rank()
}

// MetricsAddr is the address the node serves its metrics at (with the port
// chosen for port 0), or "" when it serves none.
func (n *Node) MetricsAddr() string {
	if n.metrics == nil {
		return ""
	}
	return n.metrics.Addr()
}

// StatusURL is the scheduler's status page (with the port chosen for port
// 0), or "" when it serves none.
func (n *Node) StatusURL() string {
	if n.status == nil {
		return ""
	}
	return n.status.URL()
}

// Done is closed when the node has failed or the cluster terminated (for
// the scheduler: when it returned).
func (n *Node) Done() <-chan struct{} {
	if n.member == nil {
		return n.schedDone
	}
	return n.member.Done()
}

// Err is why the node failed, or nil.
func (n *Node) Err() error {
	if n.member != nil {
		return n.member.Err()
	}
	select {
	case <-n.schedDone:
		return n.schedErr
	default:
		return nil
	}
}

// Finalize leaves the cluster in order: a worker waits for its outstanding
// requests and passes the final barrier; a server or the scheduler serves
// until the cluster terminates (the scheduler stops early if ctx ends).
// Then it stops serving metrics. It returns the node's failure, if any.
func (n *Node) Finalize(ctx context.Context) error {
	var err error
	switch {
	case n.worker != nil:
		err = n.worker.Finalize(ctx)
	case n.server != nil:
		err = n.server.Finalize(ctx)
	default:
		select {
		case <-n.schedDone:
		case <-ctx.Done():
			n.stop()
			<-n.schedDone
		}
		err = n.schedErr
	}
	n.Close()
	return err
}

// Fail leaves the cluster at once because of err: a server or worker
// reports it to the scheduler, which stops every other node.
func (n *Node) Fail(err error) {
	if n.member != nil {
		n.member.Fail(err)
	}
	n.Close()
}

// Close leaves at once, without the final barrier (after a failure, or
// after Finalize): it releases the node's sockets, stops the scheduler and
// stops serving metrics. It is idempotent.
func (n *Node) Close() {
	n.closeOnce.Do(func() {
		if n.member != nil {
			n.member.Close()
		}
		if n.stop != nil {
			n.stop()
			<-n.schedDone
		}
		if n.schedCustomers != nil {
			n.schedCustomers.Close()
		}
		if err := n.tracer.Close(); err != nil {
			n.log.Warn("closing the trace file", "err", err)
		} else if d := n.tracer.Dropped(); d > 0 {
			n.log.Warn("the trace file lacks spans: its queue was full", "dropped", d)
		}
		if n.metrics != nil {
			if err := n.metrics.Close(); err != nil {
				n.log.Warn("closing the metrics server", "err", err)
			}
		}
		if n.status != nil {
			if err := n.status.Close(); err != nil {
				n.log.Warn("closing the status page", "err", err)
			}
		}
	})
}
