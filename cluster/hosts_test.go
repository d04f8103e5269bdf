package cluster

import (
	"testing"

	"github.com/fptps/fpt/classic"
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
