package lb

import (
	"fmt"
	"slices"
	"time"

	"github.com/fptps/fpt/node"
)

// JoinWorker adds worker id to the job and returns the directive that
// counts it in every sum from J on, J being the first iteration after the
// horizon granted: no worker can have pushed J yet, so every worker cuts
// and sums it with the joiner, and no iteration granted before changes
// (not a retry). The decision keeps the split of the latest non-probe
// decision and names the workers so far and id (Workers, in increasing
// id order). The joiner's progress starts at J, so Done waits for no
// iteration before it, and its reports count whatever retry version they
// carry until the next lost worker's retry: it never had a sum over the
// old workers. A hold ends (see Hold): the directive also grants what the
// steps held back. With the LB on the Balancer starts over from Default:
// a warm-up on the split kept, then, once the joiner's links have been
// measured for JoinSettle after now, a probe that measures them with
// every other node's (as Join for a server). It fails, changing nothing,
// when id is already a node of the job or not a worker's id, or when the
// job has as many nodes as a decision can name.
func (b *Balancer) JoinWorker(id node.ID, now time.Time) (Directive, error) {
	if _, known := b.isWorker[id]; known {
		return Directive{}, fmt.Errorf("lb: join worker %s: already a node of the job", id)
	}
	if len(b.all) >= MaxAggregators {
		return Directive{}, fmt.Errorf("lb: join worker %s: the job has %d nodes, as many as a decision can name", id, len(b.all))
	}
	workers := append(slices.Clone(b.cfg.Workers), id)
	j := b.horizon + 1
	dec := Decision{
		Version:     b.current.Version + 1,
		Iteration:   j,
		Aggregators: slices.Clone(b.good.Aggregators),
		Shares:      slices.Clone(b.good.Shares),
		Workers:     slices.Sorted(slices.Values(workers)),
	}
	if err := dec.Validate(); err != nil {
		return Directive{}, fmt.Errorf("lb: join worker %s: %w", id, err)
	}
	b.forgetEven()
	b.cfg.Workers = workers
	b.all = slices.Concat(b.cfg.Servers, b.cfg.Workers)
	b.isWorker[id] = true
	b.seen[id] = j
	if b.joined == nil {
		b.joined = make(map[node.ID]bool)
	}
	b.joined[id] = true
	if b.joinAt == nil {
		b.joinAt = make(map[node.ID]uint64)
	}
	b.joinAt[id] = j
	reason := fmt.Sprintf("%s joined: sums count it from iteration %d", id, j)
	if b.held {
		reason += "; hold over (" + b.holdWhy + ")"
	}
	b.release()
	if !b.cfg.Fixed {
		b.state = Default
		b.probeAt = satAdd(j-1, b.cfg.Warmup)
		b.probeAfter = now.Add(b.cfg.JoinSettle)
		b.probeWhy = fmt.Sprintf("%s joined: measuring its links", id)
	}
	return b.adopt(dec, reason), nil
}

// Hold stops the grants: until JoinWorker or Release, no directive grants
// an iteration past the horizon granted so far. Directives still come as
// the iterations granted complete (Done goes on), and a decision made
// meanwhile still takes effect after the horizon. FPT_ON_WORKER_LOSS=wait
// holds after a lost worker until a replacement joins; why says so in the
// joiner's directive.
func (b *Balancer) Hold(why string) { b.held, b.holdWhy = true, why }

// Held reports whether the grants are held (Hold).
func (b *Balancer) Held() bool { return b.held }

// Release ends a hold and returns the directive to send: it grants what
// the steps held back, as far as a step after the last iteration done
// would have. Without a hold it grants nothing new.
func (b *Balancer) Release() Directive {
	why := b.holdWhy
	b.release()
	return Directive{
		Horizon: b.horizon,
		Shaping: b.state != Probe,
		Done:    b.next,
		Reason:  clip("hold released (" + why + ")"),
	}
}

// release ends a hold. Every iteration done may have been held back from
// the grant its step would have made, and with all of them done no
// further step comes: grant them now.
func (b *Balancer) release() {
	b.held, b.holdWhy = false, ""
	b.horizon = max(b.horizon, b.next+b.ahead)
}

// JoinsAhead returns the workers that joined and whose first iteration
// no worker has the sums of yet (it is Done or later): once every other
// node is done, they have nothing to train.
func (b *Balancer) JoinsAhead() []node.ID {
	var out []node.ID
	for id, at := range b.joinAt {
		if at >= b.next {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// JoinIteration is worker id's first iteration if it joined (0 if not).
func (b *Balancer) JoinIteration(id node.ID) uint64 { return b.joinAt[id] }
