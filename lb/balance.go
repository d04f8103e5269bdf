package lb

import (
	"github.com/fptps/fpt/node"

	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// The traffic model behind Balance, Predict and Bound.
//
// Let M be the bytes one worker pushes per iteration (its whole model), W
// the number of workers, and s_a the share of every tensor aggregator a
// sums. Per iteration, in each direction:
//
//   - a server with share s receives W·s·M (one contribution per worker)
//     and sends W·s·M (the sum to every worker);
//   - a worker with share s sends its contributions to the other
//     aggregators, (1−s)·M, plus the sums it made to the W−1 other workers,
//     (W−1)·s·M: M·(1+(W−2)·s) in all; it receives the same amount (the
//     W−1 others' contributions to its share and the sums of the rest). Its
//     own contribution to its share never crosses the network.
//
// Both directions of a node carry the same bytes, so what limits node n is
// the slower of its two sides, its capacity c_n (bytes per second), and
// its time on the network is load_n / c_n. With every transfer overlapped
// (pushes, sums and broadcasts pipelined over many partitions), an
// iteration cannot take less than the busiest node's time:
//
//	T(s) = max over nodes n of load_n(s) / c_n
//
// That is the prediction (Predict), and its minimum over all splits is the
// lower bound (Bound). Each node's time is affine in its own share only,
// u_a(s) = b_a + g_a·s_a, with b = 0, g = W·M/c for a server and
// b = M/c, g = (W−2)·M/c for a worker, so the split that minimises it is
// water-filling: raise a level L until the aggregators below it, each
// filled up to L, hold the whole tensor (Σ (L − b_a)/g_a = 1). Workers
// with g ≤ 0 (W ≤ 2: aggregating costs a worker nothing extra, or even
// saves traffic) take everything, split by capacity.

// DefaultTolerance is how much faster than the even split over the servers
// a balanced split must be predicted to be before Balance prefers it: the
// measurements are noisy, and among near-equal splits the one ps-lite uses
// (no worker aggregates, every server an equal share) is the safe choice.
const DefaultTolerance = 0.05

// MaxCapacity bounds a believable capacity: 1 TB/s. Larger samples are
// measurement artefacts (a counter reset, a zero-length window).
const MaxCapacity = 1e12

// ErrCapacity is wrapped by the errors Balance returns for missing, zero or
// absurd capacities.
var ErrCapacity = errors.New("lb: unusable capacity")

// Input is what Balance decides from.
type Input struct {
	Servers, Workers []node.ID
	// Capacity is each node's capacity in bytes per second: the slower of
	// its send and receive sides. Every server and worker must have one.
	Capacity map[node.ID]float64
	// ModelBytes is M, the bytes one worker pushes per iteration. It only
	// scales the predicted times; the shares do not depend on it.
	ModelBytes float64
	// Tolerance is the fraction by which the balanced split must beat the
	// even split over the servers (DefaultTolerance if zero).
	Tolerance float64
	// Hosts, if set, balances by host (see Hosts): the nodes of a host
	// share its link.
	Hosts *Hosts
}

// Plan is Balance's answer: the shares, and the predicted iteration times
// of the chosen split and of the even split over the servers.
type Plan struct {
	Aggregators []node.ID
	Shares      []float64
	Predicted   time.Duration
	Even        time.Duration
	// Balanced is false when the even split over the servers was kept.
	Balanced bool
}

// Balance works out the split that minimises the predicted iteration time
// (see the model above) from measured capacities. When no split is
// predicted to beat the even split over the servers by more than the
// tolerance, it returns that even split; so equal nodes always get it.
// It returns an error wrapping ErrCapacity, and no plan, when a node's
// capacity is missing, zero, negative, NaN or above MaxCapacity: the
// caller keeps its last good decision.
func Balance(in Input) (Plan, error) {
	if err := in.check(); err != nil {
		return Plan{}, err
	}
	tol := in.Tolerance
	if tol == 0 {
		tol = DefaultTolerance
	}
	even := Even(0, 0, in.Servers)
	aggs, shares := in.waterFill()
	// Compare per byte of model, not in Durations: the choice must not
	// depend on M (0 when unknown would make every split "0 s") nor on
	// rounding to the nanosecond.
	evenT := in.perByte(even.Aggregators, even.Shares)
	bestT := in.perByte(aggs, shares)
	if evenT <= bestT*(1+tol) {
		d := in.duration(evenT)
		return Plan{Aggregators: even.Aggregators, Shares: even.Shares, Predicted: d, Even: d}, nil
	}
	return Plan{Aggregators: aggs, Shares: shares, Predicted: in.duration(bestT), Even: in.duration(evenT), Balanced: true}, nil
}

// Predict returns the iteration time the model predicts for decision d
// under the capacities of in. d must be valid (see Decision.Validate).
func Predict(in Input, d Decision) (time.Duration, error) {
	if err := in.check(); err != nil {
		return 0, err
	}
	if err := d.Validate(); err != nil {
		return 0, fmt.Errorf("lb: predict: %w", err)
	}
	return in.duration(in.perByte(d.Aggregators, d.Shares)), nil
}

// Bound is the lower bound on the iteration time implied by the nodes'
// capacities: the predicted time of the best split (water-filling, never
// the even split unless it is the best). bytes per second; every server
// and worker must have a positive capacity.
func Bound(in Input) (time.Duration, error) {
	if err := in.check(); err != nil {
		return 0, err
	}
	aggs, shares := in.waterFill()
	return in.duration(in.perByte(aggs, shares)), nil
}

func (in Input) check() error {
	if len(in.Servers) == 0 || len(in.Workers) == 0 {
		return fmt.Errorf("%w: %d servers and %d workers", ErrCapacity, len(in.Servers), len(in.Workers))
	}
	if !(in.ModelBytes >= 0) || math.IsInf(in.ModelBytes, 0) {
		return fmt.Errorf("%w: model of %g bytes", ErrCapacity, in.ModelBytes)
	}
	if !(in.Tolerance >= 0) || math.IsInf(in.Tolerance, 0) { // NaN would mean "always balance"
		return fmt.Errorf("lb: tolerance %g is not a non-negative fraction", in.Tolerance)
	}
	for _, ids := range [][]node.ID{in.Servers, in.Workers} {
		for _, id := range ids {
			c, ok := in.Capacity[id]
			switch {
			case !ok && in.Hosts != nil:
				// By host, a node that exchanged nothing with other hosts
				// (a group's member, whose bytes stay on its host) adds
				// nothing to its host's link; a host with no node
				// measured is an error (hostInput).
			case !ok:
				return fmt.Errorf("%w: no measurement of node %d", ErrCapacity, id)
			case !(c > 0) || c > MaxCapacity: // NaN too
				return fmt.Errorf("%w: node %d measured at %g bytes/s", ErrCapacity, id, c)
			}
		}
	}
	if in.Hosts != nil {
		if _, err := in.hostInput(); err != nil {
			return err
		}
	}
	return nil
}

// cost returns node id's time per byte of model (seconds per byte of M)
// as an affine function of its share: b + g·share. Working per byte keeps
// the shares independent of M, even when M is 0 (unknown).
func (in Input) cost(id node.ID, server bool) (b, g float64) {
	c, w := in.Capacity[id], float64(len(in.Workers))
	if server {
		return 0, w / c
	}
	return 1 / c, (w - 2) / c
}

// perByte is T(s)/M: the busiest node's time per byte of model. Nodes
// absent from aggs have share 0.
func (in Input) perByte(aggs []node.ID, shares []float64) float64 {
	if in.Hosts != nil {
		return in.hostPerByte(aggs, shares)
	}
	share := func(id node.ID) float64 {
		if i := slices.Index(aggs, id); i >= 0 && i < len(shares) {
			return shares[i]
		}
		return 0
	}
	worst := 0.0
	for _, id := range in.Servers {
		b, g := in.cost(id, true)
		worst = max(worst, b+g*share(id))
	}
	for _, id := range in.Workers {
		b, g := in.cost(id, false)
		worst = max(worst, b+g*share(id))
	}
	return worst
}

// duration converts a time per byte of model to the iteration time,
// saturating: a dead-slow node can predict more than a Duration holds, and
// a wrapped (negative) prediction would look best.
func (in Input) duration(perByte float64) time.Duration {
	ns := perByte * in.ModelBytes * float64(time.Second)
	if !(ns < math.MaxInt64) { // also NaN, which check rules out
		return math.MaxInt64
	}
	return time.Duration(ns)
}

// waterFill returns the split minimising T(s), lexicographically: among
// splits with the same busiest node, the one that also keeps the others
// least busy. Aggregators are servers then workers, in input order; those
// with share 0 are left out.
func (in Input) waterFill() ([]node.ID, []float64) {
	if in.Hosts != nil {
		return in.hostWaterFill()
	}
	type agg struct {
		id   node.ID
		b, g float64
	}
	var free, paid []agg // g <= 0: aggregating costs nothing; g > 0
	for _, id := range in.Servers {
		b, g := in.cost(id, true)
		paid = append(paid, agg{id, b, g})
	}
	for _, id := range in.Workers {
		b, g := in.cost(id, false)
		if g <= 0 {
			free = append(free, agg{id, b, g})
		} else {
			paid = append(paid, agg{id, b, g})
		}
	}
	var aggs []node.ID
	var shares []float64
	if len(free) > 0 {
		// Only workers when W <= 2. With W == 1 the single worker sums
		// everything locally; with W == 2 their times do not depend on the
		// split, which goes by capacity.
		total := 0.0
		for _, a := range free {
			total += in.Capacity[a.id]
		}
		for _, a := range free {
			aggs = append(aggs, a.id)
			shares = append(shares, in.Capacity[a.id]/total)
		}
		return aggs, normalize(shares)
	}
	// Raise the level L through the aggregators in order of their base
	// time; with k of them below L, Σ (L − b)/g = 1 is linear in L.
	order := slices.Clone(paid)
	slices.SortStableFunc(order, func(x, y agg) int {
		switch {
		case x.b < y.b:
			return -1
		case x.b > y.b:
			return 1
		}
		return 0
	})
	var sumInvG, sumBOverG, level float64
	for k, a := range order {
		sumInvG += 1 / a.g
		sumBOverG += a.b / a.g
		level = (1 + sumBOverG) / sumInvG
		if k+1 == len(order) || level <= order[k+1].b {
			break
		}
	}
	for _, a := range paid {
		if s := (level - a.b) / a.g; s > 0 {
			aggs = append(aggs, a.id)
			shares = append(shares, s)
		}
	}
	return aggs, normalize(shares)
}

// normalize rescales shares to sum exactly to 1 within rounding.
func normalize(shares []float64) []float64 {
	sum := 0.0
	for _, s := range shares {
		sum += s
	}
	for i := range shares {
		shares[i] /= sum
	}
	return shares
}

// Weights returns the pool weights that follow decision d on node self:
// the bytes per iteration (in units of M) that self sends to each peer,
// which are also the bytes it receives from that peer, scaled so that the
// largest is 1. A worker sends each aggregator its share, and, when it
// aggregates itself, its sums to every other worker; a server sends its
// sums to every worker. Peers that d gives no traffic get MinWeight, not
// 0: a weight of 0 would pause their flow, and the classic Push/Pull calls
// still use it.
func Weights(d Decision, self node.ID, servers, workers []node.ID) map[node.ID]float64 {
	share := func(id node.ID) float64 {
		if i := slices.Index(d.Aggregators, id); i >= 0 && i < len(d.Shares) {
			return d.Shares[i]
		}
		return 0
	}
	mine := share(self)
	isWorker := slices.Contains(workers, self)
	w := make(map[node.ID]float64, len(servers)+len(workers))
	for _, id := range servers {
		if id == self {
			continue
		}
		if isWorker {
			w[id] = share(id)
		} else {
			w[id] = 0 // servers do not talk to each other
		}
	}
	for _, id := range workers {
		if id == self {
			continue
		}
		if isWorker {
			w[id] = share(id) + mine
		} else {
			w[id] = mine
		}
	}
	top := 0.0
	for _, v := range w {
		top = max(top, v)
	}
	for id, v := range w {
		if top > 0 {
			v /= top
		}
		w[id] = max(v, MinWeight)
	}
	return w
}

// MinWeight is the smallest pool weight Weights gives a peer.
const MinWeight = 1.0 / 64
