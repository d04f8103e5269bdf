package localagg

import (
	"reflect"
	"testing"

	"github.com/fptps/fpt/node"
)

func TestGroups(t *testing.T) {
	s0 := node.ServerID(0)
	tests := []struct {
		name    string
		members []Member
		want    []Group
		sizes   []int
		err     bool
	}{
		{"one host", []Member{{w1, "a"}, {w0, "a"}}, []Group{{"a", []node.ID{w0, w1}}}, []int{2}, false},
		{"uneven hosts, servers ignored", []Member{{w3, "b"}, {w1, "a"}, {s0, "a"}, {w2, "c"}, {w0, "b"}},
			[]Group{{"b", []node.ID{w0, w3}}, {"a", []node.ID{w1}}, {"c", []node.ID{w2}}}, []int{2, 1, 1}, false},
		{"no shared memory: alone, the others of its host together", []Member{{w0, "a" + NoSharedMemory}, {w1, "a"}, {w2, "a" + NoSharedMemory}, {w3, "a"}},
			[]Group{{"a" + NoSharedMemory, []node.ID{w0}}, {"a", []node.ID{w1, w3}}, {"a" + NoSharedMemory, []node.ID{w2}}}, []int{1, 2, 1}, false},
		{"a worker named twice", []Member{{w0, "a"}, {w0, "b"}}, nil, nil, true},
		{"a worker without a host", []Member{{w0, ""}}, nil, nil, true},
		{"none", nil, []Group{}, []int{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Groups(tt.members)
			if (err != nil) != tt.err {
				t.Fatalf("err %v, want error %v", err, tt.err)
			}
			if tt.err {
				return
			}
			if !reflect.DeepEqual(got, tt.want) || !reflect.DeepEqual(Sizes(got), tt.sizes) {
				t.Fatalf("got %+v (sizes %v), want %+v (%v)", got, Sizes(got), tt.want, tt.sizes)
			}
			for i, g := range got {
				for _, w := range g.Workers {
					if HostOf(got)[w] != i {
						t.Errorf("HostOf(%s) = %d, want %d", w, HostOf(got)[w], i)
					}
				}
			}
		})
	}
}
