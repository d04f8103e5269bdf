package scheduler

import (
	"encoding/binary"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/classic"
	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/control"
	"github.com/fptps/fpt/control/memplane"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/metrics"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/status"
)

// synced sends m (if not nil) from p as id, then a heartbeat, and
// returns what p got before the heartbeat's answer: once it comes, the
// scheduler has processed m and sent all it had to.
func synced(t *testing.T, sched string, p *memplane.Plane, id node.ID, m *control.Message) []*control.Message {
	t.Helper()
	if m != nil {
		m.Sender = id
		_ = p.Send(sched, m)
	}
	_ = p.Send(sched, &control.Message{Command: control.Heartbeat, Sender: id})
	var got []*control.Message
	for {
		m := next(t, p)
		if m.Command == control.HeartbeatAck {
			return got
		}
		got = append(got, m)
	}
}

// report has worker id report that it finished iteration it, having
// applied retry version.
func report(t *testing.T, sched string, p *memplane.Plane, id node.ID, it uint64, version uint32) {
	t.Helper()
	body, err := lb.Sample{Node: id, Iteration: it, Version: version}.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	_ = p.Send(sched, &control.Message{Command: control.Report, Sender: id, Body: body})
}

// terminated has every member wait for Terminate, past directives and
// heartbeat answers, and echo it.
func terminated(t *testing.T, sched string, members map[node.ID]*memplane.Plane) {
	t.Helper()
	for id, p := range members {
		for {
			m := next(t, p)
			if m.Command == control.Terminate {
				break
			}
			if m.Command != control.Decision && m.Command != control.HeartbeatAck {
				t.Fatalf("%s got %v, want Terminate", id, m.Command)
			}
		}
		_ = p.Send(sched, &control.Message{Command: control.Terminate, Sender: id})
	}
}

// directive reads a Decision message's directive.
func directive(t *testing.T, id node.ID, m *control.Message) lb.Directive {
	t.Helper()
	if m.Command != control.Decision {
		t.Fatalf("%s got %v, want a directive", id, m.Command)
	}
	d, err := lb.UnmarshalDirective(m.Body)
	if err != nil {
		t.Fatalf("%s: %v", id, err)
	}
	return d
}

// tableLayout is the classic layout a joining node's table carries after
// its barrier numbers.
func tableLayout(t *testing.T, tbl *control.Message) classic.Layout {
	t.Helper()
	if len(tbl.Body) < 8+8*int(node.AllGroup) {
		t.Fatalf("joining table with %d bytes of body", len(tbl.Body))
	}
	b := tbl.Body[8+8*int(node.AllGroup):] // after the stamp and barrier numbers
	if len(b) >= 8 {
		b = b[:min(len(b), 8+4*int(binary.LittleEndian.Uint32(b[4:])))] // before the local groups
	}
	l, err := classic.ParseLayout(b)
	if err != nil {
		t.Fatalf("joining table: %v", err)
	}
	return l
}

// awaitLayout reads id's next messages up to a Layout, skipping the LB's
// directives, and returns it.
func awaitLayout(t *testing.T, id node.ID, p *memplane.Plane) classic.Layout {
	t.Helper()
	for {
		m := next(t, p)
		switch m.Command {
		case control.Decision:
			continue
		case control.Layout:
			l, err := classic.ParseLayout(m.Body)
			if err != nil {
				t.Fatalf("%s: layout: %v", id, err)
			}
			return l
		}
		t.Fatalf("%s got %v, want a classic layout", id, m.Command)
	}
}

