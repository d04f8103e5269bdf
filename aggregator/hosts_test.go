package aggregator

import (
	"math"
	"reflect"
	"testing"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/node"
)

func TestHostGroups(t *testing.T) {
	w := node.WorkerID
	// Hosts: {w0, w2, w3} and {w1}.
	g := &hostGroups{members: map[node.ID][]node.ID{w(0): {w(2), w(3)}, w(1): nil}, follower: map[node.ID]bool{w(2): true, w(3): true}, until: math.MaxUint64}
	ws := []node.ID{w(0), w(1), w(2), w(3)}
	if also, err := g.also(w(0), 5, ws); err != nil || !reflect.DeepEqual(also, []int{2, 3}) {
		t.Errorf("also(w0) = %v, %v; want [2 3]", also, err)
	}
	for _, from := range []node.ID{w(1), w(2)} {
		if _, err := g.also(from, 5, ws); err == nil {
			t.Errorf("a host sum from %s, which leads no group of several, was taken", from)
		}
	}
	if _, err := g.also(w(0), 5, ws[:3]); err == nil {
		t.Error("a host sum holding a worker not of the iteration was taken")
	}
	var none *hostGroups
	if _, err := none.also(w(0), 5, ws); err == nil {
		t.Error("a host sum taken without local aggregation")
	}
	push := func(iter uint64) *frame.Header { return &frame.Header{Iteration: iter} }
	initRound := &frame.Header{Flags: frame.FlagInit}
	if got := g.recipients(push(5), ws, []node.ID{w(2), w(3)}); !reflect.DeepEqual(got, []node.ID{w(0), w(1)}) {
		t.Errorf("recipients %v, want the leaders [w0 w1]", got)
	}
	if got := g.recipients(initRound, ws, nil); !reflect.DeepEqual(got, []node.ID{w(0), w(1)}) {
		t.Errorf("recipients of the init round %v, want the leaders [w0 w1]", got)
	}
	// Members that pushed their own (their group no longer sums, or this
	// node joined and knows nothing of a retry): sent their sums.
	if got := g.recipients(push(5), ws, nil); !reflect.DeepEqual(got, ws) {
		t.Errorf("recipients of members' own pushes %v, want every worker", got)
	}
	if got := none.recipients(push(5), ws, nil); !reflect.DeepEqual(got, ws) {
		t.Errorf("recipients without groups %v, want every worker", got)
	}
	// A retry from iteration 7 (a lost worker) dissolves the groups from
	// there on: every worker pushes its own and is sent the sums.
	g.dissolve(7)
	g.dissolve(9) // a later retry does not bring them back before it
	if _, err := g.also(w(0), 6, ws); err != nil {
		t.Errorf("a host sum of iteration 6, before the retry, refused: %v", err)
	}
	if _, err := g.also(w(0), 7, ws); err == nil {
		t.Error("a host sum of iteration 7, from which the groups are dissolved, was taken")
	}
	if got := g.recipients(push(6), ws, []node.ID{w(2), w(3)}); !reflect.DeepEqual(got, []node.ID{w(0), w(1)}) {
		t.Errorf("recipients of iteration 6 %v, want the leaders [w0 w1]", got)
	}
	if got := g.recipients(push(7), ws, nil); !reflect.DeepEqual(got, ws) {
		t.Errorf("recipients of iteration 7, after the groups were dissolved, %v; want every worker", got)
	}
	none.dissolve(7) // no groups: nothing to do
	if !reflect.DeepEqual(ws, []node.ID{w(0), w(1), w(2), w(3)}) {
		t.Error("recipients modified the workers' slice")
	}
}
