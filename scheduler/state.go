package scheduler

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/fptps/fpt/node"
)

// registry collects registrations until the cluster is complete, then
// assigns ids the ps-lite way: ranks in (host, port) order per role, so
// that a relaunch on the same machines gives the same ids, except for the
// ranks nodes asked for (ranks.go).
type registry struct {
	servers, workers int
	pending          []node.Info
	origins          []string // pending[i] registered over connection origins[i]
	// customers[i] are pending[i]'s further worker customers (ps-lite's
	// Start(customer_id) of several threads of one process): each counts
	// as one of the workers; keyed by the registration's Seq.
	customers []map[uint64]bool
}

// addCustomer registers a further worker customer (seq, non-zero) of the
// worker process that registered at info's address over origin.
func (r *registry) addCustomer(info node.Info, origin string, seq uint64) error {
	for i, p := range r.pending {
		if p.Host != info.Host || p.ControlPort != info.ControlPort {
			continue
		}
		switch {
		case r.origins[i] != origin:
			return fmt.Errorf("customer %d of %s: from another connection than the node's", seq-1, info)
		case p.Role != node.Worker:
			return fmt.Errorf("customer %d of %s: only a worker process registers several customers", seq-1, p)
		case r.customers[i][seq]:
			return fmt.Errorf("customer %d of %s registered twice", seq-1, p)
		case r.count(node.Worker) >= r.workers:
			return fmt.Errorf("customer %d of %s is one worker too many: the cluster has %d (DMLC_NUM_WORKER counts every worker customer)", seq-1, p, r.workers)
		}
		if r.customers[i] == nil {
			r.customers[i] = make(map[uint64]bool)
		}
		r.customers[i][seq] = true
		return nil
	}
	return fmt.Errorf("customer %d of %s: the node has not registered", seq-1, info)
}

// weightOf is how many of the workers the node at info's address counts
// for: 1 and its further customers.
func (r *registry) weightOf(info node.Info) int {
	for i, p := range r.pending {
		if p.Host == info.Host && p.ControlPort == info.ControlPort {
			return 1 + len(r.customers[i])
		}
	}
	return 1
}

// add registers info, which arrived over the connection origin. It holds
// at most servers+workers entries, one per connection and per address.
func (r *registry) add(info node.Info, origin string) error {
	switch info.Role {
	case node.Server, node.Worker:
	default:
		return fmt.Errorf("role %s cannot register", info.Role)
	}
	if info.Host == "" || info.ControlPort <= 0 || info.ControlPort > 65535 || info.DataPort <= 0 || info.DataPort > 65535 {
		return fmt.Errorf("bad address %s (data port %d)", info, info.DataPort)
	}
	for i, p := range r.pending {
		if p.Host == info.Host && p.ControlPort == info.ControlPort {
			return fmt.Errorf("%s registered twice", info)
		}
		if r.origins[i] == origin {
			return fmt.Errorf("%s: its connection already registered %s", info, p)
		}
	}
	if r.count(info.Role) >= r.want(info.Role) {
		return fmt.Errorf("one %s too many: the cluster has %d", info.Role, r.want(info.Role))
	}
	if err := checkRank(r.pending, info, r.want(info.Role)); err != nil {
		return err
	}
	r.pending = append(r.pending, info)
	r.origins = append(r.origins, origin)
	r.customers = append(r.customers, nil)
	return nil
}

// registered reports whether a node registered at info's address.
func (r *registry) registered(info node.Info) bool {
	for _, p := range r.pending {
		if p.Host == info.Host && p.ControlPort == info.ControlPort {
			return true
		}
	}
	return false
}

// originOf is the connection the node at info's address registered over.
func (r *registry) originOf(info node.Info) string {
	for i, p := range r.pending {
		if p.Host == info.Host && p.ControlPort == info.ControlPort {
			return r.origins[i]
		}
	}
	return ""
}

// count is the nodes of role registered, a worker process counting once
// per customer.
func (r *registry) count(role node.Role) int {
	n := 0
	for i, p := range r.pending {
		if p.Role == role {
			n += 1 + len(r.customers[i])
		}
	}
	return n
}

func (r *registry) want(role node.Role) int {
	if role == node.Server {
		return r.servers
	}
	return r.workers
}

func (r *registry) complete() bool {
	return r.count(node.Server) == r.servers && r.count(node.Worker) == r.workers
}

// assign gives every registered node its id (assignRanks); the scheduler
// itself is added as id 1 at the given address.
func (r *registry) assign(self node.Info) []node.Info {
	self.ID, self.Role = node.SchedulerID, node.Scheduler
	return append([]node.Info{self}, assignRanks(r.pending)...)
}

