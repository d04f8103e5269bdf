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
// whom a leader's host sum stands for, and who is sent the sums.
type hostGroups struct {
	// members lists each leader's other members (groups of one: none).
	members map[node.ID][]node.ID
	// follower: a member that is no leader, sent no sums.
	follower map[node.ID]bool
	// until is the first iteration the groups no longer sum: a retry's
	// (a lost worker's under FPT_ON_WORKER_LOSS=continue or wait, a lost
	// or leaving server's under FPT_ON_SERVER_LOSS=retry), from which
	// every worker pushes over the network and is sent its sums.
	until uint64
	err   error
}

func newHostGroups(n *cluster.Member) *hostGroups {
	// A node that joined after a retry is told its iteration: it never
	// heard the retry's decision.
	g := &hostGroups{members: map[node.ID][]node.ID{}, follower: map[node.ID]bool{}, until: n.GroupsUntil()}
	groups, err := n.LocalGroups()
	if err != nil {
		g.err = err
		return g
	}
	// The groups are those of the workers the job started with: a worker
	// that joined a running job (a rank past DMLC_NUM_WORKER: joiners take
	// the next rank no worker had) sums alone, and a node that joined
	// forms them from the hosts its table names.
	started := n.Config().NumWorkers
	for i := range groups {
		groups[i].Workers = slices.DeleteFunc(groups[i].Workers, func(w node.ID) bool { return w.Rank() >= started })
	}
	groups = slices.DeleteFunc(groups, func(gr localagg.Group) bool { return len(gr.Workers) == 0 })
	for _, gr := range groups {
		g.members[gr.Leader()] = gr.Workers[1:]
		for _, w := range gr.Workers[1:] {
			g.follower[w] = true
		}
	}
	return g
}

// dissolve ends the groups' sums from iteration from on (a retry's).
func (g *hostGroups) dissolve(from uint64) {
	if g != nil {
		g.until = min(g.until, from)
	}
}

// also returns the indexes in ws of the workers whose values leader's host
// sum of iteration iter holds besides its own. A host sum from a node
// that leads no group of more than one, or of an iteration the groups no
// longer sum, is refused: it would count for workers it does not hold.
func (g *hostGroups) also(leader node.ID, iter uint64, ws []node.ID) ([]int, error) {
	switch {
	case g == nil:
		return nil, fmt.Errorf("host sum from %s, yet workers do not sum locally here (FPT_LOCAL_AGGREGATION)", leader)
	case g.err != nil:
		return nil, fmt.Errorf("host sum from %s: %w", leader, g.err)
	case iter >= g.until:
		return nil, fmt.Errorf("host sum from %s of iteration %d, yet the groups sum no iteration from %d on (a node was lost)", leader, iter, g.until)
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

// recipients are the workers of ws sent a sum of the partition h: every
// worker but the members whose leader's host sum held their values
// (covered), which their leader hands the sum to. An init round's (only
// worker 0 pushes, no host sum) goes to the leaders and the workers alone
// on their hosts while the groups sum, since the leaders hand it on too.
func (g *hostGroups) recipients(h *frame.Header, ws, covered []node.ID) []node.ID {
	if g == nil || g.err != nil {
		return ws
	}
	if h.Flags&frame.FlagInit != 0 {
		if h.Iteration >= g.until {
			return ws
		}
		return slices.DeleteFunc(slices.Clone(ws), func(w node.ID) bool { return g.follower[w] })
	}
	if len(covered) == 0 {
		return ws
	}
	return slices.DeleteFunc(slices.Clone(ws), func(w node.ID) bool { return slices.Contains(covered, w) })
}
