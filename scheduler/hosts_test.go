package scheduler

import (
	"io"
	"log/slog"
	"reflect"
	"strings"
	"testing"

	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/control"
	"github.com/fptps/fpt/localagg"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/status"
)

// newHostsCore is a scheduler core of cfg started at t0, logging nowhere.
func newHostsCore(cfg config.Config) *core {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	return newCore(cfg, log, node.Info{Host: "10.0.0.1", ControlPort: 9000}, control.NewRejecter(log, nil), observer{rec: status.NewRecorder(false, cfg.HeartbeatTimeout, 0)}, t0)
}

// hostReg is a node registering in a hosts test: its role, its address
// and the host it names (FPT_HOST_ID).
type hostReg struct {
	role     node.Role
	addr, id string
}

// register steps c with the registration of regs[i] (its ports and
// connection by i) at t0.
func register(c *core, regs []hostReg, i int) ready {
	r := regs[i]
	info := node.Info{Role: r.role, Host: r.addr, ControlPort: 9100 + 2*i, DataPort: 9101 + 2*i}
	return c.step(&control.Message{Command: control.AddNode, Nodes: []node.Info{info}, Origin: "conn" + string(rune('0'+i)), Text: r.id}, t0)
}

// TestLocalGroups: the workers' local groups form from the hosts they
// named at registration (FPT_HOST_ID), else their addresses; servers
// belong to none, and an oversized name is ignored.
func TestLocalGroups(t *testing.T) {
	cfg := config.Config{NumServers: 1, NumWorkers: 5, HeartbeatInterval: 1e9, HeartbeatTimeout: 10e9, StartTimeout: 60e9, LB: false}
	c := newHostsCore(cfg)
	regs := []hostReg{
		{node.Server, "10.0.0.2", "a"},
		{node.Worker, "10.0.0.2", "a"},
		{node.Worker, "10.0.0.3", "a"}, // another address, the same named host
		{node.Worker, "10.0.0.2", "b"},
		{node.Worker, "10.0.0.4", ""},
		{node.Worker, "10.0.0.5", strings.Repeat("x", config.MaxHostIDLen+1)},
	}
	for i := range regs {
		register(c, regs, i)
	}
	if c.registering {
		t.Fatal("still registering")
	}
	got := map[string][]node.Info{}
	for _, g := range c.groups {
		for _, w := range g.Workers {
			got[g.Host] = append(got[g.Host], c.byID[w])
		}
	}
	want := map[string]int{"a": 2, "b": 1, "10.0.0.4": 1, "10.0.0.5": 1}
	sizes := map[string]int{}
	for h, ws := range got {
		sizes[h] = len(ws)
	}
	if !reflect.DeepEqual(sizes, want) {
		t.Fatalf("groups %v, want sizes %v", c.groups, want)
	}
	for _, g := range c.groups {
		if g.Leader() != g.Workers[0] {
			t.Errorf("group %s led by %s", g.Host, g.Leader())
		}
	}
	// The status page shows each worker's group.
	shown := map[string]int{}
	for _, m := range c.obs.rec.Snapshot(t0, nil).Members {
		if m.Role == "worker" {
			shown[m.Group]++
		} else if m.Group != "" {
			t.Errorf("%s shown in group %q", m.Name, m.Group)
		}
	}
	if want := map[string]int{"a (2 workers)": 2, "b (alone)": 1, "10.0.0.4 (alone)": 1, "10.0.0.5 (alone)": 1}; !reflect.DeepEqual(shown, want) {
		t.Errorf("status page groups %v, want %v", shown, want)
	}
	if n := len(localagg.HostOf(c.groups)); n != cfg.NumWorkers {
		t.Errorf("%d workers in groups, want %d", n, cfg.NumWorkers)
	}
	// The LB balances by host only where the workers sum on their hosts:
	// auto, with host a's two workers, does; the server of host a shares
	// its host with them.
	if h := c.lbHosts(); h != nil {
		t.Errorf("LB hosts %v with local aggregation off", h)
	}
	c.cfg.LocalAggregation = config.LocalAggregationAuto
	h := c.lbHosts()
	if h == nil || !h.Local || len(h.Of) != 6 {
		t.Fatalf("LB hosts %+v with local aggregation auto and a host of two workers", h)
	}
	perHost := map[int]int{}
	for _, i := range h.Of {
		perHost[i]++
	}
	srv := h.Of[c.table[1].ID] // the first registered: the server on host a
	if r, _ := c.table[1].ID.Role(); r != node.Server || perHost[srv] != 3 || len(perHost) != 4 {
		t.Errorf("LB hosts %v: want the server with host a's two workers, and 3 other hosts", h.Of)
	}
	// A worker of host a without shared memory: on host a's link, alone.
	w := c.table[2].ID
	c.hostOf[w] = "a" + localagg.NoSharedMemory
	h = c.lbHosts()
	if h.Of[w] != srv || !h.Alone[w] || len(h.Alone) != 1 {
		t.Errorf("LB hosts %+v: want %s on host a (%d), alone", h, w, srv)
	}
}