// joinWorker has a worker register with the running job and go through
// the join, checking each step: its id is want (an id no node had), it
// gets a FlagJoin table with the barrier numbers, the members hear of it
// (NodeJoined) once it has its table, and nobody hears a decision before
// it has every member's connection (Joined 1) and every member has said
// its connection to it is ready (Joined 2). between runs while it is
// joining, once it is in the table. It returns the joiner's plane and the
// directive each member, the joiner included, got once it was counted:
// the first the joiner heard.
func joinWorker(t *testing.T, srv *served, members map[node.ID]*memplane.Plane, want node.ID, between func()) (*memplane.Plane, map[node.ID]lb.Directive) {
	t.Helper()
	sched := srv.sched
	joiner := srv.register(t, node.Worker)[0]
	tbl := next(t, joiner)
	if tbl.Command != control.NodeTable || tbl.Flags&control.FlagJoin == 0 || tbl.Recipient != want {
		t.Fatalf("the joiner got %v (flags %d) as %s, want a FlagJoin table as %s", tbl.Command, tbl.Flags, tbl.Recipient, want)
	}
	tableLayout(t, tbl)
	if !slices.ContainsFunc(tbl.Nodes, func(n node.Info) bool { return n.ID == want && n.Role == node.Worker }) {
		t.Fatalf("the joiner's table %v does not list it", tbl.Nodes)
	}
	if got := synced(t, sched, joiner, want, &control.Message{Command: control.Joined, Seq: 0}); len(got) != 0 {
		t.Fatalf("the joiner got %v before it was counted", got[0].Command)
	}
	for id, p := range members {
		if m := next(t, p); m.Command != control.NodeJoined || len(m.Nodes) != 1 || m.Nodes[0].ID != want || m.Nodes[0].Role != node.Worker {
			t.Fatalf("%s got %v, want NodeJoined for %s", id, m.Command, want)
		}
	}
	between()
	if got := synced(t, sched, joiner, want, &control.Message{Command: control.Joined, Seq: 1}); len(got) != 0 {
		t.Fatalf("the joiner got %v before every member's connection to it was ready", got[0].Command)
	}
	ids := slices.Sorted(func(yield func(node.ID) bool) {
		for id := range members {
			if !yield(id) {
				return
			}
		}
	})
	for i, id := range ids {
		if i == len(ids)-1 {
			break
		}
		if got := synced(t, sched, members[id], id, &control.Message{Command: control.Joined, Seq: 2, Target: want}); slices.ContainsFunc(got, func(m *control.Message) bool { return m.Command == control.Decision }) {
			t.Fatalf("%s got a decision before every member's connection to %s was ready", id, want)
		}
	}
	last := ids[len(ids)-1]
	_ = members[last].Send(sched, &control.Message{Command: control.Joined, Sender: last, Seq: 2, Target: want})
	got := map[node.ID]lb.Directive{want: directive(t, want, next(t, joiner))}
	for id, p := range members {
		got[id] = directive(t, id, next(t, p))
	}
	return joiner, got
}

