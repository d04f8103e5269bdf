package lb

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/fptps/fpt/node"
)

// The traffic model by host, beside the one by node above Balance.
//
// Nodes on one host share its link, and what they send each other stays on
// the host. Let c_g be what host g's workers put on the network per
// partition: n_g contributions (its number of workers) without local
// aggregation, one host sum (1 if n_g > 0) with it; C = Σ c_g. For an
// aggregator a with share s_a on host h, per iteration and each way, h's
// link carries the contributions and sums exchanged with the other hosts:
//
//	load_h = Σ_{a ∉ h} c_h·s_a·M + Σ_{a ∈ h} (C − c_h)·s_a·M
//	       = c_h·M + (C − 2·c_h)·M·S_h,    S_h = Σ_{a ∈ h} s_a
//
// so a 4-worker host with local aggregation carries a quarter of what it
// carries without, and the iteration cannot take less than the busiest
// link's load_h / cap_h, minimised over the host shares S_h (HostBound).

// HostInput describes the hosts of a job for the model by host.
type HostInput struct {
	// Workers and Aggregators on each host, by host index: every node
	// names the host it runs on.
	HostOf map[node.ID]int
	// Capacity is each host's link, bytes per second (the slower side).
	Capacity []float64
	// ModelBytes is M, what one worker pushes per iteration.
	ModelBytes float64
	// Local: the workers of a host sum locally, one sum per host.
	Local bool
	// Alone are workers that sum alone though their host's group sums
	// (one that had no shared memory): each puts its own contribution on
	// its host's link beside the host's sum.
	Alone map[node.ID]bool
}

// perHost returns c_g for every host: what its workers put on the network
// per byte of a partition.
func (in HostInput) perHost() ([]float64, error) {
	c := make([]float64, len(in.Capacity))
	alone := make([]float64, len(in.Capacity))
	for id, h := range in.HostOf {
		if h < 0 || h >= len(c) {
			return nil, fmt.Errorf("lb: %s on host %d of %d", id, h, len(c))
		}
		if r, ok := id.Role(); ok && r == node.Worker {
			if in.Local && in.Alone[id] {
				alone[h]++
			} else {
				c[h]++
			}
		}
	}
	if in.Local {
		for h := range c {
			c[h] = math.Min(c[h], 1) + alone[h]
		}
	}
	for h, cp := range in.Capacity {
		if !(cp > 0) || cp > MaxCapacity {
			return nil, fmt.Errorf("%w: host %d measured at %g bytes/s", ErrCapacity, h, cp)
		}
	}
	if !(in.ModelBytes >= 0) || math.IsInf(in.ModelBytes, 0) {
		return nil, fmt.Errorf("%w: model of %g bytes", ErrCapacity, in.ModelBytes)
	}
	return c, nil
}

// HostLoad is the bytes each host's link carries per iteration, each way,
// under decision d's split (its aggregators must all be in HostOf).
func HostLoad(in HostInput, d Decision) ([]float64, error) {
	c, err := in.perHost()
	if err != nil {
		return nil, err
	}
	if err := d.Validate(); err != nil {
		return nil, fmt.Errorf("lb: host load: %w", err)
	}
	total := 0.0
	for _, x := range c {
		total += x
	}
	share := make([]float64, len(c))
	for i, a := range d.Aggregators {
		h, ok := in.HostOf[a]
		if !ok {
			return nil, fmt.Errorf("lb: host load: aggregator %s on no host", a)
		}
		share[h] += d.Shares[i]
	}
	load := make([]float64, len(c))
	for h := range c {
		load[h] = c[h]*in.ModelBytes + (total-2*c[h])*in.ModelBytes*share[h]
	}
	return load, nil
}

