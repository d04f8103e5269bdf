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

// TestLocalGroups: the workers' local groups form from the hosts they
// named at registration (FPT_HOST_ID), else their addresses; servers
// belong to none, and an oversized name is ignored.
func TestLocalGroups(t *testing.T) {
	cfg := config.Config{NumServers: 1, NumWorkers: 5, HeartbeatInterval: 1e9, HeartbeatTimeout: 10e9, StartTimeout: 60e9, LB: false}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	c := newCore(cfg, log, node.Info{Host: "10.0.0.1", ControlPort: 9000}, control.NewRejecter(log, nil), observer{rec: status.NewRecorder(false, cfg.HeartbeatTimeout, 0)}, t0)
	regs := []struct {
		role     node.Role
		addr, id string
	}{
		{node.Server, "10.0.0.2", "a"},
		{node.Worker, "10.0.0.2", "a"},
		{node.Worker, "10.0.0.3", "a"}, // another address, the same named host
		{node.Worker, "10.0.0.2", "b"},
		{node.Worker, "10.0.0.4", ""},
		{node.Worker, "10.0.0.5", strings.Repeat("x", config.MaxHostIDLen+1)},
	}
	for i, r := range regs {
		info := node.Info{Role: r.role, Host: r.addr, ControlPort: 9100 + 2*i, DataPort: 9101 + 2*i}
		c.step(&control.Message{Command: control.AddNode, Nodes: []node.Info{info}, Origin: "conn" + string(rune('0'+i)), Text: r.id}, t0)
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
