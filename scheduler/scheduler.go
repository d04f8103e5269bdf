// Package scheduler runs the scheduler node of an fpt cluster: it registers
// the servers and workers, assigns their ids and hands everyone the node
// table, runs barriers, watches heartbeats, relays failures so that the
// whole cluster stops when one node dies, and terminates the cluster after
// the final barrier.
package scheduler

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/fptps/fpt/classic"
	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/control"
	"github.com/fptps/fpt/lb"
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
func Serve(ctx context.Context, plane control.Transport, cfg config.Config, log *slog.Logger, decisions io.Writer, onReject func(reason string), obs Observers) error {
	if log == nil {
		log = slog.Default()
	}
	s := &sched{cfg: cfg, log: log, plane: plane, decisions: decisions, reject: control.NewRejecter(log, onReject),
		obs: observer{Observers: obs, rec: status.NewRecorder(cfg.LB, cfg.HeartbeatTimeout, 0)}}
	defer plane.Close()
	defer func() {
		s.obs.rec.Stopped()
		s.publish(time.Now())
	}()
	log.Info("scheduler listening", "port", plane.Port(), "servers", cfg.NumServers, "workers", cfg.NumWorkers)
	reg := registry{servers: cfg.NumServers, workers: cfg.NumWorkers}
	if err := s.register(ctx, &reg); err != nil {
		// Registered nodes have no table yet: tell them directly, or they
		// wait out their own start timeout.
		for _, info := range reg.pending {
			_ = s.plane.Send(info.ControlEndpoint(), &control.Message{Command: control.NodeFailed, Sender: node.SchedulerID, Target: node.SchedulerID, Text: err.Error()})
		}
		var sf *startFailedError
		if errors.As(err, &sf) {
			s.refuseLate(ctx, err)
		}
		return err
	}
	return s.serve(ctx)
}

type sched struct {
	cfg      config.Config
	log      *slog.Logger
	plane    control.Transport
	table    []node.Info
	byID     map[node.ID]node.Info
	lastSeen map[node.ID]time.Time
	lb       *lb.Balancer // nil when the LB is off
	// serversDirected says whether the servers were sent a directive,
	// serversShaping the Shaping of the last one (lb.Directive.ForServers).
	serversDirected, serversShaping bool
	decisions                       io.Writer // nil: decisions are only logged
	byOrigin                        map[string]node.ID
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
	// finalSeq is the final barrier's number, once a member reached it.
	finalSeq  uint64
	finalSeen bool
	// lateSince: since when the only members missing from the final
	// barrier are workers that joined too late to train (tooLate).
	lateSince time.Time
	reject    *control.Rejecter
	obs       observer
}

func (s *sched) register(ctx context.Context, reg *registry) error {
	deadline := time.NewTimer(s.cfg.StartTimeout)
	defer deadline.Stop()
	for !reg.complete() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("scheduler: interrupted while registering: %w", ctx.Err())
		case <-deadline.C:
			return fmt.Errorf("scheduler: only %d of %d servers and %d of %d workers registered within %s",
				reg.count(node.Server), s.cfg.NumServers, reg.count(node.Worker), s.cfg.NumWorkers, s.cfg.StartTimeout)
		case m, ok := <-s.plane.Incoming():
			if !ok {
				return errors.New("scheduler: control plane closed")
			}
			if m.Command == control.NodeFailed {
				return startFailure(m)
			}
			if m.Command != control.AddNode || len(m.Nodes) != 1 {
				s.log.Debug("ignoring message while registering", "command", m.Command)
				continue
			}
			info := m.Nodes[0]
			if err := reg.add(info, m.Origin); err != nil {
				// Two nodes pinned to one rank: no later registration
				// mends that, so the start fails now, naming both.
				var re *rankError
				if errors.As(err, &re) {
					_ = s.plane.Send(info.ControlEndpoint(), &control.Message{Command: control.NodeFailed, Sender: node.SchedulerID, Text: "registration refused: " + err.Error()})
					return &startFailedError{fmt.Errorf("scheduler: registration refused: %w", err)}
				}
				// Never tell a registered node it was refused: the AddNode
				// naming its address may come from someone else.
				if reg.registered(info) {
					s.reject.Reject("register", "node", info, "err", err)
					continue
				}
				s.log.Warn("registration refused", "node", info, "err", err)
				_ = s.plane.Send(info.ControlEndpoint(), &control.Message{Command: control.NodeFailed, Sender: node.SchedulerID, Text: "registration refused: " + err.Error()})
				continue
			}
			s.log.Info("node registered", "node", info, "servers", reg.count(node.Server), "workers", reg.count(node.Worker))
		}
	}
	s.table = reg.assign(node.Info{Host: s.cfg.RootURI, ControlPort: s.plane.Port()})
	s.servers, s.workers = s.cfg.NumServers, s.cfg.NumWorkers
	s.byID = make(map[node.ID]node.Info, len(s.table))
	s.lastSeen = make(map[node.ID]time.Time, len(s.table))
	s.byOrigin = make(map[string]node.ID, len(s.table))
	now := time.Now()
	for _, info := range s.table {
		s.byID[info.ID] = info
		if info.ID != node.SchedulerID {
			s.lastSeen[info.ID] = now
			s.byOrigin[reg.originOf(info)] = info.ID
		}
	}
	var servers []node.ID
	s.stamp = uint64(now.UnixNano())
	for _, info := range s.table[1:] {
		s.send(info.ID, &control.Message{Command: control.NodeTable, Recipient: info.ID, Nodes: s.table, Body: binary.LittleEndian.AppendUint64(nil, s.stamp)})
		if info.Role == node.Server {
			servers = append(servers, info.ID)
		}
	}
	s.layout = classic.Initial(servers) // as every node derives it from the table
	s.log.Info("node table sent", "nodes", len(s.table))
	// A retry after a lost node rides on the LB's grants, so it runs
	// them even with the LB off (fixed at the even split).
	if s.cfg.Grants() {
		if err := s.startLB(); err != nil {
			return err
		}
	}
	s.started(now)
	return nil
}

