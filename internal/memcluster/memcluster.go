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
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/scheduler"
	"github.com/fptps/fpt/server"
	"github.com/fptps/fpt/van"
	"github.com/fptps/fpt/van/memvan"
	"github.com/fptps/fpt/worker"
)

// schedulerPort is the scheduler's port on the in-memory control network.
const schedulerPort = 9000

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

	members []*cluster.Member  // servers and workers
	cancel  context.CancelFunc // ends every node's context
	ended   chan error         // the scheduler's and every server's end
	mu      sync.Mutex         // guards the two below, and taking from ended
	waiting int                // ends not yet taken from ended
	endErrs []error            // the errors they ended with
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
		ended:   make(chan error, o.Servers+1),
		waiting: o.Servers + 1,
	}
	planes := cluster.Planes{
		Control: func(port int, log *slog.Logger) (control.Transport, error) { return c.Control.Listen(port, log) },
		Data:    func(cfg van.Config) (van.Transport, error) { return c.Data.Listen(cfg) },
	}
	splane, err := c.Control.Listen(scfg.RootPort, log)
	if err != nil {
		cancel()
		return nil, err
	}
	go func() { c.ended <- scheduler.Serve(ctx, splane, scfg, log.With("node", "scheduler"), nil) }()
	for i := range o.Servers {
		m := cluster.New(srvCfg, log.With("node", "server", "started", i), planes)
		c.members = append(c.members, m)
		go func() { c.ended <- server.Run(ctx, m) }()
	}
	type started struct {
		w   *worker.Worker
		err error
	}
	ws := make(chan started, o.Workers)
	for i := range o.Workers {
		m := cluster.New(wCfg, log.With("node", "worker", "started", i), planes)
		c.members = append(c.members, m)
		go func() {
			w, err := worker.Start(ctx, m)
			ws <- started{w, err}
		}()
	}
	var errs []error
	byRank := make([]*worker.Worker, o.Workers)
	for range o.Workers {
		s := <-ws
		if s.err != nil {
			errs = append(errs, s.err)
			continue
		}
		byRank[s.w.Rank()] = s.w
	}
	if len(errs) > 0 {
		c.Close()
		return nil, fmt.Errorf("memcluster: start: %w", errors.Join(errs...))
	}
	c.Workers = byRank
	return c, nil
}

// Member is the membership of node id (a server or a worker), nil if none.
func (c *Cluster) Member(id node.ID) *cluster.Member {
	for _, m := range c.members {
		if m.Self().ID == id {
			return m
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

// Finish finalizes every worker, then waits for the servers and the
// scheduler to end; it returns the first error of any.
func (c *Cluster) Finish(ctx context.Context) error {
	var wg sync.WaitGroup
	errs := make([]error, len(c.Workers))
	for i, w := range c.Workers {
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
	for _, m := range c.members {
		m.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, _ = c.Ends(ctx)
}
