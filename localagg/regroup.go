package localagg

import (
	"slices"

	"github.com/fptps/fpt/node"
)

// GroupsOver forms the local groups of the workers ws, each on the host
// hostOf names: the groups that sum the iterations whose sums add up ws
// (the workers of the job's start, or those a retry or a join left). A
// worker that joined the running job is in its host's group like any
// other: every node knows the host it named (the node table, the
// scheduler's NodeJoined). Every node forms the same groups from the
// same ws: the workers from an LB decision's Workers, the aggregators
// from the same decision.
func GroupsOver(ws []node.ID, hostOf func(node.ID) string) ([]Group, error) {
	ms := make([]Member, 0, len(ws))
	for _, w := range ws {
		ms = append(ms, Member{ID: w, Host: hostOf(w)})
	}
	return Groups(ms)
}

// GroupOf is self's group among groups; empty Workers where self is in
// none (a worker no longer among an iteration's workers).
func GroupOf(groups []Group, self node.ID) Group {
	for _, g := range groups {
		if slices.Contains(g.Workers, self) {
			return g
		}
	}
	return Group{}
}

// Change is what a worker's side of its host's group does at an LB
// decision taking effect at an iteration: Dissolve ends the group it
// sums in from that iteration on (it keeps summing the earlier ones);
// Form makes a new segment for the group New, which sums from that
// iteration on.
type Change struct {
	Dissolve bool
	Form     bool
	New      Group
}

// Regroup decides what the decision that makes next self's group from
// its iteration on changes for a worker whose group is old (empty
// Workers, or one worker: it sums alone). A retry re-cuts iterations the
// old group may have begun to sum (its segment holds contributions cut
// under older decisions, and a lost leader held some), so it always ends
// the old group and forms the new one, even of the same workers, in a
// segment of its own; any other decision changes the group only where
// its workers change (a worker that joined or left its host).
func Regroup(old, next Group, retry bool) Change {
	changed := retry || !slices.Equal(old.Workers, next.Workers)
	if !changed {
		return Change{}
	}
	return Change{Dissolve: len(old.Workers) > 1, Form: len(next.Workers) > 1, New: next}
}
