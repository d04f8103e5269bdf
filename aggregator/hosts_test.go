package aggregator

import (
	"reflect"
	"testing"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/node"
)

func TestHostGroups(t *testing.T) {
	w := node.WorkerID
	// Hosts: {w0, w2, w3} and {w1}; w4 joined the job on host a.
	hosts := map[node.ID]string{w(0): "a", w(1): "b", w(2): "a", w(3): "a", w(4): "a"}
	ws := []node.ID{w(0), w(1), w(2), w(3)}
	g := &hostGroups{hostOf: func(id node.ID) string { return hosts[id] }, started: 4}
	g.regroup(0, ws)
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
	// Members that pushed their own (a host sum of theirs was lost):
	// sent their sums.
	if got := g.recipients(push(5), ws, nil); !reflect.DeepEqual(got, ws) {
		t.Errorf("recipients of members' own pushes %v, want every worker", got)
	}
	if got := none.recipients(push(5), ws, nil); !reflect.DeepEqual(got, ws) {
		t.Errorf("recipients without groups %v, want every worker", got)
	}
	// The leader w0 lost, a retry from iteration 7: w2 leads w3 from
	// there on; w4 joined at 9 and sums alone.
	left := []node.ID{w(1), w(2), w(3)}
	g.regroup(7, left)
	g.regroup(9, append(left, w(4)))
	if _, err := g.also(w(0), 6, ws); err != nil {
		t.Errorf("a host sum of iteration 6, before the retry, refused: %v", err)
	}
	if _, err := g.also(w(0), 7, left); err == nil {
		t.Error("a host sum of iteration 7 from the lost leader was taken")
	}
	for _, iter := range []uint64{7, 9} {
		if also, err := g.also(w(2), iter, left); err != nil || !reflect.DeepEqual(also, []int{2}) {
			t.Errorf("iteration %d: also(w2) = %v, %v; want [2] (w3)", iter, also, err)
		}
	}
	if _, err := g.also(w(4), 9, append(left, w(4))); err == nil {
		t.Error("a host sum from w4, which joined and sums alone, was taken")
	}
	if got := g.recipients(initRound, ws, nil); !reflect.DeepEqual(got, []node.ID{w(0), w(1)}) {
		t.Errorf("recipients of an init round of iteration 0 %v, want the leaders then [w0 w1]", got)
	}
	if got := g.recipients(push(7), left, []node.ID{w(3)}); !reflect.DeepEqual(got, []node.ID{w(1), w(2)}) {
		t.Errorf("recipients of iteration 7 %v, want the new leaders [w1 w2]", got)
	}
	// A retry back to iteration 8 replaces the groups from 9.
	g.regroup(8, left)
	if len(g.sets) != 3 || g.sets[2].from != 8 {
		t.Errorf("after a regroup from 8, sets from %v; want 0, 7, 8", g.sets)
	}
	none.regroup(7, left) // no groups: nothing to do
	if !reflect.DeepEqual(ws, []node.ID{w(0), w(1), w(2), w(3)}) {
		t.Error("recipients modified the workers' slice")
	}
}
