// Package memcluster starts a whole fpt cluster in this process on the
// in-memory transports (control/memplane, van/memvan): the real scheduler,
// servers and workers, with no socket and no ZeroMQ context, so that tests
// of the worker, server and aggregator logic, of LB switching and of
// failure handling are fast and under the test's control (hold a node's
// frames, drop a node). The real-socket clusters (worker's cluster tests,
// internal/localcluster) remain the proof that the real transports work.
package memcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/fptps/fpt/cluster"
	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/control"
	"github.com/fptps/fpt/control/memplane"
	"github.com/fptps/fpt/customer"
	"github.com/fptps/fpt/launch"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/van"
	"github.com/fptps/fpt/van/memvan"
	"github.com/fptps/fpt/worker"
)

// schedulerPort is the scheduler's port on the in-memory control network.
const schedulerPort = 9000

// maxAdded bounds the servers AddServer may start in one cluster.
const maxAdded = 256

// Options describe a cluster.
type Options struct {
	Servers, Workers int
	// Env adds or overrides settings, as the environment would
	// (FPT_LB, FPT_PARTITION_BYTES...).
	Env map[string]string
	// Logger receives every node's log; nil discards it.
	Logger *slog.Logger
}

// Cluster is a running in-memory cluster.
type Cluster struct {
	// Control and Data are the networks the nodes are attached to: tests
	// hold or drop traffic through them.
	Control *memplane.Network
	Data    *memvan.Network
	// Workers are the workers, by rank.
	Workers []*worker.Worker

	nodesMu sync.Mutex         // guards nodes, which AddServer and AddWorker append to
	nodes   []*launch.Node     // the scheduler, servers and workers
	cancel  context.CancelFunc // ends every node's context
	ended   chan error         // the scheduler's and every server's end
	mu      sync.Mutex         // guards the two below, and taking from ended
	waiting int                // ends not yet taken from ended
	endErrs []error            // the errors they ended with
	killed  sync.Map           // *launch.Node → true: ended by Kill, its error expected
	stops   sync.Map           // *launch.Node → context.CancelFunc of the context it serves under (Interrupt)
	// add starts one more server or worker with the job's environment.
	add func(server bool) (*launch.Node, error)
}

