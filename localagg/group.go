// Package localagg sums the contributions of the workers that share a host
// before they cross the network: a local group per host, a shared-memory
// segment per group (shm.go), and the bookkeeping of the host's sums
// (core.go), which is pure: no locks, sockets, goroutines or clock.
//
// See docs/local-aggregation.md for the design and what is on the data
// path so far.
package localagg

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/fptps/fpt/node"
)

// Member is a worker and the host it runs on (config.Config.Host: its
// FPT_HOST_ID, else its address).
type Member struct {
	ID   node.ID
	Host string
}

// Group is the workers of one host, in id order; the first leads it
// (sends the host's sums and receives the results).
type Group struct {
	Host    string
	Workers []node.ID
}

// NoSharedMemory ends the host a worker names when its shared memory
// cannot hold a segment (Check): Groups makes it a group of its own, so
// it sums alone, over the network, and the others of its host without it.
const NoSharedMemory = " (no shared memory)"

// HostName is the host a worker's named host stands for, without
// NoSharedMemory: where its link is.
func HostName(named string) string { return strings.TrimSuffix(named, NoSharedMemory) }

// Leader is the worker that sends the group's sums.
func (g Group) Leader() node.ID { return g.Workers[0] }

// Groups forms the local groups of the workers in members: one per host,
// ordered by their leaders. Other roles are ignored (a server on a host
// aggregates for the network, not for its host's group), and a worker
// whose host ends in NoSharedMemory is alone. A worker named twice, or
// with no host, is an error: the groups would not add up.
func Groups(members []Member) ([]Group, error) {
	byHost := map[string]*Group{}
	seen := map[node.ID]bool{}
	var out []*Group
	for _, m := range members {
		if r, ok := m.ID.Role(); !ok || r != node.Worker {
			continue
		}
		if seen[m.ID] {
			return nil, fmt.Errorf("localagg: %s named twice", m.ID)
		}
		seen[m.ID] = true
		if m.Host == "" {
			return nil, fmt.Errorf("localagg: %s has no host", m.ID)
		}
		g := byHost[m.Host]
		if strings.HasSuffix(m.Host, NoSharedMemory) {
			g = nil // alone
		}
		if g == nil {
			g = &Group{Host: m.Host}
			byHost[m.Host] = g
			out = append(out, g)
		}
		g.Workers = append(g.Workers, m.ID)
	}
	groups := make([]Group, len(out))
	for i, g := range out {
		slices.Sort(g.Workers)
		groups[i] = *g
	}
	slices.SortFunc(groups, func(a, b Group) int { return cmp.Compare(a.Leader(), b.Leader()) })
	return groups, nil
}

// Sizes lists how many workers each group has, in the groups' order
// ("4,3,1" hosts).
func Sizes(groups []Group) []int {
	s := make([]int, len(groups))
	for i, g := range groups {
		s[i] = len(g.Workers)
	}
	return s
}

// HostOf maps every worker of groups to its group's index.
func HostOf(groups []Group) map[node.ID]int {
	m := map[node.ID]int{}
	for i, g := range groups {
		for _, w := range g.Workers {
			m[w] = i
		}
	}
	return m
}
