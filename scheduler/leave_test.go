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
	}{
		{"retry: it leaves in order", true, 2, 2, true, ""},
		{"fail (default): refused", false, 2, 2, true, "FPT_ON_SERVER_LOSS=retry"},
		{"retry, the last server: refused", true, 1, 2, true, "may not leave"},
		{"retry, before the start: refused", true, 2, 2, false, "once the job has started"},
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
			// Still a member: the final barrier waits for it.
			for id, p := range members {
				if id != leaver {
					_ = p.Send(sched, &control.Message{Command: control.Barrier, Flags: control.FlagFinal, Sender: id, Group: node.AllGroup, Seq: startBarrier + 1})
				}
			}
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
			for id, p := range members {
				if id == leaver {
					continue
				}
				if m := next(t, p); m.Command != control.Terminate {
					t.Fatalf("%s got %v, want Terminate: the final barrier waited only for the leaver", id, m.Command)
				}
				_ = p.Send(sched, &control.Message{Command: control.Terminate, Sender: id})
			}
			if err := srv.ended(t); err != nil {
				t.Fatalf("Serve: %v", err)
			}
		})
	}
}