// TestServeWorkerJoin: a worker registering while the job runs, with the
// LB's grants running, gets the next worker id no node had (not a lost
// worker's), a FlagJoin table, and once the join is done every member,
// the joiner too, gets the decision that counts it: its Workers add the
// joiner, from the iteration after the horizon granted, not a retry. It
// is the first directive the joiner hears: the ones sent while it was
// joining are not for it. Its Joined messages and every member's count as
// before; the final barrier counts it. With the grants off a worker is
// refused, as before.
func TestServeWorkerJoin(t *testing.T) {
	cases := []struct {
		name  string
		cfg   config.Config
		lose  bool // worker 1 is lost under continue before the join
		fresh node.ID
	}{
		{"LB on, FPT_ON_WORKER_LOSS=fail", config.Config{LB: true}, false, node.WorkerID(2)},
		{"LB off, continue", config.Config{WorkerLoss: config.WorkerLossContinue}, false, node.WorkerID(2)},
		{"LB off, continue, after a worker left", config.Config{WorkerLoss: config.WorkerLossContinue}, true, node.WorkerID(2)},
		{"LB on, wait, after a worker left", config.Config{LB: true, WorkerLoss: config.WorkerLossWait, WorkerWaitTimeout: 2 * time.Hour}, true, node.WorkerID(2)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.NumServers, cfg.NumWorkers, cfg.HeartbeatInterval, cfg.HeartbeatTimeout, cfg.StartTimeout = 1, 2, time.Hour, 2*time.Hour, waitTime
			srv := serve(t, cfg)
			sched := srv.sched
			members := srv.started(t, srv.register(t, roles(1, 2)...))
			reportFirst(t, sched, members) // Done 1, horizon 3
			s0, w0, w1 := node.ServerID(0), node.WorkerID(0), node.WorkerID(1)
			workers := []node.ID{w0, w1}
			var version uint32 // the latest decision's
			if tc.lose {
				_ = members[w0].Send(sched, &control.Message{Command: control.NodeFailed, Sender: w0, Target: w1, Text: "connection reset"})
				delete(members, w1)
				for id, p := range members {
					if m := next(t, p); m.Command != control.NodeLeft || m.Target != w1 {
						t.Fatalf("%s got %v, want NodeLeft naming %s", id, m.Command, w1)
					}
					if d := directive(t, id, next(t, p)); !d.Retry {
						t.Fatalf("%s got %v, want the retry", id, d)
					}
				}
				workers, version = []node.ID{w0}, 1
			}
			// While it joins, the workers finish iteration 1: its
			// directive raises the horizon to 4 (for the members only),
			// unless a loss under wait holds it at 3.
			horizon := uint64(4)
			if tc.lose && cfg.WorkerLoss == config.WorkerLossWait {
				horizon = 3
			}
			between := func() {
				for _, id := range workers {
					report(t, sched, members[id], id, 1, version)
				}
				for _, id := range workers {
					if d := directive(t, id, next(t, members[id])); d.Horizon != horizon || d.Done != 2 {
						t.Fatalf("%s got %v, want horizon %d, Done 2", id, d, horizon)
					}
				}
			}
			joiner, got := joinWorker(t, srv, members, tc.fresh, between)
			want := slices.Sorted(slices.Values(append(slices.Clone(workers), tc.fresh)))
			j := horizon + 1
			for id, d := range got {
				// Horizon: what iteration 1's step would have granted.
				if dec := d.Decision; dec == nil || d.Retry || d.Probe || dec.Version != version+1 || dec.Iteration != j ||
					!slices.Equal(dec.Workers, want) || d.Done != 2 || d.Horizon != 4 {
					t.Fatalf("%s got %v: want v%d from iteration %d (after the horizon %d), workers %v, Done 2, horizon 4, not a retry", id, d, version+1, j, horizon, want)
				}
				if !slices.Equal(d.Decision.Aggregators, []node.ID{s0}) {
					t.Fatalf("%s got %v: want the split kept, the even one over %s", id, d, s0)
				}
			}
			// The joiner's reports count from j: with it, j completes.
			members[tc.fresh] = joiner
			for it := uint64(2); it <= j; it++ {
				for _, id := range append(workers, tc.fresh) {
					if id != tc.fresh || it == j {
						report(t, sched, members[id], id, it, version)
					}
				}
			}
			for _, id := range append(workers, tc.fresh) {
				var d lb.Directive
				for d.Done <= j {
					d = directive(t, id, next(t, members[id]))
				}
				if d.Horizon != j+3 {
					t.Fatalf("%s got %v after iteration %d, want horizon %d", id, d, j, j+3)
				}
			}
			// The final barrier waits for the joiner, and terminates it.
			final := uint64(startBarrier + 1)
			for id, p := range members {
				if id != tc.fresh {
					_ = p.Send(sched, &control.Message{Command: control.Barrier, Flags: control.FlagFinal, Sender: id, Group: node.AllGroup, Seq: final})
				}
			}
			if got := synced(t, sched, joiner, tc.fresh, nil); len(got) != 0 {
				t.Fatalf("the joiner got %v before it reached the final barrier", got[0].Command)
			}
			_ = joiner.Send(sched, &control.Message{Command: control.Barrier, Flags: control.FlagFinal, Sender: tc.fresh, Group: node.AllGroup, Seq: final})
			terminated(t, sched, members)
			if err := srv.ended(t); err != nil {
				t.Fatalf("Serve: %v", err)
			}
		})
	}

	// Without the LB's grants nothing can count a new worker.
	srv := serve(t, config.Config{NumServers: 1, NumWorkers: 1, HeartbeatInterval: time.Hour, HeartbeatTimeout: 2 * time.Hour, StartTimeout: waitTime})
	planes := srv.register(t, node.Server, node.Worker)
	for _, p := range planes {
		next(t, p) // the node table
	}
	late := srv.register(t, node.Worker)[0]
	if m := next(t, late); m.Command != control.NodeFailed || !strings.Contains(m.Text, "already started") || !strings.Contains(m.Text, "FPT_ON_WORKER_LOSS") {
		t.Fatalf("a worker registering with the grants off got %v (%q), want a refusal saying how to join", m.Command, m.Text)
	}
}

