package scheduler

import (
	"slices"
	"testing"
	"time"

	"github.com/fptps/fpt/classic"
	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/control"
	"github.com/fptps/fpt/node"
)

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
