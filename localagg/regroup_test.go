package localagg

import (
	"reflect"
	"testing"

	"github.com/fptps/fpt/node"
)

func TestGroupsOver(t *testing.T) {
	w := node.WorkerID
	hosts := map[node.ID]string{w(0): "a", w(1): "b", w(2): "a", w(3): "a", w(4): "a", w(5): "b" + NoSharedMemory, w(6): "b"}
	hostOf := func(id node.ID) string { return hosts[id] }
	for _, tt := range []struct {
		name string
		ws   []node.ID
		want []Group
	}{
		{"the start", []node.ID{w(0), w(1), w(2), w(3)}, []Group{{"a", []node.ID{w(0), w(2), w(3)}}, {"b", []node.ID{w(1)}}}},
		{"the leader lost", []node.ID{w(1), w(2), w(3)}, []Group{{"b", []node.ID{w(1)}}, {"a", []node.ID{w(2), w(3)}}}},
		{"a member lost", []node.ID{w(0), w(1), w(3)}, []Group{{"a", []node.ID{w(0), w(3)}}, {"b", []node.ID{w(1)}}}},
		{"a joiner joins its host's group", []node.ID{w(0), w(1), w(2), w(4)}, []Group{{"a", []node.ID{w(0), w(2), w(4)}}, {"b", []node.ID{w(1)}}}},
		{"a joiner after the leader's loss", []node.ID{w(1), w(2), w(3), w(4)}, []Group{{"b", []node.ID{w(1)}}, {"a", []node.ID{w(2), w(3), w(4)}}}},
		{"a joiner on a host of one", []node.ID{w(0), w(1), w(6)}, []Group{{"a", []node.ID{w(0)}}, {"b", []node.ID{w(1), w(6)}}}},
		{"a joiner without shared memory", []node.ID{w(0), w(1), w(5)}, []Group{{"a", []node.ID{w(0)}}, {"b", []node.ID{w(1)}}, {"b" + NoSharedMemory, []node.ID{w(5)}}}},
		{"one left on a host", []node.ID{w(1), w(3)}, []Group{{"b", []node.ID{w(1)}}, {"a", []node.ID{w(3)}}}},
		{"no shared memory", []node.ID{w(1), w(5)}, []Group{{"b", []node.ID{w(1)}}, {"b" + NoSharedMemory, []node.ID{w(5)}}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := GroupsOver(tt.ws, hostOf)
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Errorf("GroupsOver(%v) = %v, %v; want %v", tt.ws, got, err, tt.want)
			}
		})
	}
	if _, err := GroupsOver([]node.ID{w(0), w(9)}, hostOf); err == nil {
		t.Error("a worker with no host was grouped")
	}
}

func TestRegroup(t *testing.T) {
	w := node.WorkerID
	g := func(ws ...node.ID) Group { return Group{Host: "a", Workers: ws} }
	for _, tt := range []struct {
		name      string
		old, next Group
		retry     bool
		want      Change
	}{
		{"unchanged", g(w(0), w(1)), g(w(0), w(1)), false, Change{}},
		{"alone, unchanged", g(w(0)), g(w(0)), false, Change{}},
		{"a retry re-forms the same workers", g(w(0), w(1)), g(w(0), w(1)), true, Change{Dissolve: true, Form: true, New: g(w(0), w(1))}},
		{"a retry for a lost member", g(w(0), w(1), w(2)), g(w(0), w(2)), true, Change{Dissolve: true, Form: true, New: g(w(0), w(2))}},
		{"a retry for a lost leader", g(w(0), w(1), w(2)), g(w(1), w(2)), true, Change{Dissolve: true, Form: true, New: g(w(1), w(2))}},
		{"one left", g(w(0), w(1)), g(w(1)), true, Change{Dissolve: true, New: g(w(1))}},
		{"a retry alone", g(w(1)), g(w(1)), true, Change{New: g(w(1))}},
		{"a worker joins", g(w(0), w(1)), g(w(0), w(1), w(4)), false, Change{Dissolve: true, Form: true, New: g(w(0), w(1), w(4))}},
		{"a joiner's first group", Group{}, g(w(0), w(4)), false, Change{Form: true, New: g(w(0), w(4))}},
		{"a worker of the group leaves", g(w(0), w(1), w(2)), g(w(0), w(1)), false, Change{Dissolve: true, Form: true, New: g(w(0), w(1))}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := Regroup(tt.old, tt.next, tt.retry); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Regroup(%v, %v, retry %v) = %+v; want %+v", tt.old.Workers, tt.next.Workers, tt.retry, got, tt.want)
			}
		})
	}
}
