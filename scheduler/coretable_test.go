package scheduler

import (
	"github.com/fptps/fpt/status"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/control"
	"github.com/fptps/fpt/node"
)

var (
	s0, s1     = node.ServerID(0), node.ServerID(1)
	w0, w1, w2 = node.WorkerID(0), node.WorkerID(1), node.WorkerID(2)
)

func beat(id node.ID) *control.Message {
	return &control.Message{Command: control.Heartbeat, Sender: id}
}

// ticks is a tick every second from from to to (both included), each
// producing nothing.
func ticks(from, to time.Duration) []in {
	var out []in
	for at := from; at <= to; at += time.Second {
		out = append(out, tick(at))
	}
	return out
}

// TestCoreSilence: a member silent for longer than the heartbeat timeout
// is lost (under retry a server leaves the job: the others hear NodeLeft,
// the layout without it and the retry; by default the job fails, every
// other member told), while members whose heartbeats come are
// acknowledged and stay.
func TestCoreSilence(t *testing.T) {
	cases := []struct {
		name  string
		retry bool
		ins   []in
	}{
		{"beating members stay", false, cat2(
			[]in{msg(5*time.Second, beat(s0), "S0 HEARTBEAT_ACK"), msg(5*time.Second, beat(s1), "S1 HEARTBEAT_ACK"), msg(5*time.Second, beat(w0), "W0 HEARTBEAT_ACK")},
			ticks(time.Second, 15*time.Second),
		)},
		{"retry: a silent server leaves", true, cat2(
			[]in{msg(5*time.Second, beat(s0), "S0 HEARTBEAT_ACK"), msg(5*time.Second, beat(w0), "W0 HEARTBEAT_ACK")},
			ticks(time.Second, 10*time.Second),
			[]in{tick(11*time.Second, "S0 NODE_LEFT S1", "W0 NODE_LEFT S1", "S0 LAYOUT", "W0 LAYOUT", "S0 DECISION retry", "W0 DECISION retry")},
			ticks(12*time.Second, 15*time.Second),
		)},
		{"fail: a silent server ends the job", false, cat2(
			[]in{msg(5*time.Second, beat(s0), "S0 HEARTBEAT_ACK"), msg(5*time.Second, beat(w0), "W0 HEARTBEAT_ACK")},
			ticks(time.Second, 10*time.Second),
			[]in{tick(11*time.Second, "S0 NODE_FAILED S1", "W0 NODE_FAILED S1", "error: server1(10)@10.0.2.1:9100 failed: no heartbeat for 11s")},
		)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Config{NumServers: 2, NumWorkers: 1, HeartbeatInterval: time.Second, HeartbeatTimeout: 10 * time.Second,
				StartTimeout: time.Minute, RetryServerLoss: tc.retry}
			startCore(t, cfg, true).feed(tc.ins)
		})
	}
}