// TestServeWorkerLossWait: under FPT_ON_WORKER_LOSS=wait a lost worker
// leaves as under continue (NodeLeft, a retry over the workers left), but
// then the horizon stops rising: the iterations granted complete (Done
// goes on) and no further one is granted, whatever the workers report,
// until a worker joins; its decision grants the iterations held back.
func TestServeWorkerLossWait(t *testing.T) {
	srv := serve(t, config.Config{NumServers: 1, NumWorkers: 3, HeartbeatInterval: time.Hour, HeartbeatTimeout: 2 * time.Hour,
		StartTimeout: waitTime, WorkerLoss: config.WorkerLossWait, WorkerWaitTimeout: 2 * time.Hour})
	sched := srv.sched
	members := srv.started(t, srv.register(t, roles(1, 3)...))
	reportFirst(t, sched, members) // Done 1, horizon 3
	w0, w1, lost := node.WorkerID(0), node.WorkerID(1), node.WorkerID(2)
	_ = members[w0].Send(sched, &control.Message{Command: control.NodeFailed, Sender: w0, Target: lost, Text: "connection reset"})
	delete(members, lost)
	for id, p := range members {
		if m := next(t, p); m.Command != control.NodeLeft || m.Target != lost {
			t.Fatalf("%s got %v, want NodeLeft naming %s", id, m.Command, lost)
		}
		if d := directive(t, id, next(t, p)); !d.Retry || d.Decision.Iteration != 1 || d.Horizon != 3 || !slices.Equal(d.Decision.Workers, []node.ID{w0, w1}) {
			t.Fatalf("%s got %v, want the retry from 1 over %s and %s", id, d, w0, w1)
		}
	}
	// The workers left finish every iteration granted: Done reaches 4,
	// the horizon stays 3.
	for it := uint64(1); it <= 3; it++ {
		for _, id := range []node.ID{w0, w1} {
			report(t, sched, members[id], id, it, 1)
		}
		for _, id := range []node.ID{w0, w1} {
			if d := directive(t, id, next(t, members[id])); d.Done != it+1 || d.Horizon != 3 {
				t.Fatalf("%s got %v after iteration %d, want Done %d, horizon 3 kept", id, d, it, it+1)
			}
		}
	}
	// A report beyond the horizon changes nothing.
	for _, id := range []node.ID{w0, w1} {
		report(t, sched, members[id], id, 4, 1)
		if got := synced(t, sched, members[id], id, nil); len(got) != 0 {
			t.Fatalf("%s got %v for an iteration beyond the held horizon", id, got[0].Command)
		}
	}
	_, got := joinWorker(t, srv, members, node.WorkerID(3), func() {})
	for id, d := range got {
		if dec := d.Decision; dec == nil || d.Retry || dec.Iteration != 4 || d.Done != 4 || d.Horizon != 6 ||
			!slices.Equal(dec.Workers, []node.ID{w0, w1, node.WorkerID(3)}) || !strings.Contains(d.Reason, "hold over") {
			t.Fatalf("%s got %v: want the joiner counted from 4, the hold over, horizon 6", id, d)
		}
	}
}

