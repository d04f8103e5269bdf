package lb

import (
	"github.com/fptps/fpt/node"

	"fmt"
	"slices"
	"sort"
)

// Schedule holds decisions by the iteration they take effect at, so that a
// node can look up the decision for any iteration still in flight (a slow
// worker's contributions to iteration i may arrive after the decision for
// i+1 is known). Versions strictly increase and iterations never go
// backwards along the schedule. A Schedule is not safe for concurrent use.
type Schedule struct {
	ds []Decision // Version increasing, Iteration non-decreasing; never empty
	// past are the workers of the iterations before ds[0] that Forget
	// dropped the decisions of, one entry per change of workers (joins
	// and losses are rare, LB decisions are not), so that WorkersAt still
	// answers for any iteration.
	past []workersFrom
}

// workersFrom is a set of workers, in force from iteration from on.
type workersFrom struct {
	from    uint64
	workers []node.ID
}

// NewSchedule returns a schedule starting with initial, which must be
// valid. The initial decision is in force from its Iteration on, and for
// any earlier iteration too. Its Workers may be nil (a node that does not
// track the workers); the decisions after it then keep nil Workers until
// one names them.
func NewSchedule(initial Decision) (*Schedule, error) {
	if err := initial.Validate(); err != nil {
		return nil, fmt.Errorf("lb: new schedule: %w", err)
	}
	return &Schedule{ds: []Decision{clone(initial)}}, nil
}

// Add appends d. It must be valid, its Version must be greater than the
// latest's and its Iteration not earlier than the latest's; otherwise Add
// returns an error and the schedule is unchanged. A decision taking effect
// at the same iteration as the latest supersedes it there. A nil Workers
// is filled in from the latest decision's, so that every decision held
// names its workers once one has.
func (s *Schedule) Add(d Decision) error {
	if err := d.Validate(); err != nil {
		return fmt.Errorf("lb: schedule: %w", err)
	}
	last := s.ds[len(s.ds)-1]
	if d.Version <= last.Version {
		return fmt.Errorf("lb: schedule: decision version %d is not after the latest, %d", d.Version, last.Version)
	}
	if d.Iteration < last.Iteration {
		return fmt.Errorf("lb: schedule: decision version %d takes effect at iteration %d, before the latest (version %d at iteration %d)",
			d.Version, d.Iteration, last.Version, last.Iteration)
	}
	s.ds = append(s.ds, inherit(clone(d), last))
	return nil
}

// Rewrite makes d the decision from d.Iteration on, dropping every
// decision that takes effect at or after it: a retry re-cuts iterations
// that earlier decisions had already been granted for. d must be valid and
// its Version greater than every decision's held; the schedule is
// unchanged otherwise. A nil Workers is filled in from the latest
// decision's, even one that d drops: workers change only by the version
// order (a worker lost by version 5 is still lost when a server loss's
// version 6 re-cuts from the same iteration), not by the iteration order.
func (s *Schedule) Rewrite(d Decision) error {
	if err := d.Validate(); err != nil {
		return fmt.Errorf("lb: schedule: %w", err)
	}
	last := s.ds[len(s.ds)-1]
	if d.Version <= last.Version {
		return fmt.Errorf("lb: schedule: decision version %d is not after the latest, %d", d.Version, last.Version)
	}
	keep := sort.Search(len(s.ds), func(i int) bool { return s.ds[i].Iteration >= d.Iteration })
	past := sort.Search(len(s.past), func(i int) bool { return s.past[i].from >= d.Iteration })
	clear(s.past[past:])
	s.past = s.past[:past]
	clear(s.ds[keep:])
	s.ds = append(s.ds[:keep], inherit(clone(d), last))
	return nil
}

// inherit gives d the workers of the decision before it, prev, when d
// leaves them unchanged (nil). The slice is shared: decisions held are
// never modified.
func inherit(d, prev Decision) Decision {
	if d.Workers == nil {
		d.Workers = prev.Workers
	}
	return d
}

// At returns the decision in force at iteration: the latest decision whose
// Iteration is at most iteration, or the earliest one kept if there is none.
// The result shares its slices with the schedule: do not modify them.
func (s *Schedule) At(iteration uint64) Decision {
	return s.ds[s.index(iteration)]
}

// index returns the index of the decision in force at iteration.
func (s *Schedule) index(iteration uint64) int {
	// The first decision taking effect after iteration; the one before it
	// is in force.
	i := sort.Search(len(s.ds), func(i int) bool { return s.ds[i].Iteration > iteration })
	return max(i-1, 0)
}

// WorkersAt returns the workers whose pushes the sums of iteration add up
// (the Workers of the decision in force at it, a forgotten one's too), or
// nil if no decision has named them. The slice is shared with the
// schedule: do not modify it.
func (s *Schedule) WorkersAt(iteration uint64) []node.ID {
	if len(s.past) > 0 && iteration < s.ds[0].Iteration {
		i := sort.Search(len(s.past), func(i int) bool { return s.past[i].from > iteration })
		return s.past[max(i-1, 0)].workers
	}
	return s.At(iteration).Workers
}

// Latest returns the most recently added decision (which may not be in
// force yet). The result shares its slices with the schedule.
func (s *Schedule) Latest() Decision {
	return s.ds[len(s.ds)-1]
}

// Forget drops the decisions that no iteration from before on can need:
// those superseded at or before before. The decision in force at before,
// and every later one, are kept; of those dropped only their workers are,
// when they change, for WorkersAt.
func (s *Schedule) Forget(before uint64) {
	i := s.index(before)
	if i == 0 {
		return
	}
	for _, d := range s.ds[:i] {
		n := len(s.past)
		switch {
		case n > 0 && s.past[n-1].from == d.Iteration:
			s.past[n-1].workers = d.Workers // superseded at the same iteration
		case n == 0 || !slices.Equal(s.past[n-1].workers, d.Workers):
			s.past = append(s.past, workersFrom{d.Iteration, d.Workers})
		}
	}
	n := copy(s.ds, s.ds[i:])
	clear(s.ds[n:])
	s.ds = s.ds[:n]
}

// Len returns the number of decisions held (not counting the workers
// kept of forgotten ones).
func (s *Schedule) Len() int { return len(s.ds) }

// clone copies d's slices, so that the schedule's decisions cannot be
// changed through the caller's.
func clone(d Decision) Decision {
	d.Aggregators = append([]node.ID(nil), d.Aggregators...)
	d.Shares = append([]float64(nil), d.Shares...)
	d.Workers = slices.Clone(d.Workers)
	return d
}
