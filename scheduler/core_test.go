package scheduler

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/control"
	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/status"
)

// t0 is when a core under test starts.
var t0 = time.Unix(1_000_000, 0)

// coreRun is a core under test and the connections of its nodes.
type coreRun struct {
	t      *testing.T
	c      *core
	origin map[node.ID]string
	// tables is what the last registration asked for: the tables, and,
	// with the LB's grants, the first directive.
	tables ready
}

// startCore registers cfg's servers and workers with a new core at t0
// (the i-th node of role r at 10.0.r.i), checks that each got its
// table, and, when started, passes the start barriers.
func startCore(t *testing.T, cfg config.Config, started bool) *coreRun {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	o := observer{rec: status.NewRecorder(cfg.LB, cfg.HeartbeatTimeout, 0)}
	c := newCore(cfg, log, node.Info{Host: "10.0.0.1", ControlPort: 9000}, control.NewRejecter(log, nil), o, t0)
	run := &coreRun{t: t, c: c, origin: map[node.ID]string{}}
	byAddr := map[string]string{}
	var r ready
	for i, role := range roles(cfg.NumServers, cfg.NumWorkers) {
		host := fmt.Sprintf("10.0.%d.%d", role, i)
		origin := "conn-" + host
		byAddr[host] = origin
		info := node.Info{Role: role, Host: host, ControlPort: 9100, DataPort: 9101}
		r = c.step(&control.Message{Command: control.AddNode, Nodes: []node.Info{info}, Origin: origin}, t0)
	}
	run.tables = r
	if r.err != nil || c.registering {
		t.Fatalf("registration: %v (registering %v)", r.err, c.registering)
	}
	for _, o := range r.sends {
		if o.m.Command == control.NodeTable {
			run.origin[o.to.ID] = byAddr[o.to.Host]
		}
	}
	if len(run.origin) != cfg.NumServers+cfg.NumWorkers {
		t.Fatalf("tables sent to %v", run.origin)
	}
	if started {
		for seq := range uint64(startBarrier + 1) {
			for _, info := range c.table[1:] {
				run.step(t0, &control.Message{Command: control.Barrier, Sender: info.ID, Group: node.AllGroup, Seq: seq})
			}
		}
	}
	return run
}

// step has m come at at from its Sender's connection (or the one it
// names).
func (run *coreRun) step(at time.Time, m *control.Message) ready {
	if m.Origin == "" {
		m.Origin = run.origin[m.Sender]
	}
	return run.c.step(m, at)
}

// name is how sent lines name id: S0, W1, ... (the scheduler: sched).
func name(id node.ID) string {
	switch r, _ := id.Role(); r {
	case node.Server:
		return fmt.Sprintf("S%d", id.Rank())
	case node.Worker:
		return fmt.Sprintf("W%d", id.Rank())
	}
	return "sched"
}

// lines says what r asks for, one line a send ("W0 NODE_LEFT S1": to W0,
// naming S1; a graceful one adds "graceful", a retry directive "retry"), then "terminate W0 S0" and
// "error: ...".
func lines(r ready) []string {
	var out []string
	for _, o := range r.sends {
		to := name(o.to.ID)
		if o.to.ID == 0 {
			to = o.to.Host // not given an id yet
		}
		l := to + " " + o.m.Command.String()
		if o.m.Target != 0 {
			l += " " + name(o.m.Target)
		}
		if o.m.Flags&control.FlagGraceful != 0 {
			l += " graceful"
		}
		if o.m.Command == control.Decision {
			if d, err := lb.UnmarshalDirective(o.m.Body); err == nil && d.Retry {
				l += " retry"
			}
		}
		out = append(out, l)
	}
	if r.terminate {
		var ms []string
		for _, id := range r.members {
			ms = append(ms, name(id))
		}
		out = append(out, "terminate "+strings.Join(ms, " "))
	}
	if r.err != nil {
		out = append(out, "error: "+r.err.Error())
	}
	return out
}

// in is one input to a core: a message from Sender (a tick when nil) at
// t0 plus at; want are the lines it must produce, in order (a line
// "error: x" matches an error containing x); others are not allowed.
type in struct {
	at   time.Duration
	m    *control.Message
	want []string
}

// tick is a tick at t0 plus at that must produce want.
func tick(at time.Duration, want ...string) in { return in{at: at, want: want} }

// msg is m at t0 plus at that must produce want.
func msg(at time.Duration, m *control.Message, want ...string) in {
	return in{at: at, m: m, want: want}
}

// feed runs ins through the core and checks each one's lines.
func (run *coreRun) feed(ins []in) {
	run.t.Helper()
	for i, x := range ins {
		var r ready
		if x.m == nil {
			r = run.c.tick(t0.Add(x.at))
		} else {
			m := *x.m
			r = run.step(t0.Add(x.at), &m)
		}
		got := lines(r)
		if !sameLines(got, x.want) {
			run.t.Fatalf("input %d (%v at %s):\n got %q\nwant %q", i, command(x.m), x.at, got, x.want)
		}
	}
}

func command(m *control.Message) string {
	if m == nil {
		return "tick"
	}
	return m.Command.String() + " from " + name(m.Sender)
}

func sameLines(got, want []string) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if w, isErr := strings.CutPrefix(want[i], "error: "); isErr {
			if !strings.HasPrefix(got[i], "error: ") || !strings.Contains(got[i], w) {
				return false
			}
			continue
		}
		if got[i] != want[i] {
			return false
		}
	}
	return true
}

// each is the line "<id> rest" for every id.
func each(rest string, ids ...node.ID) []string {
	var out []string
	for _, id := range ids {
		out = append(out, name(id)+" "+rest)
	}
	return out
}

// cat joins line lists.
func cat(parts ...[]string) []string {
	var out []string
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// A member's app message for the scheduler's customers is handed to the
// shell (Observers.Apps) when the scheduler has customers, refused when
// it has none or the message names another recipient; the node table is
// handed over once, at the start.
func TestCoreApps(t *testing.T) {
	cfg := config.Config{NumServers: 1, NumWorkers: 1, HeartbeatInterval: time.Second, HeartbeatTimeout: time.Minute, StartTimeout: time.Minute}
	app := func(target node.ID) *control.Message {
		return &control.Message{Command: control.App, Sender: node.ServerID(0), Target: target, Seq: 3, Body: []byte("payload")}
	}
	tests := []struct {
		name  string
		apps  bool
		m     *control.Message
		taken bool
	}{
		{"to the scheduler's customers", true, app(node.SchedulerID), true},
		{"a scheduler without customers", false, app(node.SchedulerID), false},
		{"to another member", true, app(node.WorkerID(0)), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			run := startCore(t, cfg, true)
			if len(run.tables.table) != 3 {
				t.Fatalf("table handed over with %d nodes, want 3", len(run.tables.table))
			}
			if tt.apps {
				run.c.obs.Apps = NewApps(cfg, nil)
			}
			r := run.step(t0, tt.m)
			if got := len(r.apps) == 1 && string(r.apps[0].Body) == "payload"; got != tt.taken {
				t.Errorf("app message handed over: %v, want %v", got, tt.taken)
			}
			if r.table != nil {
				t.Errorf("table handed over again")
			}
		})
	}
}
