package scheduler

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/classic"
	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/control"
	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/node"
)

// TestServeServerLeave: a server that asks to leave (Leave, Seq 0) under
// FPT_ON_SERVER_LOSS=retry is taken out of the classic layout and the
// LB's decisions at once (every member, the leaver too, hears the layout
// without it, then the retry decision), but stays a member: the final
// barrier still counts it. Ready (Seq 1), it leaves: every member and the
// leaver hear NodeLeft marked graceful, and the final barrier passes
// without it. Where it could not be lost (policy fail, the last server,
// before the start) it is told why with NodeFailed, and the others hear
// nothing.
func TestServeServerLeave(t *testing.T) {
	cases := []struct {
		name             string
		retry            bool
		servers, workers int
		started          bool
		refused          string // in the leaver's NodeFailed
		// inFinal: the leaver waits in the final barrier, as a server's
		// Finalize does, and the others reach it while it leaves.
		inFinal bool
	}{
		{"retry: it leaves in order", true, 2, 2, true, "", false},
		{"retry: the job ends while it leaves", true, 2, 2, true, "", true},
		{"fail (default): refused", false, 2, 2, true, "FPT_ON_SERVER_LOSS=retry", false},
		{"retry, the last server: refused", true, 1, 2, true, "may not leave", false},
		{"retry, before the start: refused", true, 2, 2, false, "once the job has started", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Config{NumServers: tc.servers, NumWorkers: tc.workers, HeartbeatInterval: time.Hour,
				HeartbeatTimeout: 2 * time.Hour, StartTimeout: waitTime, RetryServerLoss: tc.retry}
			srv := serve(t, cfg)
			sched := srv.sched
			members := tables(t, srv.register(t, roles(tc.servers, tc.workers)...), cfg.Grants())
			t.Cleanup(func() {
				for id, p := range members {
					_ = p.Send(sched, &control.Message{Command: control.Terminate, Sender: id})
				}
			})
			if tc.started {
				passStart(t, sched, members)
			}
			leaver := node.ServerID(tc.servers - 1)
			var servers []node.ID
			for i := range tc.servers - 1 {
				servers = append(servers, node.ServerID(i))
			}
			final := &control.Message{Command: control.Barrier, Flags: control.FlagFinal, Group: node.AllGroup, Seq: startBarrier + 1}
			if tc.inFinal {
				final.Sender = leaver
				_ = members[leaver].Send(sched, final)
			}
			if err := members[leaver].Send(sched, &control.Message{Command: control.Leave, Sender: leaver}); err != nil {
				t.Fatal(err)
			}
			if tc.refused != "" {
				if m := next(t, members[leaver]); m.Command != control.NodeFailed || m.Target != leaver || !strings.Contains(m.Text, tc.refused) {
					t.Fatalf("the leaver got %v (%q), want NodeFailed saying %q", m.Command, m.Text, tc.refused)
				}
				for id, p := range members {
					select {
					case m := <-p.Incoming():
						if id != leaver {
							t.Errorf("%s got %v on a refused leave", id, m.Command)
						}
					case <-time.After(50 * time.Millisecond):
					}
				}
				return
			}
			for id, p := range members {
				m := next(t, p)
				l, err := classic.ParseLayout(m.Body)
				if m.Command != control.Layout || err != nil || l.Version != 1 || !slices.Equal(l.Servers, servers) {
					t.Fatalf("%s got %v %v (%v), want classic layout v1%v", id, m.Command, l, err, servers)
				}
				m = next(t, p)
				d, err := lb.UnmarshalDirective(m.Body)
				if m.Command != control.Decision || err != nil || !d.Retry || !slices.Equal(d.Decision.Aggregators, servers) {
					t.Fatalf("%s got %v %v (%v), want a retry decision over %v", id, m.Command, d, err, servers)
				}
			}
			for id, p := range members {
				if id != leaver {
					m := *final
					m.Sender = id
					_ = p.Send(sched, &m)
				}
			}
			if tc.inFinal {
				// The job ends: the leaver is terminated with the others.
				terminated(t, sched, members)
				if err := srv.ended(t); err != nil {
					t.Fatalf("Serve: %v", err)
				}
				return
			}
			// Still a member: the final barrier waits for it.
			select {
			case m := <-members[node.WorkerID(0)].Incoming():
				t.Fatalf("worker 0 got %v while the leaver hands its keys over", m.Command)
			case <-time.After(50 * time.Millisecond):
			}
			if err := members[leaver].Send(sched, &control.Message{Command: control.Leave, Sender: leaver, Seq: 1}); err != nil {
				t.Fatal(err)
			}
			for id, p := range members {
				if m := next(t, p); m.Command != control.NodeLeft || m.Target != leaver || m.Flags&control.FlagGraceful == 0 {
					t.Fatalf("%s got %v naming %s (flags %b), want a graceful NodeLeft naming %s", id, m.Command, m.Target, m.Flags, leaver)
				}
			}
			// The final barrier waited only for the leaver.
			delete(members, leaver)
			terminated(t, sched, members)
			if err := srv.ended(t); err != nil {
				t.Fatalf("Serve: %v", err)
			}
		})
	}
}

