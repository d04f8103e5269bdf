package scheduler

import (
	"testing"
	"time"

	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/control"
	"github.com/fptps/fpt/control/memplane"
	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/node"
)

// Workers get a directive after every iteration; servers only the first
// and those that change something for them, a decision or the shaping: a
// raised horizon alone means nothing to a node that does not push.
func TestServersGetOnlyDirectivesForThem(t *testing.T) {
	srv := serve(t, config.Config{NumServers: 1, NumWorkers: 1, HeartbeatInterval: time.Hour, HeartbeatTimeout: 2 * time.Hour,
		StartTimeout: waitTime, LB: true})
	sched := srv.sched
	planes := srv.register(t, node.Server, node.Worker)
	srvP, wrk := planes[0], planes[1]
	directive := func(p *memplane.Plane) lb.Directive {
		t.Helper()
		for {
			m := next(t, p)
			if m.Command != control.Decision {
				continue // the node table
			}
			d, err := lb.UnmarshalDirective(m.Body)
			if err != nil {
				t.Fatal(err)
			}
			return d
		}
	}
	worker := []lb.Directive{directive(wrk)}
	// The worker finishes iterations 0 to 5: warm-up, a probe, a decision.
	const last = 5
	for it := uint64(0); it <= last; it++ {
		s := lb.Sample{Node: node.WorkerID(0), Iteration: it, UpRate: 1e8, DownRate: 1e8, SentBytes: 1 << 20,
			ReceivedBytes: 1 << 20, ModelBytes: 1 << 20}
		body, _ := s.MarshalBinary()
		if err := wrk.Send(sched, &control.Message{Command: control.Report, Sender: node.WorkerID(0), Body: body}); err != nil {
			t.Fatal(err)
		}
		worker = append(worker, directive(wrk))
	}
	if got := worker[len(worker)-1].Horizon; got <= last {
		t.Fatalf("the worker's horizon is %d after iteration %d", got, last)
	}
	// The scheduler sends to the server before the worker: what it got is
	// queued by now.
	var server []lb.Directive
	for drained := false; !drained; {
		select {
		case m := <-srvP.Incoming():
			if m.Command == control.Decision {
				d, err := lb.UnmarshalDirective(m.Body)
				if err != nil {
					t.Fatal(err)
				}
				server = append(server, d)
			}
		case <-time.After(200 * time.Millisecond):
			drained = true
		}
	}
	var want []lb.Directive
	for i, d := range worker {
		if i == 0 || d.Decision != nil || d.Shaping != worker[i-1].Shaping {
			want = append(want, d)
		}
	}
	if len(want) == len(worker) {
		t.Fatalf("every one of the worker's %d directives changed something; the run shows nothing", len(worker))
	}
	if len(server) != len(want) {
		t.Fatalf("the server got %d directives, want %d of the worker's %d (the first, decisions, shaping changes)", len(server), len(want), len(worker))
	}
	for i := range want {
		if server[i].Horizon != want[i].Horizon || (server[i].Decision == nil) != (want[i].Decision == nil) {
			t.Errorf("server directive %d: %s, want %s", i, server[i].String(), want[i].String())
		}
	}
}
