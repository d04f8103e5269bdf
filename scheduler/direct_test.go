package scheduler

import (
	"testing"
	"time"

	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/control"
	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/node"
)

// Workers get a directive after every iteration; servers only the first
// and those that change something for them, a decision or the shaping: a
// raised horizon alone means nothing to a node that does not push.
func TestServersGetOnlyDirectivesForThem(t *testing.T) {
	run := startCore(t, config.Config{NumServers: 1, NumWorkers: 1, HeartbeatInterval: time.Hour, HeartbeatTimeout: 2 * time.Hour,
		StartTimeout: time.Minute, LB: true}, false)
	got := map[node.ID][]lb.Directive{}
	collect := func(r ready) {
		t.Helper()
		for _, o := range r.sends {
			if o.m.Command != control.Decision {
				continue
			}
			d, err := lb.UnmarshalDirective(o.m.Body)
			if err != nil {
				t.Fatal(err)
			}
			got[o.to.ID] = append(got[o.to.ID], d)
		}
	}
	collect(run.tables)
	// The worker finishes iterations 0 to 5: warm-up, a probe, a decision.
	const last = 5
	for it := uint64(0); it <= last; it++ {
		s := lb.Sample{Node: w0, Iteration: it, UpRate: 1e8, DownRate: 1e8, SentBytes: 1 << 20,
			ReceivedBytes: 1 << 20, ModelBytes: 1 << 20}
		body, _ := s.MarshalBinary()
		collect(run.step(t0.Add(time.Duration(it)*time.Second), &control.Message{Command: control.Report, Sender: w0, Body: body}))
	}
	worker, server := got[w0], got[s0]
	if len(worker) != last+2 {
		t.Fatalf("the worker got %d directives, want one a report and the first", len(worker))
	}
	if h := worker[len(worker)-1].Horizon; h <= last {
		t.Fatalf("the worker's horizon is %d after iteration %d", h, last)
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
