package cluster

import (
	"log/slog"
	"os"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fptps/fpt/classic"
	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/control"
	"github.com/fptps/fpt/localagg"
	"github.com/fptps/fpt/node"
)

// TestTableHosts: the hosts the table names (FPT_HOST_ID) are the nodes'
// hosts, the address where none is named; malformed ones refuse the
// table.
func TestTableHosts(t *testing.T) {
	newC := func() *core {
		c := newCore(testConfig())
		c.bound(node.Info{Role: node.Worker, Host: "10.0.0.1", ControlPort: infoOf(me).ControlPort, DataPort: infoOf(me).DataPort})
		return c
	}
	m := nodeTable(me, 2, 2, false, 0, classic.Layout{})
	hosts := make([]string, len(m.Nodes))
	for i, info := range m.Nodes {
		if info.ID == node.WorkerID(1) {
			hosts[i] = "gpu-box-1"
		}
	}
	m.Body = localagg.AppendHosts(m.Body, hosts)
	c := newC()
	if r := c.step(m, t0); !r.table || r.startErr != nil {
		t.Fatalf("node table not taken: %v", r.startErr)
	}
	if got := c.topo.hosts[node.WorkerID(1)]; got != "gpu-box-1" {
		t.Errorf("worker 1's host %q, want gpu-box-1", got)
	}
	if _, ok := c.topo.hosts[node.WorkerID(0)]; ok {
		t.Error("worker 0 named no host, yet has one")
	}
	bad := nodeTable(me, 2, 2, false, 0, classic.Layout{})
	bad.Body = localagg.AppendHosts(bad.Body, []string{"too", "few"})
	if r := newC().step(bad, t0); r.startErr == nil {
		t.Error("a table naming the hosts of too few nodes was taken")
	}
}

// TestJoinTableGroups: a node joining a running job takes what its table
// tells of the local groups (after the layout): the hosts the nodes
// named, whether the workers sum (as the members decided it at the
// start, not from the joiner's table) and the iteration a retry ended the
// groups' sums at. A table that tells none leaves the joiner to its
// table's addresses; a garbled one is refused.
func TestJoinTableGroups(t *testing.T) {
	w := node.WorkerID
	l := classic.Layout{Version: 2, Servers: []node.ID{node.ServerID(0)}}
	tests := []struct {
		name      string
		told      *localagg.Joined // nil: no section
		garble    bool
		sums      bool
		groupSize map[string]int
	}{
		{"told: groups sum", &localagg.Joined{Sums: true}, false, true, map[string]int{"a": 2, "b": 1}},
		{"told: they do not sum", &localagg.Joined{Sums: false}, false, false, map[string]int{"a": 2, "b": 1}},
		// The addresses (one for all, in this table) form the groups, and
		// the joiner decides from them.
		{"told nothing", nil, false, true, map[string]int{"10.0.0.1": 3}},
		{"garbled", &localagg.Joined{Sums: true}, true, false, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.LocalAggregation = config.LocalAggregationAuto
			m := nodeTable(me, 1, 3, true, 5, l)
			if tt.told != nil {
				j := *tt.told
				for _, info := range m.Nodes {
					j.Hosts = append(j.Hosts, map[node.ID]string{w(0): "a", w(1): "a", w(2): "b"}[info.ID])
				}
				m.Body = localagg.AppendJoined(m.Body, j)
				if tt.garble {
					m.Body = m.Body[:len(m.Body)-1]
				}
			}
			c := newCore(cfg)
			c.bound(node.Info{Role: node.Worker, Host: "10.0.0.1", ControlPort: infoOf(me).ControlPort, DataPort: infoOf(me).DataPort})
			r := c.step(m, t0)
			if tt.garble {
				if r.startErr == nil {
					t.Fatal("a garbled table was taken")
				}
				return
			}
			if !r.table || r.startErr != nil {
				t.Fatalf("node table not taken: %v", r.startErr)
			}
			n := New(cfg, nil, Planes{})
			n.topo.Store(c.topo)
			if got := n.SumsLocally(); got != tt.sums {
				t.Errorf("SumsLocally %v, want %v", got, tt.sums)
			}
			groups, err := n.LocalGroups()
			if err != nil {
				t.Fatal(err)
			}
			sizes := map[string]int{}
			for _, g := range groups {
				sizes[g.Host] = len(g.Workers)
			}
			if !reflect.DeepEqual(sizes, tt.groupSize) {
				t.Errorf("groups %v, want sizes %v", groups, tt.groupSize)
			}
		})
	}
}

