package scheduler

import (
	"encoding/binary"
	"slices"
	"testing"
	"time"

	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/control"
	"github.com/fptps/fpt/control/memplane"
	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/node"
)

// TestServeJoin: a server registering after the start gets the next
// server id and a FlagJoin table; the members hear of it once it has its
// table; and it gets its share (LB off: the even split over both servers)
// only once it has every member's connection AND every member has said
// that its own connection to it is ready, since a member may see the
// joiner's side first. Acknowledged heartbeats show what the scheduler
// has processed, so "nothing yet" is checked without waiting on a clock.
func TestServeJoin(t *testing.T) {
	srv := serve(t, config.Config{NumServers: 1, NumWorkers: 1, HeartbeatInterval: time.Hour, HeartbeatTimeout: 2 * time.Hour,
		StartTimeout: waitTime, RetryServerLoss: true})
	sched := srv.sched
	planes := srv.register(t, node.Server, node.Worker)
	srvP, wrk := planes[0], planes[1]
	members := srv.started(t, planes)
	s0, w0 := node.ServerID(0), node.WorkerID(0)
	// quiet sends m from p as id and returns once the scheduler has
	// processed it: no decision may have come meanwhile.
	quiet := func(p *memplane.Plane, id node.ID, m *control.Message) {
		t.Helper()
		for _, got := range synced(t, sched, p, id, m) {
			if got.Command == control.Decision {
				t.Fatalf("%s got a decision too early", id)
			}
		}
	}

	joiner := srv.register(t, node.Server)[0]
	tbl := next(t, joiner)
	j := node.ServerID(1)
	if tbl.Command != control.NodeTable || tbl.Flags&control.FlagJoin == 0 || tbl.Recipient != j {
		t.Fatalf("the joiner got %v (flags %d) as %s, want a FlagJoin table as %s", tbl.Command, tbl.Flags, tbl.Recipient, j)
	}
	if l := tableLayout(t, tbl); l.Version != 0 || !slices.Equal(l.Servers, []node.ID{s0}) {
		t.Fatalf("the joiner's table has classic layout %v, want the job's first, v0[%s]", l, s0)
	}
	quiet(joiner, j, &control.Message{Command: control.Joined, Seq: 0})
	for id, p := range members {
		if m := next(t, p); m.Command != control.NodeJoined || len(m.Nodes) != 1 || m.Nodes[0].ID != j {
			t.Fatalf("%s got %v, want NodeJoined for %s", id, m.Command, j)
		}
	}
	quiet(joiner, j, &control.Message{Command: control.Joined, Seq: 1})
	// Its start is over: a server goes straight to the final barrier, at
	// the number the table gave it, possibly before it has a share.
	final := binary.LittleEndian.Uint64(tbl.Body[8+8*(node.AllGroup-1):]) // after the stamp
	_ = joiner.Send(sched, &control.Message{Command: control.Barrier, Flags: control.FlagFinal, Sender: j, Group: node.AllGroup, Seq: final})
	quiet(srvP, s0, &control.Message{Command: control.Joined, Seq: 2, Target: j})
	// The worker's connection is not ready yet: no decision may name j.
	if got := synced(t, sched, wrk, w0, nil); len(got) != 0 {
		t.Fatalf("the worker got %v before its connection to %s was ready", got[0].Command, j)
	}
	_ = wrk.Send(sched, &control.Message{Command: control.Joined, Sender: w0, Seq: 2, Target: j})
	m := next(t, wrk)
	if m.Command != control.Decision {
		t.Fatalf("the worker got %v once every connection was ready, want the decision", m.Command)
	}
	d, err := lb.UnmarshalDirective(m.Body)
	if err != nil || d.Decision == nil || !slices.Equal(d.Decision.Aggregators, []node.ID{s0, j}) {
		t.Fatalf("decision %v, %v: want the even split over %s and %s", d, err, s0, j)
	}
	// Every member, the joiner too, hears the classic key ranges cut
	// over the joined server as well.
	for id, p := range map[node.ID]*memplane.Plane{w0: wrk, s0: srvP, j: joiner} {
		if l := awaitLayout(t, id, p); l.Version != 1 || !slices.Equal(l.Servers, []node.ID{s0, j}) {
			t.Fatalf("%s got classic layout %v, want v1[%s %s]", id, l, s0, j)
		}
	}
	// The final barrier counts the joined server's early arrival: every
	// member is terminated, the joiner too.
	for id, p := range members {
		_ = p.Send(sched, &control.Message{Command: control.Barrier, Flags: control.FlagFinal, Sender: id, Group: node.AllGroup, Seq: final})
	}
	members[j] = joiner
	terminated(t, sched, members)
	if err := srv.ended(t); err != nil {
		t.Fatalf("Serve: %v", err)
	}
}