// Start starts the scheduler, the servers and the workers, and returns
// once every worker has joined.
func Start(ctx context.Context, o Options) (*Cluster, error) {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	env := map[string]string{
		"DMLC_PS_ROOT_URI":  "127.0.0.1",
		"DMLC_PS_ROOT_PORT": strconv.Itoa(schedulerPort),
		"DMLC_NODE_HOST":    "127.0.0.1",
		"DMLC_NUM_SERVER":   strconv.Itoa(o.Servers),
		"DMLC_NUM_WORKER":   strconv.Itoa(o.Workers),
		"FPT_START_TIMEOUT": "30",
		// Two iterations ahead, however short: in memory an iteration
		// takes microseconds, and tests count in iterations when a
		// decision lands (o.Env may say otherwise).
		"FPT_LB_AHEAD": "0",
	}
	maps.Copy(env, o.Env)
	cfgFor := func(role string) (config.Config, error) {
		env["DMLC_ROLE"] = role
		cfg, err := config.FromEnv(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
		if err != nil {
			return cfg, fmt.Errorf("memcluster: %w", err)
		}
		return cfg, nil
	}
	scfg, err := cfgFor("scheduler")
	if err != nil {
		return nil, err
	}
	srvCfg, err := cfgFor("server")
	if err != nil {
		return nil, err
	}
	wCfg, err := cfgFor("worker")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	c := &Cluster{
		cancel:  cancel,
		Control: memplane.NewNetwork(),
		Data:    memvan.NewNetwork(),
		ended:   make(chan error, o.Servers+1+maxAdded),
		waiting: o.Servers + 1,
	}
	deps := func(role string, i int) launch.Deps {
		return launch.Deps{
			Log: log.With("node", role, "started", i),
			Planes: cluster.Planes{
				Control: func(port int, log *slog.Logger) (control.Transport, error) { return c.Control.Listen(port, log) },
				Data:    func(cfg van.Config) (van.Transport, error) { return c.Data.Listen(cfg) },
			},
		}
	}
	// Every node starts as a real one does (launch.Start); the scheduler
	// and the servers then serve until Finish or Close.
	serve := func(n *launch.Node) {
		nctx, stop := context.WithCancel(ctx)
		defer stop()
		c.stops.Store(n, stop)
		err := n.Finalize(nctx)
		if _, killed := c.killed.Load(n); killed {
			err = nil
		}
		c.ended <- err
	}
	sched, err := launch.Start(ctx, scfg, deps("scheduler", 0))
	if err != nil {
		cancel()
		return nil, err
	}
	c.nodes = append(c.nodes, sched)
	go serve(sched)
	type started struct {
		server bool
		n      *launch.Node
		err    error
	}
	starts := make(chan started, o.Servers+o.Workers)
	for i := range o.Servers {
		go func() {
			n, err := launch.Start(ctx, srvCfg, deps("server", i))
			starts <- started{true, n, err}
		}()
	}
	for i := range o.Workers {
		go func() {
			n, err := launch.Start(ctx, wCfg, deps("worker", i))
			starts <- started{false, n, err}
		}()
	}
	added := 0
	c.add = func(server bool) (*launch.Node, error) {
		c.nodesMu.Lock()
		i := o.Servers + o.Workers + added
		if added >= maxAdded {
			c.nodesMu.Unlock()
			return nil, fmt.Errorf("memcluster: more than %d nodes added", maxAdded)
		}
		added++
		c.nodesMu.Unlock()
		if !server {
			n, err := launch.Start(ctx, wCfg, deps("worker", i))
			if err != nil {
				return nil, err
			}
			c.nodesMu.Lock()
			c.nodes = append(c.nodes, n)
			c.Workers = append(c.Workers, n.Worker())
			c.nodesMu.Unlock()
			return n, nil
		}
		c.mu.Lock()
		c.waiting++
		c.mu.Unlock()
		n, err := launch.Start(ctx, srvCfg, deps("server", i))
		if err != nil {
			c.ended <- err
			return nil, err
		}
		c.nodesMu.Lock()
		c.nodes = append(c.nodes, n)
		c.nodesMu.Unlock()
		go serve(n)
		return n, nil
	}
	var errs []error
	byRank := make([]*worker.Worker, o.Workers)
	for range o.Servers + o.Workers {
		s := <-starts
		if s.err != nil {
			// The others stop starting too (their context ends) rather
			// than wait out the start timeout; a server's failed start is
			// its end.
			cancel()
			errs = append(errs, s.err)
			if s.server {
				c.ended <- s.err
			}
			continue
		}
		c.nodes = append(c.nodes, s.n)
		if w := s.n.Worker(); w != nil {
			byRank[w.Rank()] = w
		} else {
			go serve(s.n)
		}
	}
	if len(errs) > 0 {
		c.Close()
		return nil, fmt.Errorf("memcluster: start: %w", errors.Join(errs...))
	}
	c.Workers = byRank
	return c, nil
}

// all is a copy of the nodes started so far.
func (c *Cluster) all() []*launch.Node {
	c.nodesMu.Lock()
	defer c.nodesMu.Unlock()
	return slices.Clone(c.nodes)
}

// Member is the membership of node id (a server or a worker), nil if none.
func (c *Cluster) Member(id node.ID) *cluster.Member {
	for _, n := range c.all() {
		if m := n.Member(); m != nil && m.Self().ID == id {
			return m
		}
	}
	return nil
}

// Customers is the customer set of node id (a server or a worker), nil
// if none.
func (c *Cluster) Customers(id node.ID) *customer.Set {
	for _, n := range c.all() {
		if m := n.Member(); m != nil && m.Self().ID == id {
			return n.Customers()
		}
	}
	return nil
}

// ControlPort is node id's port on the control network (Control's Hold
// and Drop take ports), 0 for an unknown node.
func (c *Cluster) ControlPort(id node.ID) int {
	if id == node.SchedulerID {
		return schedulerPort
	}
	if m := c.Member(id); m != nil {
		return m.Self().ControlPort
	}
	return 0
}

// Drop cuts node id off both networks, as if its host vanished: its data
// connections break (every peer sees it lost) and its control messages are
// lost both ways. Its goroutines carry on until Close.
func (c *Cluster) Drop(id node.ID) error {
	m := c.Member(id)
	if m == nil {
		return fmt.Errorf("memcluster: no node %s", id)
	}
	c.Control.Drop(c.ControlPort(id))
	c.Data.Drop(id)
	return nil
}

// AddServer starts a server with the job's environment while the job
// runs, as a launcher would start one more process, and returns its id
// once it has joined.
func (c *Cluster) AddServer() (node.ID, error) {
	n, err := c.add(true)
	if err != nil {
		return 0, err
	}
	return n.Member().Self().ID, nil
}

// AddWorker starts a worker with the job's environment while the job
// runs, as a launcher would start one more process, and returns it once
// it has joined (its Init then waits for the parameters). It is appended
// to Workers: do not read Workers while AddWorker runs.
func (c *Cluster) AddWorker() (*worker.Worker, error) {
	n, err := c.add(false)
	if err != nil {
		return nil, err
	}
	return n.Worker(), nil
}

// Kill ends server or worker id as kill -9 would: it is cut off both
// networks (every peer sees its connections break, its control messages
// are lost) and closed; its end no longer counts as an error in Finish or
// Ends, and Finish does not finalize it.
func (c *Cluster) Kill(id node.ID) error {
	var victim *launch.Node
	for _, n := range c.all() {
		if m := n.Member(); m != nil && m.Self().ID == id && id != node.SchedulerID {
			victim = n
		}
	}
	if victim == nil {
		return fmt.Errorf("memcluster: no server or worker %s", id)
	}
	c.killed.Store(victim, true)
	if err := c.Drop(id); err != nil {
		return err
	}
	victim.Close()
	return nil
}

// Interrupt ends the context server id serves under, as SIGTERM ends a
// server process's: under FPT_ON_SERVER_LOSS=retry it leaves the job in
// order (server.Server.Leave), and its end (nil once it left) counts in
// Finish and Ends like any server's.
func (c *Cluster) Interrupt(id node.ID) error {
	for _, n := range c.all() {
		if m := n.Member(); m != nil && m.Self().ID == id && n.Server() != nil {
			if stop, ok := c.stops.Load(n); ok {
				stop.(context.CancelFunc)()
				return nil
			}
		}
	}
	return fmt.Errorf("memcluster: no serving server %s", id)
}

// Finish finalizes every worker not killed, then waits for the servers
// and the scheduler to end; it returns the first error of any.
func (c *Cluster) Finish(ctx context.Context) error {
	var wg sync.WaitGroup
	errs := make([]error, len(c.Workers))
	for i, w := range c.Workers {
		if c.isKilled(w) {
			continue
		}
		wg.Go(func() {
			if err := w.Finalize(ctx); err != nil {
				errs[i] = fmt.Errorf("worker %d: %w", i, err)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return c.awaitEnds(ctx)
}

// isKilled reports whether worker w was ended by Kill.
func (c *Cluster) isKilled(w *worker.Worker) bool {
	for _, n := range c.all() {
		if n.Worker() == w {
			_, killed := c.killed.Load(n)
			return killed
		}
	}
	return false
}

// Ends waits for the scheduler and every server to end, and returns their
// errors (nil ones left out); it may be called again, after Close too.
func (c *Cluster) Ends(ctx context.Context) ([]error, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.waiting > 0 {
		select {
		case err := <-c.ended:
			c.waiting--
			if err != nil {
				c.endErrs = append(c.endErrs, err)
			}
		case <-ctx.Done():
			return slices.Clone(c.endErrs), fmt.Errorf("memcluster: %d of the scheduler and servers still running: %w", c.waiting, ctx.Err())
		}
	}
	return slices.Clone(c.endErrs), nil
}

func (c *Cluster) awaitEnds(ctx context.Context) error {
	errs, err := c.Ends(ctx)
	if err != nil {
		return err
	}
	return errors.Join(errs...)
}

// Close ends the cluster at once, wherever it is: it cancels every node's
// context, closes every member, and waits up to a minute for the servers
// and the scheduler to return. It may follow Finish.
func (c *Cluster) Close() {
	c.cancel()
	for _, n := range c.all() {
		n.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, _ = c.Ends(ctx)
}