func (s *sched) serve(ctx context.Context) error {
	bars := newBarriers(s.table)
	stalls := newStallWatch(s.cfg.StallTimeout, s.workerIDs(), time.Now())
	tick := time.NewTicker(s.cfg.HeartbeatInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			err := fmt.Errorf("scheduler: interrupted: %w", ctx.Err())
			s.abort(err.Error())
			return err
		case now := <-tick.C:
			s.publish(now)
			for id, seen := range s.lastSeen {
				if silent := now.Sub(seen); silent > s.cfg.HeartbeatTimeout {
					why := fmt.Sprintf("no heartbeat for %s", silent.Round(time.Millisecond))
					handled, final := s.lose(bars, stalls, id, why)
					if final != nil {
						s.terminate(ctx, final)
						return nil
					}
					if !handled {
						return s.failed(id, why)
					}
				}
			}
			if err := s.waitExpired(now); err != nil {
				return err
			}
			s.leaveDeferred(bars, stalls)
			if final := s.tooLate(bars, now); final != nil {
				s.log.Info("final barrier passed; terminating the cluster")
				s.terminate(ctx, final)
				return nil
			}
			if st, stalled := stalls.check(now); stalled {
				// Under FPT_ON_WORKER_LOSS=continue a stalled worker is
				// lost like a dead one; it is told so, since it is alive.
				why := st.reason()
				info := s.byID[st.worker]
				handled, final := s.lose(bars, stalls, st.worker, why)
				if final != nil {
					s.terminate(ctx, final)
					return nil
				}
				if !handled {
					return s.stalled(st)
				}
				_ = s.plane.Send(info.ControlEndpoint(), &control.Message{Command: control.NodeFailed, Sender: node.SchedulerID, Target: st.worker, Text: why})
			}
		case m, ok := <-s.plane.Incoming():
			if !ok {
				return errors.New("scheduler: control plane closed")
			}
			if m.Command == control.AddNode {
				// A server or worker joining the running job: the only
				// message a connection of no member may send.
				s.admit(bars, m)
				continue
			}
			if !s.authentic(m) {
				continue
			}
			s.lastSeen[m.Sender] = time.Now()
			switch m.Command {
			case control.Heartbeat:
				if _, known := s.lastSeen[m.Sender]; known {
					// A worker's heartbeat carries the iterations it has pushed.
					stalls.report(m.Sender, m.Seq, time.Now())
					s.send(m.Sender, &control.Message{Command: control.HeartbeatAck, Sender: node.SchedulerID})
				}
			case control.Barrier:
				if m.Flags&control.FlagFinal != 0 && m.Group == node.AllGroup {
					s.finalSeq, s.finalSeen = m.Seq, true
				}
				release, err := bars.arrive(m.Sender, m.Group, m.Seq)
				if err != nil {
					s.reject.Reject("barrier", "from", m.Sender, "err", err)
					continue
				}
				if release == nil && m.Flags&control.FlagFinal != 0 && m.Group == node.AllGroup {
					s.tooLate(bars, time.Now()) // starts its grace
				}
				if release == nil {
					continue
				}
				if m.Flags&control.FlagFinal != 0 && m.Group == node.AllGroup {
					s.log.Info("final barrier passed; terminating the cluster")
					s.terminate(ctx, release)
					return nil
				}
				for _, id := range release {
					s.send(id, &control.Message{Command: control.BarrierDone, Sender: node.SchedulerID, Group: m.Group, Seq: m.Seq})
				}
				if m.Group == node.AllGroup && m.Seq >= startBarrier {
					s.running = true
				}
			case control.NodeFailed:
				target := culprit(m, s.table)
				if _, member := s.byID[target]; !member && s.left[target] {
					continue // a peer's report of a node that already left
				}
				handled, final := s.lose(bars, stalls, target, m.Text)
				if final != nil {
					s.terminate(ctx, final)
					return nil
				}
				if !handled {
					return s.failed(target, m.Text)
				}
			case control.Report:
				s.report(m)
				s.leaveDeferred(bars, stalls) // a join may have taken effect
			case control.Joined:
				s.joined(bars, stalls, m)
			case control.Leave:
				if final := s.leave(bars, stalls, m); final != nil {
					s.terminate(ctx, final)
					return nil
				}
			default:
				s.log.Warn("unexpected control message", "command", m.Command, "from", m.Sender)
			}
		}
	}
}