// TestServeServerLeaveWaitsForAJoin: while a worker's join is ahead of
// the iterations every worker has the sums of, the LB can re-cut none, so
// a server's leave waits (a loss then would end the job): nothing changes
// until the joiner's first iteration is done, then the leave goes on as
// any (the layout without the server, the retry without it).
func TestServeServerLeaveWaitsForAJoin(t *testing.T) {
	cfg := config.Config{NumServers: 2, NumWorkers: 2, HeartbeatInterval: time.Hour, HeartbeatTimeout: 2 * time.Hour,
		StartTimeout: waitTime, RetryServerLoss: true}
	srv := serve(t, cfg)
	sched := srv.sched
	members := srv.started(t, srv.register(t, roles(2, 2)...))
	t.Cleanup(func() {
		for id, p := range members {
			_ = p.Send(sched, &control.Message{Command: control.Terminate, Sender: id})
		}
	})
	reportFirst(t, sched, members) // Done 1
	s1, w0, w1, w2 := node.ServerID(1), node.WorkerID(0), node.WorkerID(1), node.WorkerID(2)
	joiner, got := joinWorker(t, srv, members, w2, func() {})
	members[w2] = joiner
	j := got[w2].Decision.Iteration // the joiner's first iteration
	if got := synced(t, sched, members[s1], s1, &control.Message{Command: control.Leave}); len(got) != 0 {
		t.Fatalf("the leaver got %v while a join is ahead", got[0].Command)
	}
	// Every worker finishes the iterations up to the joiner's first
	// (the joiner that one only); directives come meanwhile, no layout.
	for it := uint64(1); it <= j; it++ {
		for _, id := range []node.ID{w0, w1, w2} {
			if id != w2 || it == j {
				report(t, sched, members[id], id, it, 0)
			}
		}
	}
	for id, p := range members {
		for {
			m := next(t, p)
			if m.Command == control.Decision {
				if d := directive(t, id, m); !d.Retry {
					continue
				}
				t.Fatalf("%s got the retry before the layout", id)
			}
			l, err := classic.ParseLayout(m.Body)
			if m.Command != control.Layout || err != nil || !slices.Equal(l.Servers, []node.ID{node.ServerID(0)}) {
				t.Fatalf("%s got %v %v (%v), want the layout without %s once the join took effect", id, m.Command, l, err, s1)
			}
			if d := directive(t, id, next(t, p)); !d.Retry || slices.Contains(d.Decision.Aggregators, s1) {
				t.Fatalf("%s got %v, want the retry without %s", id, d, s1)
			}
			break
		}
	}
}
