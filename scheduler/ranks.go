package scheduler

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/fptps/fpt/node"
)

// A node registers with ID 0, or with the id of the rank its launcher
// pinned (DMLC_WORKER_ID, DMLC_SERVER_ID, DMLC_TASK_ID: config.Config.Rank),
// as dmlc-tracker and BytePS number their nodes. The pinned ones get their
// rank; the others take the ranks left, in (host, port) order, as ps-lite
// assigns them.

// rankError is a registration that asks for a rank it cannot have: one of
// another role, out of range, or taken. It is a launch mistake that no
// later registration can mend, so the scheduler fails the start with it.
type rankError struct{ msg string }

func (e *rankError) Error() string { return e.msg }

// checkRank checks the rank info asks for, if any, against the nodes
// registered so far and the cluster's size for its role.
func checkRank(pending []node.Info, info node.Info, want int) error {
	if info.ID == 0 {
		return nil
	}
	role, ok := info.ID.Role()
	if !ok || role != info.Role {
		return &rankError{fmt.Sprintf("%s@%s asks for id %d, which is not a %s's", info.Role, info.DataAddr(), info.ID, info.Role)}
	}
	if r := info.ID.Rank(); r >= want {
		return &rankError{fmt.Sprintf("%s asks for %s rank %d, out of range: the scheduler's cluster has %d %ss (ranks 0 to %d)", info, info.Role, r, want, info.Role, want-1)}
	}
	for _, p := range pending {
		if p.ID == info.ID {
			return &rankError{fmt.Sprintf("%s rank %d asked for twice: by %s and by %s (check DMLC_WORKER_ID, DMLC_SERVER_ID or DMLC_TASK_ID)", info.Role, info.ID.Rank(), p, info)}
		}
	}
	return nil
}

// assignRanks gives every node its id: a node that asked for a rank gets
// it, the others take the free ranks of their role in (host, port) order.
// The nodes passed checkRank, one by one.
func assignRanks(nodes []node.Info) []node.Info {
	nodes = slices.Clone(nodes)
	slices.SortFunc(nodes, func(a, b node.Info) int {
		return cmp.Or(cmp.Compare(a.Role, b.Role), cmp.Compare(a.Host, b.Host), cmp.Compare(a.ControlPort, b.ControlPort))
	})
	taken := map[node.ID]bool{}
	for _, n := range nodes {
		taken[n.ID] = n.ID != 0
	}
	next := map[node.Role]int{}
	for i := range nodes {
		if nodes[i].ID != 0 {
			continue
		}
		for {
			id := node.RankID(nodes[i].Role, next[nodes[i].Role])
			next[nodes[i].Role]++
			if !taken[id] {
				nodes[i].ID = id
				break
			}
		}
	}
	slices.SortFunc(nodes, func(a, b node.Info) int { return cmp.Or(cmp.Compare(a.Role, b.Role), cmp.Compare(a.ID, b.ID)) })
	return nodes
}