func cat2(parts ...[]in) []in {
	var out []in
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func leave(id node.ID, seq uint64) *control.Message {
	return &control.Message{Command: control.Leave, Sender: id, Seq: seq}
}

func final(id node.ID) *control.Message {
	return &control.Message{Command: control.Barrier, Flags: control.FlagFinal, Sender: id, Group: node.AllGroup, Seq: startBarrier + 1}
}

// TestCoreServerLeave: a server that asks to leave (Leave, Seq 0) under
// FPT_ON_SERVER_LOSS=retry is taken out of the classic layout and the
// LB's decisions at once (every member, the leaver too, hears the layout
// without it, then the retry decision), but stays a member: the final
// barrier still counts it. Ready (Seq 1), it leaves: every member and the
// leaver hear NodeLeft marked graceful, and the final barrier passes
// without it. Where it could not be lost (policy fail, the last server,
// before the start) it is told why with NodeFailed, and the others hear
// nothing.
func TestCoreServerLeave(t *testing.T) {
	all := []node.ID{s0, s1, w0, w1}
	left := []string{"S1 NODE_LEFT S1 graceful", "S0 NODE_LEFT S1 graceful", "W0 NODE_LEFT S1 graceful", "W1 NODE_LEFT S1 graceful"}
	leaving := cat(each("LAYOUT", all...), each("DECISION retry", all...))
	cases := []struct {
		name             string
		retry            bool
		servers, workers int
		started          bool
		ins              []in
	}{
		{"retry: it leaves in order", true, 2, 2, true, []in{
			msg(0, leave(s1, 0), leaving...),
			msg(0, final(s0)), msg(0, final(w0)), msg(0, final(w1)),
			msg(0, leave(s1, 1), cat(left, each("TERMINATE", s0, w0, w1), []string{"terminate S0 W0 W1"})...),
		}},
		{"retry: the job ends while it leaves", true, 2, 2, true, []in{
			msg(0, final(s1)),
			msg(0, leave(s1, 0), leaving...),
			msg(0, final(s0)), msg(0, final(w0)),
			msg(0, final(w1), cat(each("TERMINATE", all...), []string{"terminate S0 S1 W0 W1"})...),
		}},
		{"retry: a leave it did not ask for is refused", true, 2, 2, true, []in{
			msg(0, leave(s1, 1)),
			msg(0, leave(w0, 0)),
			msg(0, leave(s1, 2)),
		}},
		{"fail (default): refused", false, 2, 2, true, []in{
			msg(0, leave(s1, 0), "S1 NODE_FAILED S1"),
		}},
		{"retry, the last server: refused", true, 1, 2, true, []in{
			msg(0, leave(s0, 0), "S0 NODE_FAILED S0"),
		}},
		{"retry, before the start: refused", true, 2, 2, false, []in{
			msg(0, leave(s1, 0), "S1 NODE_FAILED S1"),
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Config{NumServers: tc.servers, NumWorkers: tc.workers, HeartbeatInterval: time.Second, HeartbeatTimeout: 10 * time.Second,
				StartTimeout: time.Minute, RetryServerLoss: tc.retry}
			startCore(t, cfg, tc.started).feed(tc.ins)
		})
	}
}

func pushed(id node.ID, n uint64) *control.Message {
	return &control.Message{Command: control.Heartbeat, Sender: id, Seq: n}
}

// TestCoreStall: a worker behind the others that pushes nothing for
// FPT_STALL_TIMEOUT ends the job, every node told (the stalled one too:
// it is alive), naming the iteration it did not push; one that keeps
// pushing, however far behind, is not stalled.
func TestCoreStall(t *testing.T) {
	cases := []struct {
		name string
		ins  []in
	}{
		{"stalled", cat2(
			[]in{msg(time.Second, pushed(w0, 3), "W0 HEARTBEAT_ACK"), msg(time.Second, pushed(w1, 1), "W1 HEARTBEAT_ACK")},
			ticks(time.Second, 6*time.Second),
			[]in{tick(7*time.Second, "S0 NODE_FAILED W1", "W0 NODE_FAILED W1", "W1 NODE_FAILED W1",
				"error: worker 1 (id 11) has pushed nothing for iteration 1 for 6s")},
		)},
		{"slow but moving", cat2(
			[]in{msg(time.Second, pushed(w0, 3), "W0 HEARTBEAT_ACK"), msg(time.Second, pushed(w1, 1), "W1 HEARTBEAT_ACK")},
			ticks(time.Second, 5*time.Second),
			[]in{msg(5*time.Second, pushed(w1, 2), "W1 HEARTBEAT_ACK")},
			ticks(6*time.Second, 10*time.Second),
		)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Config{NumServers: 1, NumWorkers: 2, HeartbeatInterval: time.Second, HeartbeatTimeout: time.Minute,
				StartTimeout: time.Minute, StallTimeout: 5 * time.Second}
			startCore(t, cfg, true).feed(tc.ins)
		})
	}
}

// TestCoreRegistration: the start fails, every node registered told, when
// the cluster is not complete by FPT_START_TIMEOUT, or at once when a
// node reports it cannot start.
func TestCoreRegistration(t *testing.T) {
	cfg := config.Config{NumServers: 1, NumWorkers: 1, HeartbeatInterval: time.Second, HeartbeatTimeout: time.Minute, StartTimeout: time.Minute}
	add := &control.Message{Command: control.AddNode, Origin: "c1", Nodes: []node.Info{{Role: node.Server, Host: "10.0.0.2", ControlPort: 9100, DataPort: 9101}}}
	cases := []struct {
		name string
		ins  []in
	}{
		{"the deadline", []in{
			msg(0, add),
			tick(time.Minute - time.Millisecond),
			tick(time.Minute, "10.0.0.2 NODE_FAILED sched", "error: only 1 of 1 servers and 0 of 1 workers registered within 1m0s"),
		}},
		{"a node cannot start", []in{
			msg(0, add),
			msg(time.Second, &control.Message{Command: control.NodeFailed, Text: "port taken", Nodes: []node.Info{{Role: node.Worker, Host: "10.0.0.3", ControlPort: 9100}}},
				"10.0.0.2 NODE_FAILED sched", "error: port taken"),
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			c := newCore(cfg, log, node.Info{Host: "10.0.0.1", ControlPort: 9000}, control.NewRejecter(log, nil), observer{rec: status.NewRecorder(false, time.Minute, 0)}, t0)
			(&coreRun{t: t, c: c}).feed(tc.ins)
		})
	}
}

