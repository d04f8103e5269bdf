package scheduler

import (
	"fmt"
	"slices"
	"testing"

	"github.com/fptps/fpt/node"
)

func TestRegistryAssignsPsLiteIDs(t *testing.T) {
	r := registry{servers: 2, workers: 2}
	in := []node.Info{
		{Role: node.Worker, Host: "10.0.0.2", ControlPort: 100, DataPort: 101},
		{Role: node.Server, Host: "10.0.0.3", ControlPort: 50, DataPort: 51},
		{Role: node.Worker, Host: "10.0.0.1", ControlPort: 200, DataPort: 201},
		{Role: node.Server, Host: "10.0.0.3", ControlPort: 40, DataPort: 41},
	}
	for i, info := range in {
		if r.complete() {
			t.Fatalf("complete after %d registrations", i)
		}
		if err := r.add(info, fmt.Sprint("conn", i)); err != nil {
			t.Fatal(err)
		}
	}
	if !r.complete() {
		t.Fatal("not complete")
	}
	got := r.assign(node.Info{Host: "10.0.0.9", ControlPort: 9000})
	want := []struct {
		id   node.ID
		host string
		port int
	}{
		{1, "10.0.0.9", 9000},
		{node.ServerID(0), "10.0.0.3", 40},
		{node.ServerID(1), "10.0.0.3", 50},
		{node.WorkerID(0), "10.0.0.1", 200},
		{node.WorkerID(1), "10.0.0.2", 100},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d nodes", len(got))
	}
	for i, w := range want {
		if got[i].ID != w.id || got[i].Host != w.host || got[i].ControlPort != w.port {
			t.Errorf("node %d = %+v; want id %d at %s:%d", i, got[i], w.id, w.host, w.port)
		}
	}
}

func TestRegistryRejects(t *testing.T) {
	ok := node.Info{Role: node.Server, Host: "h", ControlPort: 1, DataPort: 2}
	tests := []struct {
		name string
		info node.Info
	}{
		{"scheduler role", node.Info{Role: node.Scheduler, Host: "h", ControlPort: 1, DataPort: 2}},
		{"no host", node.Info{Role: node.Server, ControlPort: 1, DataPort: 2}},
		{"bad port", node.Info{Role: node.Server, Host: "h", ControlPort: 70000, DataPort: 2}},
		{"twice", ok},
		{"too many", node.Info{Role: node.Server, Host: "h", ControlPort: 5, DataPort: 6}},
		{"one connection twice", node.Info{Role: node.Worker, Host: "h", ControlPort: 5, DataPort: 6}},
	}
	for _, tt := range tests {
		r := registry{servers: 1, workers: 1}
		origin := "b"
		if tt.name == "twice" || tt.name == "too many" || tt.name == "one connection twice" {
			if err := r.add(ok, "a"); err != nil {
				t.Fatal(err)
			}
			if tt.name == "one connection twice" {
				origin = "a"
			}
		}
		if err := r.add(tt.info, origin); err == nil {
			t.Errorf("%s: accepted %+v", tt.name, tt.info)
		}
	}
}

func TestBarriers(t *testing.T) {
	table := []node.Info{{ID: 1}, {ID: 8}, {ID: 10}, {ID: 9}, {ID: 11}}
	b := newBarriers(table)
	// Workers only: released by the second worker.
	if rel, err := b.arrive(9, node.WorkerGroup, 0); err != nil || rel != nil {
		t.Fatalf("first arrival: %v %v", rel, err)
	}
	rel, err := b.arrive(11, node.WorkerGroup, 0)
	if err != nil || !slices.Equal(rel, []node.ID{9, 11}) {
		t.Fatalf("release = %v, %v", rel, err)
	}
	// Different sequence numbers are different barriers.
	if rel, _ := b.arrive(9, node.WorkerGroup, 1); rel != nil {
		t.Fatal("released early")
	}
	if rel, _ := b.arrive(11, node.WorkerGroup, 2); rel != nil {
		t.Fatal("seq 2 released seq 1")
	}
	// All nodes: the scheduler does not arrive.
	for _, id := range []node.ID{8, 9, 10} {
		if rel, _ := b.arrive(id, node.AllGroup, 0); rel != nil {
			t.Fatalf("released before %d", id)
		}
	}
	if rel, _ := b.arrive(11, node.AllGroup, 0); len(rel) != 4 {
		t.Fatalf("all-group release = %v", rel)
	}
	for _, tc := range []struct {
		id node.ID
		g  node.Group
	}{{8, node.WorkerGroup}, {1, node.AllGroup}, {9, 0}, {9, 8}} {
		if _, err := b.arrive(tc.id, tc.g, 5); err == nil {
			t.Errorf("arrive(%d, group %d) accepted", tc.id, tc.g)
		}
	}
	if _, err := b.arrive(9, node.WorkerGroup, 1); err == nil {
		t.Error("double arrival accepted")
	}
}