// terminate sends Terminate to every node and waits, for a bounded time
// (or until ctx ends), for each to echo it: a process that exits right
// after queueing a ZeroMQ message may lose it, and a node that never
// hears Terminate would wait for its heartbeat timeout and fail.
func (s *sched) terminate(ctx context.Context, ids []node.ID) {
	waiting := make(map[node.ID]bool, len(ids))
	for _, id := range ids {
		waiting[id] = true
		s.send(id, &control.Message{Command: control.Terminate, Sender: node.SchedulerID})
	}
	deadline := time.NewTimer(s.cfg.HeartbeatTimeout)
	defer deadline.Stop()
	for len(waiting) > 0 {
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			s.log.Warn("nodes did not confirm termination", "nodes", len(waiting))
			return
		case m, ok := <-s.plane.Incoming():
			if !ok {
				return
			}
			if m.Command == control.Terminate && s.authentic(m) {
				delete(waiting, m.Sender)
			}
		}
	}
}

// authentic reports whether m comes from the connection its Sender
// registered over; it refuses (counts and logs) the others.
func (s *sched) authentic(m *control.Message) bool {
	id, ok := s.byOrigin[m.Origin]
	switch {
	case !ok:
		s.reject.Reject("stranger", "command", m.Command, "claims", m.Sender)
		return false
	case m.Sender == 0 && m.Command == control.NodeFailed:
		// A node that rejected the node table does not know its id; its
		// connection does.
		m.Sender = id
	case id != m.Sender:
		s.reject.Reject("sender", "command", m.Command, "claims", m.Sender, "connection_of", id)
		return false
	}
	return true
}

// failed tells every node that target died, and ends the scheduler.
func (s *sched) failed(target node.ID, reason string) error {
	name := target.String()
	if info, ok := s.byID[target]; ok {
		name = info.String()
	}
	s.log.Error("node failed; stopping the cluster", "node", name, "reason", reason)
	for _, info := range s.table[1:] {
		if info.ID != target {
			s.send(info.ID, &control.Message{Command: control.NodeFailed, Sender: node.SchedulerID, Target: target, Text: reason})
		}
	}
	return fmt.Errorf("scheduler: %s failed: %s", name, reason)
}

// abort tells every known node that the scheduler is giving up.
func (s *sched) abort(reason string) {
	for _, info := range s.table {
		if info.ID != node.SchedulerID {
			s.send(info.ID, &control.Message{Command: control.NodeFailed, Sender: node.SchedulerID, Target: node.SchedulerID, Text: reason})
		}
	}
}

func (s *sched) send(id node.ID, m *control.Message) {
	info, ok := s.byID[id]
	if !ok {
		return
	}
	if err := s.plane.Send(info.ControlEndpoint(), m); err != nil {
		s.log.Warn("control send failed", "to", info, "command", m.Command, "err", err)
	}
}