// TestCorePaused: a scheduler that did not run for a while (SIGSTOP, a
// suspended VM) sees every member silent and every worker stalled when it
// resumes; that time is its own, not the members'. Time it watched still
// counts: a member silent before and after the pause is lost once its
// watched silence passes the timeout.
func TestCorePaused(t *testing.T) {
	beats := func(at time.Duration, ids ...node.ID) []in {
		var out []in
		for _, id := range ids {
			out = append(out, msg(at, pushed(id, 1), name(id)+" HEARTBEAT_ACK"))
		}
		return out
	}
	cases := []struct {
		name    string
		retry   bool
		timeout time.Duration // the heartbeat's
		ins     []in
	}{
		{"nobody is blamed for the pause", false, 10 * time.Second, cat2(
			ticks(time.Second, 3*time.Second),
			beats(3*time.Second, s0, s1, w1),
			// W1 is behind W0 from 3s on: stalled after 20s watched.
			[]in{msg(3*time.Second, pushed(w0, 2), "W0 HEARTBEAT_ACK")},
			ticks(4*time.Second, 5*time.Second),
			// Paused from 5s to 65s.
			ticks(65*time.Second, 66*time.Second),
			beats(66*time.Second, s0, s1, w1),
			[]in{msg(66*time.Second, pushed(w0, 2), "W0 HEARTBEAT_ACK")},
			ticks(67*time.Second, 75*time.Second),
		)},
		{"a stall watched still counts", false, time.Hour, cat2(
			ticks(time.Second, 3*time.Second),
			beats(3*time.Second, s0, s1, w1),
			[]in{msg(3*time.Second, pushed(w0, 2), "W0 HEARTBEAT_ACK")},
			ticks(4*time.Second, 5*time.Second),
			ticks(65*time.Second, 66*time.Second),
			beats(66*time.Second, s0, s1, w1),
			[]in{msg(66*time.Second, pushed(w0, 2), "W0 HEARTBEAT_ACK")},
			ticks(67*time.Second, 70*time.Second),
			beats(70*time.Second, s0, s1, w1),
			[]in{msg(70*time.Second, pushed(w0, 2), "W0 HEARTBEAT_ACK")},
			// W1 was behind from 3s to 6s and from 65s: over 20s at 83s.
			ticks(71*time.Second, 82*time.Second),
			[]in{tick(83*time.Second, "S0 NODE_FAILED W1", "S1 NODE_FAILED W1", "W0 NODE_FAILED W1", "W1 NODE_FAILED W1",
				"error: worker 1 (id 11) has pushed nothing for iteration 1 for 21s")},
		)},
		{"silence watched still counts", true, 10 * time.Second, cat2(
			ticks(time.Second, 3*time.Second),
			beats(3*time.Second, s0, s1, w0, w1),
			ticks(4*time.Second, 5*time.Second),
			ticks(65*time.Second, 66*time.Second),
			beats(66*time.Second, s0, w0, w1),
			// S1 was silent from 3s to 6s (the pause counts as one
			// interval) and from 65s: over 10s at 73s.
			ticks(67*time.Second, 72*time.Second),
			[]in{tick(73*time.Second, "S0 NODE_LEFT S1", "W0 NODE_LEFT S1", "W1 NODE_LEFT S1", "S0 LAYOUT", "W0 LAYOUT", "W1 LAYOUT",
				"S0 DECISION retry", "W0 DECISION retry", "W1 DECISION retry")},
		)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Config{NumServers: 2, NumWorkers: 2, HeartbeatInterval: time.Second, HeartbeatTimeout: tc.timeout,
				StartTimeout: time.Minute, StallTimeout: 20 * time.Second, RetryServerLoss: tc.retry}
			startCore(t, cfg, true).feed(tc.ins)
		})
	}
}