// TestJoinerHost: a member learns the host a joining worker named from
// the scheduler's NodeJoined, so that it forms the joiner's host's group
// with it (localagg.GroupsOver); one that named none is on its address's,
// and an oversized name is ignored.
func TestJoinerHost(t *testing.T) {
	w := node.WorkerID
	for _, tt := range []struct {
		name, named, want string
		group             []node.ID // the joiner's group over the table's workers
	}{
		{"named", "gpu-box-1", "gpu-box-1", []node.ID{w(1), w(2)}},
		{"named another host", "gpu-box-2", "gpu-box-2", []node.ID{w(2)}},
		{"none: its address", "", "10.0.0.1", []node.ID{w(0), w(2)}},
		{"oversized: its address", strings.Repeat("x", config.MaxHostIDLen+1), "10.0.0.1", []node.ID{w(0), w(2)}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := newCore(testConfig())
			c.bound(node.Info{Role: node.Worker, Host: "10.0.0.1", ControlPort: infoOf(me).ControlPort, DataPort: infoOf(me).DataPort})
			m := nodeTable(me, 2, 2, false, 0, classic.Layout{})
			hosts := make([]string, len(m.Nodes))
			for i, info := range m.Nodes {
				if info.ID == w(1) {
					hosts[i] = "gpu-box-1"
				}
			}
			m.Body = localagg.AppendHosts(m.Body, hosts)
			if r := c.step(m, t0); !r.table || r.startErr != nil {
				t.Fatalf("node table not taken: %v", r.startErr)
			}
			before := c.topo.hosts
			joiner := infoOf(w(2))
			if r := c.step(sched(control.Message{Command: control.NodeJoined, Nodes: []node.Info{joiner}, Text: tt.named}), t0); r.dial == nil {
				t.Fatal("the joiner is not dialled")
			}
			n := New(testConfig(), nil, Planes{})
			n.topo.Store(c.topo)
			if got := n.HostOf(w(2)); got != tt.want {
				t.Errorf("the joiner's host %q, want %q", got, tt.want)
			}
			groups, err := localagg.GroupsOver(n.Workers(), n.HostOf)
			if err != nil {
				t.Fatal(err)
			}
			if got := localagg.GroupOf(groups, w(2)).Workers; !reflect.DeepEqual(got, tt.group) {
				t.Errorf("the joiner's group %v, want %v", got, tt.group)
			}
			if _, ok := before[w(2)]; ok {
				t.Error("the earlier topology's hosts changed")
			}
		})
	}
}

// TestHostNamedChecksTheHostsGroup: a worker checks its shared memory for
// the largest group its host may form (every worker of the job, at most
// maxCheckMembers), so that a directory holding a group of two's segment
// but not the host's own group names the host without shared memory: its
// workers then sum alone rather than fail the job at the group's start.
// A tmpfs of 4 MiB holds a group of two's segment of 64 KiB partitions
// (3 MiB and a header), not a group of four's (5 MiB).
func TestHostNamedChecksTheHostsGroup(t *testing.T) {
	if os.Geteuid() != 0 || os.Getenv("FPT_SKIP_ROOT_TESTS") != "" {
		t.Skip("mounting a tmpfs needs root (FPT_SKIP_ROOT_TESTS unset)")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=4m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(dir, 0) })
	for _, tt := range []struct {
		workers int
		want    string
	}{
		{1, "gpu-box"},
		{2, "gpu-box"},
		{4, "gpu-box" + localagg.NoSharedMemory},
		{64, "gpu-box" + localagg.NoSharedMemory}, // checked for 16
	} {
		cfg := testConfig()
		cfg.NumWorkers, cfg.HostID, cfg.PartitionBytes = tt.workers, "gpu-box", 64<<10
		cfg.LocalAggregation, cfg.LocalAggregationDir = config.LocalAggregationAuto, dir
		n := &Member{cfg: cfg, log: slog.New(slog.DiscardHandler)}
		if got := n.hostNamed(infoOf(node.WorkerID(0))); got != tt.want {
			t.Errorf("%d workers: host named %q, want %q", tt.workers, got, tt.want)
		}
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("the checks left %d files", len(left))
	}
}
