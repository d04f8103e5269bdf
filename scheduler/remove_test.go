package scheduler

import (
	"reflect"
	"slices"
	"testing"

	"github.com/fptps/fpt/node"
)

// TestBarriersRemove: a member that leaves the job (a server lost under
// FPT_ON_SERVER_LOSS=retry) releases the barriers it was the last one
// missing from, and later barriers wait only for the members left; an
// arrival it made before leaving does not count towards them.
func TestBarriersRemove(t *testing.T) {
	const (
		s0, s1, s2 = node.ID(8), node.ID(10), node.ID(12)
		w0, w1     = node.ID(9), node.ID(11)
		servers    = node.ServerGroup
		workers    = node.WorkerGroup
		all        = node.AllGroup
		data       = node.ServerGroup | node.WorkerGroup
	)
	table := []node.Info{{ID: node.SchedulerID}, {ID: s0}, {ID: s1}, {ID: s2}, {ID: w0}, {ID: w1}}
	// op is an arrival (remove false) or a departure; want is what it
	// releases: one barrier for an arrival, all of them for a departure.
	type op struct {
		remove bool
		id     node.ID
		g      node.Group
		seq    uint64
		want   []release
	}
	arrive := func(id node.ID, g node.Group, seq uint64, want ...node.ID) op {
		o := op{id: id, g: g, seq: seq}
		if want != nil {
			o.want = []release{{g, seq, want}}
		}
		return o
	}
	remove := func(id node.ID, want ...release) op { return op{remove: true, id: id, want: want} }
	cases := []struct {
		name string
		ops  []op
	}{
		{"the last one missing: released", []op{
			arrive(s0, servers, 0),
			arrive(s2, servers, 0),
			remove(s1, release{servers, 0, []node.ID{s0, s2}}),
		}},
		{"every group it was missing from, in order", []op{
			arrive(s0, all, 0), arrive(s2, all, 0), arrive(w0, all, 0), arrive(w1, all, 0),
			arrive(s0, servers, 0), arrive(s2, servers, 0),
			arrive(w1, data, 0), arrive(s0, data, 0), arrive(s2, data, 0), arrive(w0, data, 0),
			arrive(s0, servers|node.SchedulerGroup, 0), // s2 missing: stays
			remove(s1,
				release{servers, 0, []node.ID{s0, s2}},
				release{data, 0, []node.ID{s0, s2, w0, w1}},
				release{all, 0, []node.ID{s0, s2, w0, w1}}),
			arrive(s2, servers|node.SchedulerGroup, 0, s0, s2),
		}},
		{"others still missing: nothing released", []op{
			arrive(s0, servers, 0),
			remove(s1),
			arrive(s2, servers, 0, s0, s2),
		}},
		{"its own arrival neither counts nor releases early", []op{
			arrive(s1, servers, 0),
			arrive(s0, servers, 0),
			remove(s1),
			arrive(s2, servers, 0, s0, s2),
			// The next barrier needs the same two, once each.
			arrive(s2, servers, 1),
			arrive(s0, servers, 1, s0, s2),
		}},
		{"later barriers need only the members left", []op{
			remove(s1),
			arrive(s0, servers, 0),
			arrive(s2, servers, 0, s0, s2),
			arrive(w0, all, 0), arrive(s0, all, 0), arrive(w1, all, 0),
			arrive(s2, all, 0, s0, s2, w0, w1),
		}},
		{"a worker barrier is not its to release", []op{
			arrive(w0, workers, 0),
			remove(s1),
			arrive(w1, workers, 0, w0, w1),
		}},
		{"two servers leave", []op{
			arrive(s0, servers, 0),
			remove(s1),
			remove(s2, release{servers, 0, []node.ID{s0}}),
			arrive(s0, servers, 1, s0),
		}},
		{"an unknown id changes nothing", []op{
			arrive(s0, servers, 0), arrive(s2, servers, 0),
			remove(node.ServerID(9)),
			arrive(s1, servers, 0, s0, s1, s2),
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := newBarriers(table)
			for i, o := range tc.ops {
				var got []release
				if o.remove {
					got = b.remove(o.id)
				} else {
					rel, err := b.arrive(o.id, o.g, o.seq)
					if err != nil {
						t.Fatalf("op %d: %v", i, err)
					}
					if rel != nil {
						got = []release{{o.g, o.seq, rel}}
					}
				}
				if !reflect.DeepEqual(got, o.want) {
					t.Fatalf("op %d (%+v): released %v, want %v", i, o, got, o.want)
				}
			}
			if len(b.arrived) != 0 {
				t.Errorf("%d barriers still pending at the end", len(b.arrived))
			}
		})
	}
}

// TestBarriersRefuseDeparted: an arrival from a member that left (its
// message was in flight) is refused: counted, it would stand in for a
// member still missing and release the barrier early.
func TestBarriersRefuseDeparted(t *testing.T) {
	s0, s1, s2 := node.ServerID(0), node.ServerID(1), node.ServerID(2)
	b := newBarriers([]node.Info{{ID: node.SchedulerID}, {ID: s0}, {ID: s1}, {ID: s2}, {ID: node.WorkerID(0)}})
	if rel := b.remove(s1); rel != nil {
		t.Fatalf("released %v", rel)
	}
	for _, g := range []node.Group{node.ServerGroup, node.AllGroup} {
		if rel, err := b.arrive(s1, g, 0); err == nil {
			t.Errorf("group %d: arrival of the departed %s accepted (release %v)", g, s1, rel)
		}
	}
	if rel, err := b.arrive(s0, node.ServerGroup, 0); err != nil || rel != nil {
		t.Fatalf("%s: %v, %v: released without %s", s0, rel, err, s2)
	}
	if rel, err := b.arrive(s2, node.ServerGroup, 0); err != nil || !slices.Equal(rel, []node.ID{s0, s2}) {
		t.Fatalf("%s: %v, %v", s2, rel, err)
	}
}
