package aggregator

import (
	"fmt"
	"slices"

	"github.com/fptps/fpt/cluster"
	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/localagg"
	"github.com/fptps/fpt/node"
)

// hostGroups is what an aggregator knows of the workers' local groups:
// whom a leader's host sum stands for, and who is sent the sums, from
// each iteration on. The groups of an iteration are those of its workers
// (localagg.GroupsOver): a decision that changes the workers (a retry
// for a lost worker, a join, whose worker joins its host's group)
// re-forms them from its iteration on, as every worker does from the
// same decision (worker/localagg_groups.go).
type hostGroups struct {
	hostOf func(node.ID) string
	sets   []groupSet
	err    error
}

// groupSet is the groups of the iterations from from on.
type groupSet struct {
	from uint64
	// members lists each leader's other members (groups of one: none).
	members map[node.ID][]node.ID
	// follower: a member that is no leader, sent no sums.
	follower map[node.ID]bool
}

// newHostGroups forms the groups of ws, the workers of the iterations
// from 0 on.
func newHostGroups(n *cluster.Member, ws []node.ID) *hostGroups {
	g := &hostGroups{hostOf: n.HostOf}
	g.regroup(0, ws)
	return g
}

// regroup makes the groups of ws those of every iteration from from on
// (replacing any taking effect there or later, as the worker sets are).
func (g *hostGroups) regroup(from uint64, ws []node.ID) {
	if g == nil || g.err != nil {
		return
	}
	groups, err := localagg.GroupsOver(ws, g.hostOf)
	if err != nil {
		g.err = err
		return
	}
	s := groupSet{from: from, members: map[node.ID][]node.ID{}, follower: map[node.ID]bool{}}
	for _, gr := range groups {
		s.members[gr.Leader()] = gr.Workers[1:]
		for _, w := range gr.Workers[1:] {
			s.follower[w] = true
		}
	}
	keep := len(g.sets)
	for keep > 0 && g.sets[keep-1].from >= from {
		keep--
	}
	g.sets = append(g.sets[:keep], s)
}

// at is the groups of iteration iter.
func (g *hostGroups) at(iter uint64) groupSet {
	i := len(g.sets) - 1
	for i > 0 && g.sets[i].from > iter {
		i--
	}
	return g.sets[i]
}

// also returns the indexes in ws of the workers whose values leader's host
// sum of iteration iter holds besides its own. A host sum from a node
// that leads no group of more than one in that iteration is refused: it
// would count for workers it does not hold.
func (g *hostGroups) also(leader node.ID, iter uint64, ws []node.ID) ([]int, error) {
	switch {
	case g == nil:
		return nil, fmt.Errorf("host sum from %s, yet workers do not sum locally here (FPT_LOCAL_AGGREGATION)", leader)
	case g.err != nil:
		return nil, fmt.Errorf("host sum from %s: %w", leader, g.err)
	}
	members := g.at(iter).members[leader]
	if len(members) == 0 {
		return nil, fmt.Errorf("host sum from %s of iteration %d, yet it leads no local group of several workers there", leader, iter)
	}
	also := make([]int, 0, len(members))
	for _, w := range members {
		i := slices.Index(ws, w)
		if i < 0 {
			return nil, fmt.Errorf("host sum from %s holds %s, no worker of the iteration (%v)", leader, w, ws)
		}
		also = append(also, i)
	}
	return also, nil
}

// recipients are the workers of ws sent a sum of the partition h: every
// worker but the members whose leader's host sum held their values
// (covered), which their leader hands the sum to. An init round's (only
// worker 0 pushes, no host sum) goes to the leaders and the workers alone
// on their hosts, since the leaders hand it on too.
func (g *hostGroups) recipients(h *frame.Header, ws, covered []node.ID) []node.ID {
	if g == nil || g.err != nil {
		return ws
	}
	if h.Flags&frame.FlagInit != 0 {
		follower := g.at(h.Iteration).follower
		return slices.DeleteFunc(slices.Clone(ws), func(w node.ID) bool { return follower[w] })
	}
	if len(covered) == 0 {
		return ws
	}
	return slices.DeleteFunc(slices.Clone(ws), func(w node.ID) bool { return slices.Contains(covered, w) })
}