// TestJoinedGroups: a node joining the running job is told, after its
// table's layout, what every member knows of the local groups: the hosts
// the table's nodes named, that the workers sum, and, once a retry ended
// the groups' sums, from which iteration (the earliest retry's).
func TestJoinedGroups(t *testing.T) {
	cfg := config.Config{NumServers: 2, NumWorkers: 3, HeartbeatInterval: 1e9, HeartbeatTimeout: 10e9, StartTimeout: 60e9,
		LB: false, RetryServerLoss: true, LocalAggregation: config.LocalAggregationOn}
	c := newHostsCore(cfg)
	regs := []hostReg{{node.Server, "10.0.0.2", ""}, {node.Worker, "10.0.0.2", "a"}, {node.Worker, "10.0.0.2", "a"}, {node.Worker, "10.0.0.2", "b"}, {node.Server, "10.0.0.2", ""}, {node.Server, "10.0.0.2", "c"}, {node.Server, "10.0.0.2", ""}}
	add := func(i int) ready { return register(c, regs, i) }
	for i := range 5 {
		add(i)
	}
	if c.registering || c.lb == nil {
		t.Fatalf("not started with the LB's grants (registering %v)", c.registering)
	}
	// joined has the next registration join, and returns what its table
	// tells of the groups, with the hosts by id.
	joined := func(i int) (localagg.Joined, map[node.ID]string) {
		t.Helper()
		for _, s := range add(i).sends {
			m := s.m
			if m.Command != control.NodeTable || m.Flags&control.FlagJoin == 0 {
				continue
			}
			rest := m.Body[8+8*int(node.AllGroup)+len(tableLayout(t, m).AppendBinary(nil)):]
			j, ok, err := localagg.ParseJoined(rest, len(m.Nodes), config.MaxHostIDLen)
			if err != nil || !ok {
				t.Fatalf("joining table's groups: %v, told %v", err, ok)
			}
			hosts := map[node.ID]string{}
			for k, info := range m.Nodes {
				hosts[info.ID] = j.Hosts[k]
			}
			return j, hosts
		}
		t.Fatal("no joining table sent")
		return localagg.Joined{}, nil
	}
	w := node.WorkerID
	j, hosts := joined(5)
	wantHosts := map[node.ID]string{w(0): "a", w(1): "a", w(2): "b"}
	for id, h := range wantHosts {
		if hosts[id] != h {
			t.Errorf("joining table names %q as %s's host, want %q (all: %v)", hosts[id], id, h, hosts)
		}
	}
	if !j.Sums {
		t.Error("joining table tells Sums false; want true")
	}
	// After a lost server's retry the workers still sum on their hosts
	// (every node re-forms the groups from the retry's decision).
	c.running = true
	if handled, _ := c.lose(node.ServerID(1), "test"); !handled {
		t.Fatal("server 1's loss not survived")
	}
	if j, _ := joined(6); !j.Sums {
		t.Error("after a retry, the joining table tells Sums false; want true")
	}
}