// TestBarrierSequence: a member is accepted only at its next barrier of a
// group, so a forged future arrival neither counts nor is kept, and the
// table stays bounded however many arrive.
func TestBarrierSequence(t *testing.T) {
	b := newBarriers([]node.Info{{ID: 1}, {ID: 9}, {ID: 11}})
	// 450k forged future arrivals for worker 11: all refused, none kept.
	for seq := uint64(1); seq < 450_000; seq++ {
		if _, err := b.arrive(11, node.WorkerGroup, seq); err == nil {
			t.Fatalf("arrival of 11 at future barrier %d accepted", seq)
		}
	}
	if len(b.arrived) != 0 {
		t.Fatalf("%d barriers kept for refused arrivals", len(b.arrived))
	}
	// The real run is not disturbed: barrier 0 releases both.
	if rel, err := b.arrive(9, node.WorkerGroup, 0); err != nil || rel != nil {
		t.Fatalf("9 at 0: %v, %v", rel, err)
	}
	if rel, err := b.arrive(11, node.WorkerGroup, 0); err != nil || len(rel) != 2 {
		t.Fatalf("11 at 0: %v, %v", rel, err)
	}
	// A replayed (past) number is refused too.
	if _, err := b.arrive(9, node.WorkerGroup, 0); err == nil {
		t.Error("replayed barrier 0 accepted")
	}
	if rel, err := b.arrive(9, node.WorkerGroup, 1); err != nil || rel != nil {
		t.Fatalf("9 at 1: %v, %v", rel, err)
	}
	if len(b.arrived) > 1 {
		t.Errorf("%d pending barriers, want at most one per group", len(b.arrived))
	}
}

// TestRegistryBounded: registrations beyond the cluster's size are refused,
// so forged AddNodes cannot grow the table.
func TestRegistryBounded(t *testing.T) {
	r := registry{servers: 1, workers: 1}
	for i := range 10_000 {
		_ = r.add(node.Info{Role: node.Worker, Host: "h", ControlPort: 1 + i%60000, DataPort: 2}, fmt.Sprint(i))
	}
	if len(r.pending) != 1 || len(r.origins) != 1 {
		t.Errorf("%d registrations kept, want 1", len(r.pending))
	}
}

// A worker process's further customers (AddNode with Seq) each count as
// one of the workers, from the process's own connection only; the
// registrations complete the cluster once servers and customers add up.
func TestRegistryWorkerCustomers(t *testing.T) {
	srv := node.Info{Role: node.Server, Host: "h", ControlPort: 10, DataPort: 11}
	w := node.Info{Role: node.Worker, Host: "h", ControlPort: 20, DataPort: 21}
	w2 := node.Info{Role: node.Worker, Host: "h", ControlPort: 30, DataPort: 31}
	type reg struct {
		info   node.Info
		origin string
		seq    uint64 // 0: the node's own AddNode
		ok     bool
	}
	tests := []struct {
		name     string
		workers  int
		regs     []reg
		complete bool
		weight   int // of w at the end
	}{
		{"one process of two customers", 2, []reg{{srv, "s", 0, true}, {w, "w", 0, true}, {w, "w", 2, true}}, true, 2},
		{"customer before its node", 2, []reg{{srv, "s", 0, true}, {w, "w", 2, false}, {w, "w", 0, true}}, false, 1},
		{"customer twice", 3, []reg{{w, "w", 0, true}, {w, "w", 2, true}, {w, "w", 2, false}}, false, 2},
		{"customer from another connection", 2, []reg{{w, "w", 0, true}, {w, "x", 2, false}}, false, 1},
		{"customer of a server", 1, []reg{{srv, "s", 0, true}, {srv, "s", 2, false}}, false, 1},
		{"one customer too many", 2, []reg{{w, "w", 0, true}, {w2, "w2", 0, true}, {w, "w", 2, false}}, false, 1},
		{"a process too many", 2, []reg{{w, "w", 0, true}, {w, "w", 3, true}, {w2, "w2", 0, false}}, false, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := registry{servers: 1, workers: tt.workers}
			for i, g := range tt.regs {
				var err error
				if g.seq == 0 {
					err = r.add(g.info, g.origin)
				} else {
					err = r.addCustomer(g.info, g.origin, g.seq)
				}
				if (err == nil) != g.ok {
					t.Errorf("registration %d (%s seq %d): err %v, want ok %v", i, g.info, g.seq, err, g.ok)
				}
			}
			if r.complete() != tt.complete {
				t.Errorf("complete() = %v, want %v", r.complete(), tt.complete)
			}
			if got := r.weightOf(w); got != tt.weight {
				t.Errorf("weightOf(worker) = %d, want %d", got, tt.weight)
			}
		})
	}
}
