package aggregator

import (
	"reflect"
	"slices"
	"testing"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/node"
)

func TestHostGroups(t *testing.T) {
	w := node.WorkerID
	// Hosts: {w0, w2, w3} and {w1}; w4 joined the job on host a.
	hosts := map[node.ID]string{w(0): "a", w(1): "b", w(2): "a", w(3): "a", w(4): "a"}
	ws := []node.ID{w(0), w(1), w(2), w(3)}
	g := &hostGroups{hostOf: func(id node.ID) string { return hosts[id] }}
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
	// there on; w4 joined at 9, in w2's group.
	left := []node.ID{w(1), w(2), w(3)}
	g.regroup(7, left)
	g.regroup(9, append(left, w(4)))
	if _, err := g.also(w(0), 6, ws); err != nil {
		t.Errorf("a host sum of iteration 6, before the retry, refused: %v", err)
	}
	if _, err := g.also(w(0), 7, left); err == nil {
		t.Error("a host sum of iteration 7 from the lost leader was taken")
	}
	if also, err := g.also(w(2), 7, left); err != nil || !reflect.DeepEqual(also, []int{2}) {
		t.Errorf("iteration 7: also(w2) = %v, %v; want [2] (w3)", also, err)
	}
	if also, err := g.also(w(2), 9, append(left, w(4))); err != nil || !reflect.DeepEqual(also, []int{2, 3}) {
		t.Errorf("iteration 9: also(w2) = %v, %v; want [2 3] (w3, w4)", also, err)
	}
	if _, err := g.also(w(4), 9, append(left, w(4))); err == nil {
		t.Error("a host sum from w4, a member of w2's group, was taken")
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

// TestHostGroupsJoin: a worker that joins a running job is in its host's
// group from the join's iteration on, at every aggregator: the leader's
// host sums hold it from there, and it is sent no sum of its own.
func TestHostGroupsJoin(t *testing.T) {
	w := node.WorkerID
	// Hosts a {w0, w1} and b {w2}; w3 joins on a and w4 on b at
	// iteration 6, w5 on c (alone) at 8.
	hosts := map[node.ID]string{w(0): "a", w(1): "a", w(2): "b", w(3): "a", w(4): "b", w(5): "c"}
	g := &hostGroups{hostOf: func(id node.ID) string { return hosts[id] }}
	start := []node.ID{w(0), w(1), w(2)}
	joined := []node.ID{w(0), w(1), w(2), w(3), w(4)}
	third := append(slices.Clone(joined), w(5))
	g.regroup(0, start)
	g.regroup(6, joined)
	g.regroup(8, third)
	for _, tt := range []struct {
		name    string
		leader  node.ID
		iter    uint64
		ws      []node.ID
		also    []int // nil: refused
		covered []node.ID
		sent    []node.ID
	}{
		{"a's sum before the join", w(0), 5, start, []int{1}, []node.ID{w(1)}, []node.ID{w(0), w(2)}},
		{"a's sum holding the joiner", w(0), 6, joined, []int{1, 3}, []node.ID{w(1), w(3)}, []node.ID{w(0), w(2), w(4)}},
		{"b alone before the join", w(2), 5, start, nil, nil, start},
		{"b's first host sum", w(2), 6, joined, []int{4}, []node.ID{w(4)}, []node.ID{w(0), w(1), w(2), w(3)}},
		{"a joiner leads nothing", w(3), 7, joined, nil, nil, joined},
		{"alone on a host of its own", w(5), 8, third, nil, nil, third},
		{"a's sum after another join", w(0), 9, third, []int{1, 3}, []node.ID{w(1), w(3)}, []node.ID{w(0), w(2), w(4), w(5)}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			also, err := g.also(tt.leader, tt.iter, tt.ws)
			if tt.also == nil {
				if err == nil {
					t.Errorf("also(%s, %d) = %v; want refused", tt.leader, tt.iter, also)
				}
			} else if err != nil || !reflect.DeepEqual(also, tt.also) {
				t.Errorf("also(%s, %d) = %v, %v; want %v", tt.leader, tt.iter, also, err, tt.also)
			}
			if got := g.recipients(&frame.Header{Iteration: tt.iter}, tt.ws, tt.covered); !reflect.DeepEqual(got, tt.sent) {
				t.Errorf("recipients = %v; want %v", got, tt.sent)
			}
		})
	}
}