// TestServeWorkerWaitTimeout: under FPT_ON_WORKER_LOSS=wait, when no
// worker joins within FPT_WORKER_WAIT_TIMEOUT of a loss, the job ends as
// a lost worker ends it under fail: every member hears NodeFailed naming
// it and saying why, and Serve's error names it.
func TestServeWorkerWaitTimeout(t *testing.T) {
	srv := serve(t, config.Config{NumServers: 1, NumWorkers: 2, HeartbeatInterval: 5 * time.Millisecond, HeartbeatTimeout: 2 * time.Hour,
		StartTimeout: waitTime, WorkerLoss: config.WorkerLossWait, WorkerWaitTimeout: 20 * time.Millisecond})
	sched := srv.sched
	members := srv.started(t, srv.register(t, roles(1, 2)...))
	reportFirst(t, sched, members)
	w0, lost := node.WorkerID(0), node.WorkerID(1)
	_ = members[w0].Send(sched, &control.Message{Command: control.NodeFailed, Sender: w0, Target: lost, Text: "connection reset"})
	delete(members, lost)
	for id, p := range members {
		for _, want := range []control.Command{control.NodeLeft, control.Decision, control.NodeFailed} {
			if m := next(t, p); m.Command != want {
				t.Fatalf("%s got %v, want %v", id, m.Command, want)
			} else if want == control.NodeFailed && (m.Target != lost || !strings.Contains(m.Text, lost.String()) || !strings.Contains(m.Text, "FPT_WORKER_WAIT_TIMEOUT")) {
				t.Fatalf("%s got NodeFailed naming %s (%q), want %s and the timeout", id, m.Target, m.Text, lost)
			}
		}
	}
	if err := srv.ended(t); err == nil || !strings.Contains(err.Error(), lost.String()) || !strings.Contains(err.Error(), "no worker joined") {
		t.Fatalf("Serve: %v, want an error naming %s", err, lost)
	}
}

// TestWorkerWait: the wait's bookkeeping, on the scheduler's state with
// no network: a loss under wait holds the LB's grants and the job fails
// once the timeout has passed since the first loss the wait covers (a
// later loss does not extend it), naming every worker lost; a worker
// joining ends the wait, however many were lost, and releases the grants.
func TestWorkerWait(t *testing.T) {
	const timeout = time.Minute
	t0 := time.Unix(1000, 0)
	lost := []node.Info{
		{ID: node.WorkerID(1), Role: node.Worker, Host: "10.0.0.2", ControlPort: 9100},
		{ID: node.WorkerID(2), Role: node.Worker, Host: "10.0.0.3", ControlPort: 9100},
	}
	cases := []struct {
		name   string
		losses int
		join   bool
		at     time.Duration // since the first loss
		fails  bool
	}{
		{"no loss", 0, false, 2 * timeout, false},
		{"within the timeout", 1, false, timeout - time.Millisecond, false},
		{"at the timeout", 1, false, timeout, true},
		{"two lost: the wait runs from the first", 2, false, timeout, true},
		{"a worker joined", 1, true, 2 * timeout, false},
		{"two lost, one joined", 2, true, 2 * timeout, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b, err := lb.NewBalancer(lb.Config{Servers: []node.ID{node.ServerID(0)}, Workers: []node.ID{node.WorkerID(0), lost[0].ID, lost[1].ID}, Fixed: true})
			if err != nil {
				t.Fatal(err)
			}
			reg := prometheus.NewRegistry()
			m, err := metrics.NewScheduler(reg)
			if err != nil {
				t.Fatal(err)
			}
			joiner := node.Info{ID: node.WorkerID(3), Role: node.Worker, Host: "10.0.0.4", ControlPort: 9100}
			// The table as admit leaves it: the joiner is in it, the
			// others' ids are not (nothing is sent).
			s := &core{now: t0, cfg: config.Config{WorkerWaitTimeout: timeout}, log: slog.New(slog.NewTextHandler(io.Discard, nil)), lb: b,
				table: []node.Info{{ID: node.SchedulerID, Role: node.Scheduler}, joiner},
				obs:   observer{Observers: Observers{Metrics: m}, rec: status.NewRecorder(false, time.Second, 0)}}
			for i := range tc.losses {
				s.waitForWorker(lost[i], 3, t0.Add(time.Duration(i)*time.Second))
			}
			if b.Held() != (tc.losses > 0) {
				t.Fatalf("held %v after %d losses", b.Held(), tc.losses)
			}
			if tc.join {
				s.stalls = newStallWatch(time.Hour, nil, t0)
				s.admitWorker(joiner)
				if b.Held() || !slices.Contains(b.Workers(), joiner.ID) {
					t.Fatalf("after the join: held %v, workers %v", b.Held(), b.Workers())
				}
				// fpt_members and fpt_membership_version follow.
				want := `
# HELP fpt_members Nodes in the cluster, by role, once every one registered; then as servers and workers join or leave a running job.
# TYPE fpt_members gauge
fpt_members{role="scheduler"} 1
fpt_members{role="server"} 0
fpt_members{role="worker"} 1
# HELP fpt_membership_version Membership changes since the cluster started (0: the nodes it started with).
# TYPE fpt_membership_version gauge
fpt_membership_version 1
`
				if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "fpt_members", "fpt_membership_version"); err != nil {
					t.Error(err)
				}
				// The stall watch waits for it from its first iteration.
				if p := s.stalls.workers[node.WorkerID(3)]; p == nil || p.pushed != b.Current().Iteration {
					t.Fatalf("the stall watch has %+v for the joiner, want it from iteration %d", p, b.Current().Iteration)
				}
			}
			err = s.waitExpired(t0.Add(tc.at))
			if (err != nil) != tc.fails {
				t.Fatalf("waitExpired: %v, want failing %v", err, tc.fails)
			}
			for i := range tc.losses {
				if err != nil && !strings.Contains(err.Error(), lost[i].String()) {
					t.Errorf("%v does not name %s", err, lost[i])
				}
			}
		})
	}
}

