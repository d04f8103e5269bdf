// Package scheduler runs the scheduler node of an fpt cluster: it registers
// the servers and workers, assigns their ids and hands everyone the node
// table, runs barriers, watches heartbeats, relays failures so that the
// whole cluster stops when one node dies, and terminates the cluster after
// the final barrier.
package scheduler

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/control"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/status"
)

// Serve runs the scheduler on plane (bound to cfg.RootPort, where the
// nodes look for it) until the cluster terminates (nil) or a node fails
// (an error naming it). With the LB on, every decision it makes is
// written to decisions as one line, saying which aggregator holds what
// share and why (nil: only logged). Serve closes plane before it returns.
// launch.Start is how a scheduler is started.
//
// A message is acted on only if its Sender is the node that registered
// over the connection it came from (control.Message.Origin); others are
// dropped and passed to onReject (nil: only logged, at a bounded rate).
// obs are told the members, the LB's decisions and the iterations.
func Serve(ctx context.Context, plane control.Transport, cfg config.Config, log *slog.Logger, decisions io.Writer, onReject func(reason string), obs Observers) (err error) {
	if log == nil {
		log = slog.Default()
	}
	sh := &shell{plane: plane, log: log, decisions: decisions, status: obs.Status, apps: obs.Apps}
	o := observer{Observers: obs, rec: status.NewRecorder(cfg.LB, cfg.HeartbeatTimeout, 0)}
	sh.c = newCore(cfg, log, node.Info{Host: cfg.RootURI, ControlPort: plane.Port()}, control.NewRejecter(log, onReject), o, time.Now())
	defer plane.Close()
	defer func() {
		o.rec.Stopped()
		sh.post(time.Now())
	}()
	defer func() { obs.Apps.end(err) }()
	log.Info("scheduler listening", "port", plane.Port(), "servers", cfg.NumServers, "workers", cfg.NumWorkers)
	if err := sh.register(ctx); err != nil {
		var sf *startFailedError
		if errors.As(err, &sf) {
			sh.refuseLate(ctx, err)
		}
		return err
	}
	return sh.serve(ctx, cfg.HeartbeatInterval, cfg.HeartbeatTimeout)
}

// shell does the scheduler's I/O for its core: it feeds it the plane's
// messages and the ticks, and sends, writes and posts what it says.
type shell struct {
	c         *core
	plane     control.Transport
	log       *slog.Logger
	decisions io.Writer     // nil: decisions are only logged
	status    *status.Board // nil: no status page
	apps      *Apps         // nil: no customers
}

// register feeds the core the registrations until the node table is
// out, or the start fails (its error).
func (sh *shell) register(ctx context.Context) error {
	deadline := time.NewTimer(time.Until(sh.c.deadline))
	defer deadline.Stop()
	for sh.c.registering {
		var r ready
		select {
		case <-ctx.Done():
			r = sh.c.interrupt(fmt.Errorf("scheduler: interrupted while registering: %w", ctx.Err()))
		case now := <-deadline.C:
			r = sh.c.tick(now)
		case m, ok := <-sh.plane.Incoming():
			if !ok {
				r = sh.c.interrupt(errors.New("scheduler: control plane closed"))
				break
			}
			r = sh.c.step(m, time.Now())
		}
		sh.do(r)
		if r.err != nil {
			return r.err
		}
	}
	return nil
}

// serve runs the started cluster until it terminates (nil) or fails.
func (sh *shell) serve(ctx context.Context, interval, timeout time.Duration) error {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		var r ready
		select {
		case <-ctx.Done():
			r = sh.c.interrupt(fmt.Errorf("scheduler: interrupted: %w", ctx.Err()))
		case now := <-tick.C:
			r = sh.c.tick(now)
		case m, ok := <-sh.plane.Incoming():
			if !ok {
				return errors.New("scheduler: control plane closed")
			}
			r = sh.c.step(m, time.Now())
		}
		sh.do(r)
		if r.terminate {
			sh.awaitEchoes(ctx, r.members, timeout)
			return nil
		}
		if r.err != nil {
			return r.err
		}
	}
}

// do sends, writes and posts what r says.
func (sh *shell) do(r ready) {
	for _, o := range r.sends {
		if err := sh.plane.Send(o.to.ControlEndpoint(), o.m); err != nil && !o.quiet {
			sh.log.Warn("control send failed", "to", o.to, "command", o.m.Command, "err", err)
		}
	}
	if sh.decisions != nil {
		for _, line := range r.decisions {
			fmt.Fprintln(sh.decisions, line)
		}
	}
	if r.publish {
		sh.post(time.Now())
	}
	if r.table != nil {
		sh.apps.started(r.table, sh.plane)
	}
	for _, m := range r.apps {
		sh.apps.received(m)
	}
}

// post publishes the status at now.
func (sh *shell) post(now time.Time) {
	if sh.status != nil {
		sh.status.Publish(sh.c.snapshot(now))
	}
}

// awaitEchoes waits, for at most timeout (or until ctx ends), for every
// member terminated to echo Terminate: a process that exits right after
// queueing a ZeroMQ message may lose it, and a node that never hears
// Terminate would wait for its heartbeat timeout and fail.
func (sh *shell) awaitEchoes(ctx context.Context, members []node.ID, timeout time.Duration) {
	waiting := make(map[node.ID]bool, len(members))
	for _, id := range members {
		waiting[id] = true
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for len(waiting) > 0 {
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			sh.log.Warn("nodes did not confirm termination", "nodes", len(waiting))
			return
		case m, ok := <-sh.plane.Incoming():
			if !ok {
				return
			}
			if sh.c.echoed(m) {
				delete(waiting, m.Sender)
			}
		}
	}
}
