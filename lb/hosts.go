package lb

import (
	"fmt"
	"math"
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
}

// perHost returns c_g for every host: what its workers put on the network
// per byte of a partition.
func (in HostInput) perHost() ([]float64, error) {
	c := make([]float64, len(in.Capacity))
	for id, h := range in.HostOf {
		if h < 0 || h >= len(c) {
			return nil, fmt.Errorf("lb: %s on host %d of %d", id, h, len(c))
		}
		if r, ok := id.Role(); ok && r == node.Worker {
			c[h]++
		}
	}
	if in.Local {
		for h := range c {
			c[h] = math.Min(c[h], 1)
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