// barriers counts arrivals per (group, sequence number). The scheduler
// belongs to every group that includes it without having to arrive.
//
// A member numbers its barriers of a group 0, 1, 2...; only its next number
// is accepted, so it has at most one pending arrival per group and the
// table stays bounded by the cluster's size whatever a peer sends.
type barriers struct {
	members map[node.Group][]node.ID
	arrived map[barrierKey]map[node.ID]bool
	next    map[memberGroup]uint64
	// left holds the members removed: a message of theirs still in
	// flight must not count for one still missing.
	left map[node.ID]bool
}

type memberGroup struct {
	id node.ID
	g  node.Group
}

type barrierKey struct {
	group node.Group
	seq   uint64
}

func newBarriers(table []node.Info) *barriers {
	b := &barriers{members: map[node.Group][]node.ID{}, arrived: map[barrierKey]map[node.ID]bool{}, next: map[memberGroup]uint64{}, left: map[node.ID]bool{}}
	for g := node.Group(1); g <= node.AllGroup; g++ {
		for _, info := range table {
			if info.ID != node.SchedulerID && info.ID.InGroup(g) {
				b.members[g] = append(b.members[g], info.ID)
			}
		}
	}
	return b
}

// release is a barrier to release: its group, number and members.
type release struct {
	g       node.Group
	seq     uint64
	members []node.ID
}

// add makes id a member of every group it belongs to, from the barriers
// nextSeqs names on: the numbers a joining server was given.
func (b *barriers) add(id node.ID) {
	seqs := b.nextSeqs()
	delete(b.left, id)
	for g := node.Group(1); g <= node.AllGroup; g++ {
		if id.InGroup(g) && !slices.Contains(b.members[g], id) {
			b.members[g] = append(slices.Clone(b.members[g]), id)
			b.next[memberGroup{id, g}] = seqs[g-1]
		}
	}
}

// nextSeqs is, for each group 1..7, the number of the next barrier its
// members have not all passed: where a member joining now starts.
func (b *barriers) nextSeqs() [node.AllGroup]uint64 {
	var out [node.AllGroup]uint64
	for g := node.Group(1); g <= node.AllGroup; g++ {
		first := true
		for _, id := range b.members[g] {
			if n := b.next[memberGroup{id, g}]; first || n < out[g-1] {
				out[g-1], first = n, false
			}
		}
	}
	return out
}

// remove takes id out of every group (it left the job) and returns the
// barriers it was the last one missing from.
func (b *barriers) remove(id node.ID) []release {
	var out []release
	b.left[id] = true
	for g, ms := range b.members {
		b.members[g] = slices.DeleteFunc(slices.Clone(ms), func(m node.ID) bool { return m == id })
		delete(b.next, memberGroup{id, g})
	}
	for k, set := range b.arrived {
		delete(set, id)
		if ms := b.members[k.group]; len(ms) > 0 && len(set) >= len(ms) {
			delete(b.arrived, k)
			out = append(out, release{k.group, k.seq, ms})
		}
	}
	slices.SortFunc(out, func(a, b release) int { return cmp.Or(cmp.Compare(a.g, b.g), cmp.Compare(a.seq, b.seq)) })
	return out
}

// missing returns the members of group g that have not reached its
// barrier seq.
func (b *barriers) missing(g node.Group, seq uint64) []node.ID {
	set := b.arrived[barrierKey{g, seq}]
	return slices.DeleteFunc(slices.Clone(b.members[g]), func(id node.ID) bool { return set[id] })
}

// arrive records that id reached barrier seq of group g. When it was the
// last member, it returns the members to release.
func (b *barriers) arrive(id node.ID, g node.Group, seq uint64) (release []node.ID, err error) {
	if g == 0 || g > node.AllGroup {
		return nil, fmt.Errorf("barrier: unknown group %d", g)
	}
	if !id.InGroup(g) || id == node.SchedulerID || b.left[id] {
		return nil, fmt.Errorf("barrier: %s is not a member of group %d", id, g)
	}
	if want := b.next[memberGroup{id, g}]; seq != want {
		return nil, fmt.Errorf("barrier: %s arrived at barrier %d of group %d; its next is %d", id, seq, g, want)
	}
	b.next[memberGroup{id, g}] = seq + 1
	k := barrierKey{g, seq}
	set := b.arrived[k]
	if set == nil {
		set = map[node.ID]bool{}
		b.arrived[k] = set
	}
	if set[id] {
		return nil, fmt.Errorf("barrier: %s arrived twice at barrier %d of group %d", id, seq, g)
	}
	set[id] = true
	if len(set) < len(b.members[g]) {
		return nil, nil
	}
	delete(b.arrived, k)
	return b.members[g], nil
}
