package aggregator

import (
	"fmt"
	"slices"

	"github.com/fptps/fpt/cluster"
	"github.com/fptps/fpt/node"
)

// hostGroups is what an aggregator knows of the workers' local groups:
// whom a leader's host sum stands for, and who is sent the sums.
type hostGroups struct {
	// members lists each leader's other members (groups of one: none).
	members map[node.ID][]node.ID
	// follower: a member that is no leader, sent no sums.
	follower map[node.ID]bool
	err      error
}

func newHostGroups(n *cluster.Member) *hostGroups {
	g := &hostGroups{members: map[node.ID][]node.ID{}, follower: map[node.ID]bool{}}
	groups, err := n.LocalGroups()
	if err != nil {
		g.err = err
		return g
	}
	for _, gr := range groups {
		g.members[gr.Leader()] = gr.Workers[1:]
		for _, w := range gr.Workers[1:] {
			g.follower[w] = true
		}
	}
	return g
}

// also returns the indexes in ws of the workers whose values leader's host
// sum holds besides its own. A host sum from a node that leads no group
// of more than one is refused: it would count for workers it does not hold.
func (g *hostGroups) also(leader node.ID, ws []node.ID) ([]int, error) {
	switch {
	case g == nil:
		return nil, fmt.Errorf("host sum from %s, yet workers do not sum locally here (FPT_LOCAL_AGGREGATION)", leader)
	case g.err != nil:
		return nil, fmt.Errorf("host sum from %s: %w", leader, g.err)
	case len(g.members[leader]) == 0:
		return nil, fmt.Errorf("host sum from %s, which leads no local group of several workers", leader)
	}
	also := make([]int, 0, len(g.members[leader]))
	for _, w := range g.members[leader] {
		i := slices.Index(ws, w)
		if i < 0 {
			return nil, fmt.Errorf("host sum from %s holds %s, no worker of the iteration (%v)", leader, w, ws)
		}
		also = append(also, i)
	}
	return also, nil
}

// recipients are the workers of ws sent a sum: the leaders and the workers
// alone on their hosts; every worker without local groups.
func (g *hostGroups) recipients(ws []node.ID) []node.ID {
	if g == nil || g.err != nil {
		return ws
	}
	return slices.DeleteFunc(slices.Clone(ws), func(w node.ID) bool { return g.follower[w] })
}