// TestJoinerHost: a worker joining the running job names its host
// (FPT_HOST_ID) in its registration as at the start: the members hear it
// in NodeJoined, a node joining later finds it in its table, and once it
// is admitted the status page shows it in its host's group.
func TestJoinerHost(t *testing.T) {
	cfg := config.Config{NumServers: 1, NumWorkers: 3, HeartbeatInterval: 1e9, HeartbeatTimeout: 10e9, StartTimeout: 60e9,
		LB: false, WorkerLoss: config.WorkerLossContinue, LocalAggregation: config.LocalAggregationOn}
	c := newHostsCore(cfg)
	regs := []hostReg{{node.Server, "10.0.0.2", ""}, {node.Worker, "10.0.0.2", "a"}, {node.Worker, "10.0.0.2", "a"}, {node.Worker, "10.0.0.2", "b"}, {node.Worker, "10.0.0.2", "a"}, {node.Server, "10.0.0.2", "c"}}
	add := func(i int) ready { return register(c, regs, i) }
	for i := range 4 {
		add(i)
	}
	if c.registering || c.lb == nil {
		t.Fatalf("not started with the LB's grants (registering %v)", c.registering)
	}
	members := []node.ID{node.ServerID(0), node.WorkerID(0), node.WorkerID(1), node.WorkerID(2)}
	joiner := node.WorkerID(3)
	add(4)
	// Its table: the members dial it once they heard of it, with its host.
	heard := 0
	for _, s := range c.step(&control.Message{Command: control.Joined, Sender: joiner, Seq: 0, Origin: "conn4"}, t0).sends {
		if s.m.Command == control.NodeJoined {
			heard++
			if s.m.Text != "a" || len(s.m.Nodes) != 1 || s.m.Nodes[0].ID != joiner {
				t.Errorf("NodeJoined to %s: %v naming host %q, want %s on host a", s.to.ID, s.m.Nodes, s.m.Text, joiner)
			}
		}
	}
	if heard != len(members) {
		t.Errorf("%d members heard of the joiner, want %d", heard, len(members))
	}
	// A node joining later finds its host in its table.
	for _, s := range add(5).sends {
		m := s.m
		if m.Command != control.NodeTable || m.Flags&control.FlagJoin == 0 {
			continue
		}
		rest := m.Body[8+8*int(node.AllGroup)+len(tableLayout(t, m).AppendBinary(nil)):]
		j, _, err := localagg.ParseJoined(rest, len(m.Nodes), config.MaxHostIDLen)
		if err != nil {
			t.Fatal(err)
		}
		for k, info := range m.Nodes {
			if info.ID == joiner && j.Hosts[k] != "a" {
				t.Errorf("a later joiner's table names %q as %s's host, want a", j.Hosts[k], joiner)
			}
		}
	}
	// Admitted: the status page shows it in host a's group.
	c.step(&control.Message{Command: control.Joined, Sender: joiner, Seq: 1, Origin: "conn4"}, t0)
	for i, m := range members {
		c.step(&control.Message{Command: control.Joined, Sender: m, Target: joiner, Seq: 2, Origin: "conn" + string(rune('0'+i))}, t0)
	}
	if got := c.lb.Workers(); len(got) != 4 {
		t.Fatalf("the LB counts workers %v, want the joiner among 4", got)
	}
	shown := map[string]int{}
	for _, m := range c.obs.rec.Snapshot(t0, nil).Members {
		if m.Role == "worker" {
			shown[m.Group]++
		}
	}
	if want := map[string]int{"a (3 workers)": 3, "b (alone)": 1}; !reflect.DeepEqual(shown, want) {
		t.Errorf("status page groups %v, want %v", shown, want)
	}
}
