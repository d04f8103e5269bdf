// Package lb holds the load balancer's decisions: which aggregator sums which
// bytes of every tensor, from which iteration on.
//
// FPT balances aggregation over nodes of unequal bandwidth by giving each
// aggregator a share of every large tensor. Every node (the workers that cut
// and send the tensors, the aggregators that sum them) must agree exactly on
// where each partition goes, and must switch to a new decision at the same
// iteration boundary: FPT misrouted packets when workers switched at
// different moments. So a Decision is versioned and names the iteration it
// takes effect at, the Schedule keeps decisions by that iteration, and
// Layout is a deterministic pure function of (decision, key, size), computed
// independently on every node with integer arithmetic only, so that no two
// machines can disagree by a rounding step.
//
// The LB scheduler's state machine, Balancer, builds on these types: it
// starts every node on Even over the servers, probes (every node
// aggregates, shaping off, capacities measured), then issues the shares
// Balance works out from the capacities, re-probing on drift. Nodes send
// it a Sample per iteration and get a Directive back (wire.go has their
// encoding): the horizon up to which workers may push, and now and then a
// new decision, which always takes effect after every iteration already
// granted, so that no node can be past the boundary when it learns of it.
package lb

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/fptps/fpt/node"
)

// Decision maps tensor bytes onto aggregators. It is versioned and takes
// effect at the start of Iteration; every node switches at that boundary.
// Treat a Decision as immutable once made: its slices may be shared.
type Decision struct {
	Version     uint32
	Iteration   uint64    // first iteration it applies to
	Aggregators []node.ID // servers and workers
	Shares      []float64 // same length; non-negative; sum 1
	// Workers, when not nil, are the workers whose pushes every sum adds
	// up from Iteration on, in increasing id order: a worker was lost
	// (FPT_ON_WORKER_LOSS=continue) or joined. Nil leaves them as the
	// decision before had them; a Schedule fills them in on Add and
	// Rewrite.
	Workers []node.ID
}

// ShareTolerance is how far from 1 the shares of a valid decision may sum.
const ShareTolerance = 1e-9

// ErrInvalid is wrapped by every error Validate returns.
var ErrInvalid = errors.New("lb: invalid decision")

// Even returns the default decision: equal shares over the given
// aggregators, in their order. The slice is copied.
func Even(version uint32, iteration uint64, aggregators []node.ID) Decision {
	d := Decision{
		Version:     version,
		Iteration:   iteration,
		Aggregators: append([]node.ID(nil), aggregators...),
		Shares:      make([]float64, len(aggregators)),
	}
	for i := range d.Shares {
		d.Shares[i] = 1 / float64(len(aggregators))
	}
	return d
}

// Validate checks that d can be used: at least one aggregator, as many
// shares as aggregators, every share finite and non-negative, the shares
// summing to 1 (within ShareTolerance), no aggregator named twice, and
// Workers, when not nil, non-empty worker ids in strictly increasing order
// (one order, so that every node's copy and encoding are the same).
func (d Decision) Validate() error {
	if len(d.Aggregators) == 0 {
		return fmt.Errorf("%w: version %d (iteration %d) has no aggregators", ErrInvalid, d.Version, d.Iteration)
	}
	if len(d.Shares) != len(d.Aggregators) {
		return fmt.Errorf("%w: version %d has %d aggregators but %d shares", ErrInvalid, d.Version, len(d.Aggregators), len(d.Shares))
	}
	sum := 0.0
	for i, s := range d.Shares {
		if math.IsNaN(s) || math.IsInf(s, 0) || s < 0 {
			return fmt.Errorf("%w: version %d gives aggregator %d share %g", ErrInvalid, d.Version, d.Aggregators[i], s)
		}
		sum += s
	}
	if math.Abs(sum-1) > ShareTolerance {
		return fmt.Errorf("%w: version %d's shares sum to %.12g, not 1", ErrInvalid, d.Version, sum)
	}
	seen := make(map[node.ID]bool, len(d.Aggregators))
	for _, a := range d.Aggregators {
		if seen[a] {
			return fmt.Errorf("%w: version %d names aggregator %d twice", ErrInvalid, d.Version, a)
		}
		seen[a] = true
	}
	if d.Workers != nil && len(d.Workers) == 0 {
		return fmt.Errorf("%w: version %d names an empty set of workers", ErrInvalid, d.Version)
	}
	for i, w := range d.Workers {
		if r, ok := w.Role(); !ok || r != node.Worker {
			return fmt.Errorf("%w: version %d counts %s as a worker", ErrInvalid, d.Version, w)
		}
		if i > 0 && w <= d.Workers[i-1] {
			return fmt.Errorf("%w: version %d's workers %v are not in strictly increasing order", ErrInvalid, d.Version, d.Workers)
		}
	}
	return nil
}

// SplitWithin reports whether d and o give the same aggregators shares
// that differ by tol at most (ShareTolerance: the same split).
func (d Decision) SplitWithin(o Decision, tol float64) bool {
	if !slices.Equal(d.Aggregators, o.Aggregators) || len(d.Shares) != len(o.Shares) {
		return false
	}
	for i, s := range d.Shares {
		if math.Abs(s-o.Shares[i]) > tol {
			return false
		}
	}
	return true
}

func (d Decision) String() string {
	if d.Workers != nil {
		return fmt.Sprintf("decision v%d from iteration %d: aggregators %v shares %v workers %v", d.Version, d.Iteration, d.Aggregators, d.Shares, d.Workers)
	}
	return fmt.Sprintf("decision v%d from iteration %d: aggregators %v shares %v", d.Version, d.Iteration, d.Aggregators, d.Shares)
}