// TestServeJoiningWorkerLost: a worker lost while it joins was never
// counted: it leaves without consequence (NodeLeft to the members), even
// under FPT_ON_WORKER_LOSS=fail, and the job runs to its end.
func TestServeJoiningWorkerLost(t *testing.T) {
	srv := serve(t, config.Config{NumServers: 1, NumWorkers: 1, HeartbeatInterval: time.Hour, HeartbeatTimeout: 2 * time.Hour,
		StartTimeout: waitTime, LB: true})
	sched := srv.sched
	members := srv.started(t, srv.register(t, roles(1, 1)...))
	joiner, j := srv.register(t, node.Worker)[0], node.WorkerID(1)
	if m := next(t, joiner); m.Command != control.NodeTable || m.Recipient != j {
		t.Fatalf("the joiner got %v as %s, want its table as %s", m.Command, m.Recipient, j)
	}
	synced(t, sched, joiner, j, &control.Message{Command: control.Joined, Seq: 0})
	s0 := node.ServerID(0)
	_ = members[s0].Send(sched, &control.Message{Command: control.NodeFailed, Sender: s0, Target: j, Text: "connection reset"})
	for id, p := range members {
		if m := next(t, p); m.Command != control.NodeJoined {
			t.Fatalf("%s got %v, want NodeJoined", id, m.Command)
		}
		if m := next(t, p); m.Command != control.NodeLeft || m.Target != j {
			t.Fatalf("%s got %v naming %s, want NodeLeft naming %s", id, m.Command, m.Target, j)
		}
	}
	for id, p := range members {
		_ = p.Send(sched, &control.Message{Command: control.Barrier, Flags: control.FlagFinal, Sender: id, Group: node.AllGroup, Seq: startBarrier + 1})
	}
	for id, p := range members {
		if m := next(t, p); m.Command != control.Terminate {
			t.Fatalf("%s got %v, want Terminate", id, m.Command)
		}
		_ = p.Send(sched, &control.Message{Command: control.Terminate, Sender: id})
	}
	if err := srv.ended(t); err != nil {
		t.Fatalf("Serve: %v", err)
	}
}