// HostBound is the least iteration time the hosts' links allow: the
// busiest link's load over its capacity, minimised over the hosts' shares
// (every host with an aggregator may take any share; hosts without one
// take none).
func HostBound(in HostInput) (time.Duration, error) {
	c, err := in.perHost()
	if err != nil {
		return 0, err
	}
	total := 0.0
	for _, x := range c {
		total += x
	}
	hasAgg := make([]bool, len(c))
	some := false
	for id, h := range in.HostOf {
		if r, ok := id.Role(); ok && (r == node.Server || r == node.Worker) {
			hasAgg[h], some = true, true
		}
	}
	if !some {
		return 0, fmt.Errorf("lb: host bound: no aggregator on any host")
	}
	// Host h's time is b_h + g_h·S_h; find the least level L every host
	// can stay under with Σ S_h = 1 (bisection: feasibility is monotone).
	b := make([]float64, len(c))
	g := make([]float64, len(c))
	hi := 0.0
	for h := range c {
		b[h] = c[h] * in.ModelBytes / in.Capacity[h]
		g[h] = (total - 2*c[h]) * in.ModelBytes / in.Capacity[h]
		hi = math.Max(hi, b[h]+math.Max(g[h], 0))
	}
	feasible := func(L float64) bool {
		lo, up := 0.0, 0.0
		for h := range c {
			if b[h] > L && (g[h] >= 0 || !hasAgg[h]) {
				return false
			}
			if !hasAgg[h] {
				continue
			}
			switch {
			case g[h] > 0:
				up += (L - b[h]) / g[h]
			case g[h] < 0:
				lo += math.Max(0, (b[h]-L)/-g[h])
				up = math.Inf(1)
			default:
				up = math.Inf(1)
			}
		}
		return lo <= 1 && up >= 1
	}
	lo := 0.0
	for range 200 {
		mid := (lo + hi) / 2
		if feasible(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return time.Duration(hi * float64(time.Second)), nil
}

// Hosts places the nodes of an Input on hosts, for Balance to balance by
// host rather than by node: nodes on one host share its link, and with
// Local the workers of a host sum locally, one sum per host. A host's
// link capacity is the sum of its nodes' capacities (each node measures
// what it exchanges with other hosts: lbagent), and the model is the one
// above (HostLoad).
type Hosts struct {
	// Of gives every server's and worker's host index, 0 to H−1; every
	// index names at least one node.
	Of map[node.ID]int
	// Local: the workers of a host sum locally.
	Local bool
	// Alone are workers that sum alone though on a host of a group (see
	// HostInput.Alone).
	Alone map[node.ID]bool
}

// hostInput is in's model by host, per byte of model (M = 1): each
// host's capacity is the sum of its nodes'. A node on no host of Of (a
// node that joined) is taken to be alone on a host of its own.
func (in Input) hostInput() (HostInput, error) {
	hi := HostInput{HostOf: make(map[node.ID]int, len(in.Servers)+len(in.Workers)), ModelBytes: 1, Local: in.Hosts.Local, Alone: in.Hosts.Alone}
	// Hosts are numbered afresh over the nodes of in: a host whose nodes
	// were all lost is no host of the model.
	index := map[int]int{}
	n := 0
	for _, ids := range [][]node.ID{in.Servers, in.Workers} {
		for _, id := range ids {
			h, ok := in.Hosts.Of[id]
			switch i, seen := index[h]; {
			case !ok:
				h = n
				n++
			case seen:
				h = i
			default:
				index[h] = n
				h = n
				n++
			}
			hi.HostOf[id] = h
		}
	}
	hi.Capacity = make([]float64, n)
	for id, h := range hi.HostOf {
		hi.Capacity[h] += in.Capacity[id]
	}
	for h, c := range hi.Capacity {
		if !(c > 0) {
			return HostInput{}, fmt.Errorf("%w: host %d has no node measured", ErrCapacity, h)
		}
		hi.Capacity[h] = min(c, MaxCapacity)
	}
	return hi, nil
}

// hostPerByte is T(s)/M under the model by host: the busiest host link's
// time per byte of model. Nodes absent from aggs have share 0.
func (in Input) hostPerByte(aggs []node.ID, shares []float64) float64 {
	hi, err := in.hostInput()
	if err != nil {
		return math.Inf(1)
	}
	c, err := hi.perHost()
	if err != nil {
		return math.Inf(1)
	}
	share := make([]float64, len(c))
	for i, a := range aggs {
		if h, ok := hi.HostOf[a]; ok && i < len(shares) {
			share[h] += shares[i]
		}
	}
	total := 0.0
	for _, x := range c {
		total += x
	}
	worst := 0.0
	for h := range c {
		worst = max(worst, (c[h]+(total-2*c[h])*share[h])/hi.Capacity[h])
	}
	return worst
}

// hostWaterFill is waterFill under the model by host: the hosts' shares
// that minimise the busiest link's time, each host's share split evenly
// over its servers, or over its workers where it has none. Hosts whose
// time does not rise with their share (a host that sends more than half
// of all contributions) take what is left over, by capacity.
func (in Input) hostWaterFill() ([]node.ID, []float64) {
	hi, err := in.hostInput()
	if err != nil {
		return in.evenOver()
	}
	c, err := hi.perHost()
	if err != nil {
		return in.evenOver()
	}
	total := 0.0
	for _, x := range c {
		total += x
	}
	H := len(c)
	b, g := make([]float64, H), make([]float64, H)
	hi0 := 0.0
	for h := range c {
		b[h] = c[h] / hi.Capacity[h]
		g[h] = (total - 2*c[h]) / hi.Capacity[h]
		hi0 = max(hi0, b[h]+max(g[h], 0))
	}
	// bounds returns, at level L, each host's least and most share
	// (most: +Inf where the share is unbounded) and whether L is feasible.
	bounds := func(L float64) (lo, up []float64, ok bool) {
		lo, up = make([]float64, H), make([]float64, H)
		sumLo, sumUp := 0.0, 0.0
		for h := range c {
			switch {
			case g[h] > 0:
				up[h] = max(0, (L-b[h])/g[h])
				if b[h] > L {
					return nil, nil, false
				}
			case g[h] < 0:
				lo[h] = max(0, (b[h]-L)/-g[h])
				up[h] = math.Inf(1)
			default:
				if b[h] > L {
					return nil, nil, false
				}
				up[h] = math.Inf(1)
			}
			sumLo += lo[h]
			sumUp += up[h]
		}
		return lo, up, sumLo <= 1 && sumUp >= 1
	}
	lo0, L := 0.0, hi0
	for range 200 {
		mid := (lo0 + L) / 2
		if _, _, ok := bounds(mid); ok {
			L = mid
		} else {
			lo0 = mid
		}
	}
	lo, up, ok := bounds(L)
	if !ok {
		return in.evenOver()
	}
	// Each host its least share, then the capped hosts up to their caps in
	// proportion, then the rest to the unbounded ones by capacity.
	S := slices.Clone(lo)
	left := 1.0
	for _, x := range lo {
		left -= x
	}
	capped, capSum, freeCap := 0.0, 0.0, 0.0
	for h := range c {
		if math.IsInf(up[h], 1) {
			freeCap += hi.Capacity[h]
		} else {
			capSum += up[h] - lo[h]
		}
	}
	if capSum > 0 {
		capped = min(left, capSum)
		for h := range c {
			if !math.IsInf(up[h], 1) {
				S[h] += (up[h] - lo[h]) * capped / capSum
			}
		}
	}
	if rest := left - capped; rest > 0 && freeCap > 0 {
		for h := range c {
			if math.IsInf(up[h], 1) {
				S[h] += rest * hi.Capacity[h] / freeCap
			}
		}
	}
	// Within a host: its servers, else its workers.
	var aggs []node.ID
	var shares []float64
	for h := range c {
		if !(S[h] > 0) {
			continue
		}
		var on []node.ID
		for _, id := range in.Servers {
			if hi.HostOf[id] == h {
				on = append(on, id)
			}
		}
		if len(on) == 0 {
			for _, id := range in.Workers {
				if hi.HostOf[id] == h {
					on = append(on, id)
				}
			}
		}
		for _, id := range on {
			aggs = append(aggs, id)
			shares = append(shares, S[h]/float64(len(on)))
		}
	}
	if len(aggs) == 0 {
		return in.evenOver()
	}
	return aggs, normalize(shares)
}

// evenOver is the even split over the servers.
func (in Input) evenOver() ([]node.ID, []float64) {
	d := Even(0, 0, in.Servers)
	return d.Aggregators, d.Shares
}

// PlaceOnHost puts node id on host index h of the model by host (a worker
// that joined, whose host the scheduler knows from its registration): it
// sums in its host's group, or, alone (no shared memory), puts its own
// contribution beside the host's sum. A node the Balancer does not place
// sits alone on a host of its own. It does nothing when the Balancer
// balances by node.
func (b *Balancer) PlaceOnHost(id node.ID, h int, alone bool) {
	if b.cfg.Hosts == nil || h < 0 || h >= MaxAggregators {
		return
	}
	of := maps.Clone(b.cfg.Hosts.Of)
	of[id] = h
	lone := b.cfg.Hosts.Alone
	if alone {
		lone = maps.Clone(lone)
		if lone == nil {
			lone = map[node.ID]bool{}
		}
		lone[id] = true
	}
	b.cfg.Hosts = &Hosts{Of: of, Local: b.cfg.Hosts.Local, Alone: lone}
}
