// Package aggregator is a node's aggregator role (docs/design.md): it takes
// the workers' pushed partitions off the van, sums them in a reduce.Table
// and, when a partition has the contributions of every worker of its
// iteration, sends the sum to each of them. The workers of an iteration
// are the job's at the start, then those the LB decisions name (a worker
// lost under FPT_ON_WORKER_LOSS=continue, or joining): Follow. Servers run one; so does every worker, since the LB may make a
// worker the aggregator of part of a tensor. On a worker the node's own
// contribution to a partition it aggregates is added in place (AddLocal)
// and its own copy of the sum is handed over in place too: it never
// crosses the network.
//
// The arithmetic and its bookkeeping are package reduce's; this package
// only moves frames in and out.
package aggregator

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/fptps/fpt/cluster"
	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/reduce"
	"github.com/fptps/fpt/trace"
)

// Deliver hands this node's own copy of a completed sum to it: h is the
// Result header the other workers receive, data the sum, valid only during
// the call.
type Deliver func(h *frame.Header, data []byte)

// Aggregator sums the partitions pushed to one node.
type Aggregator struct {
	node    *cluster.Member
	deliver Deliver         // nil on servers
	trace   *trace.Recorder // nil: not tracing

	mu      sync.Mutex // the netconn van calls in parallel; workers add locally
	table   *reduce.Table
	retries []retry // re-cuts after lost nodes: pushes they supersede are dropped
	// sets are the workers of every iteration, by increasing from; the
	// first is from 0. One per change of workers, which is rare: none is
	// forgotten, so that a lost worker's late push is always recognised.
	sets []workerSet
	// version is the latest decision followed. A push cut under a later
	// one (its worker heard of it first: a retry's pushes follow it at
	// once) may count over workers this node does not know yet, so it
	// waits in early until Follow brings that decision. Only where the
	// LB's directives come at all (config.Grants): without them no
	// decision changes the workers.
	version uint32
	early   []earlyPush
	follows bool
	// groups are the workers' local groups when they sum locally
	// (FPT_LOCAL_AGGREGATION=on; nil otherwise): a group's leader pushes
	// the group's sum (frame.FlagHostSum), and only leaders are sent
	// sums, which they hand to their group.
	groups *hostGroups
	// covered are, per partition summing, the workers a host sum counted
	// besides its leader: they are sent no sum (their leader hands it on).
	covered map[reduce.PartID][]node.ID
}

// earlyPush is a push cut under a decision not followed yet; data is a
// buffer of the table (the van's, adopted, or a copy).
type earlyPush struct {
	h    frame.Header
	data []byte
}

// workerSet is the workers whose contributions make up every sum from
// iteration from on (until the next set's from), in increasing id order.
// The slice is never modified: broadcasts read it outside the lock.
type workerSet struct {
	from uint64
	ids  []node.ID
}

// retry is a decision that re-cut iterations from from on: pushes of those
// iterations cut under an older version are stale.
type retry struct {
	version uint32
	from    uint64
}

// New returns the aggregator of node n. deliver receives the node's own copy
// of each sum when n is a worker; it is nil on a server.
func New(n *cluster.Member, deliver Deliver) *Aggregator {
	cfg := n.Config()
	return &Aggregator{node: n, deliver: deliver, table: reduce.NewTable(),
		trace: n.Tracer(), follows: cfg.Grants()}
}

// Started takes the workers of the node table, which the node has once
// it started, as those of the first iterations: a server that joins a
// running job after a worker left finds fewer workers than
// DMLC_NUM_WORKER. Call it as soon as the node has started.
func (a *Aggregator) Started() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.initSets()
}

// initSets sets the first worker set, once, from the node table (a push
// may come a moment before Started); without one (an aggregator never
// started, in tests) the configured workers stand in. The caller holds
// a.mu.
func (a *Aggregator) initSets() {
	if a.sets != nil {
		return
	}
	ids := a.node.Workers()
	if len(ids) == 0 {
		ids = make([]node.ID, a.node.Config().NumWorkers)
		for rank := range ids {
			ids[rank] = node.WorkerID(rank)
		}
	}
	slices.Sort(ids)
	a.sets = []workerSet{{0, ids}}
	if a.node.SumsLocally() {
		a.groups = newHostGroups(a.node, ids)
	}
}

// PayloadBuffer is the van.Sink half for Push frames: a pushed partition is
// read straight into a buffer of the table, which becomes the partition's
// sum when it is the first contribution (no copy) and is summed and
// recycled otherwise.
func (a *Aggregator) PayloadBuffer(h *frame.Header) []byte {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.table.Buffer(int(h.Length))
}

// HandlePush adds a Push frame received from a worker and sends the sum
// when it is complete. inPlace says that payload is a buffer PayloadBuffer
// gave for it (the van's Handler is told so), which the table takes back. A push that a retry superseded, or a late one from
// a worker that was lost before its iteration, is dropped; one from a node
// that is no worker of its iteration, and never was before, is an error.
func (a *Aggregator) HandlePush(h *frame.Header, payload []byte, inPlace bool) error {
	return a.add(h, payload, inPlace)
}

// stale reports whether a retry superseded the push h: its iteration was
// cut again under a newer decision. The caller holds a.mu.
func (a *Aggregator) stale(h *frame.Header) bool {
	for _, r := range a.retries {
		if h.Iteration >= r.from && h.Aux < r.version {
			return true
		}
	}
	return false
}

// workersAt returns the workers of iteration and the index of their set.
// The caller holds a.mu.
func (a *Aggregator) workersAt(iteration uint64) ([]node.ID, int) {
	a.initSets()
	i := len(a.sets) - 1
	for i > 0 && a.sets[i].from > iteration {
		i--
	}
	return a.sets[i].ids, i
}

// Follow applies what an LB directive changes for the aggregator. A
// decision naming workers makes them the workers of every iteration from
// its Iteration on (replacing any set taking effect there or later, as
// lb.Schedule.Rewrite does). A retry decision (a lost node) re-cuts the
// iterations from its Iteration on: their partial sums cut under older
// versions are dropped, and so are such pushes arriving later. Workers
// push those iterations again under the new version (to the workers left,
// when a worker was lost); their sums start from nothing, so no
// contribution is counted twice and none of the lost worker's remains.
func (a *Aggregator) Follow(d lb.Directive) {
	if d.Decision == nil {
		return
	}
	a.mu.Lock()
	ready := a.follow(d)
	a.mu.Unlock()
	for i := range ready {
		e := &ready[i]
		if err := a.add(&e.h, e.data, true); err != nil {
			a.node.Fail(fmt.Errorf("aggregator: from %s: %s: %w", node.ID(e.h.Sender), &e.h, err))
			return
		}
	}
}

// follow is Follow under a.mu; it returns the early pushes the decision
// lets in.
func (a *Aggregator) follow(d lb.Directive) []earlyPush {
	a.initSets()
	a.version = max(a.version, d.Decision.Version)
	var ready []earlyPush
	a.early = slices.DeleteFunc(a.early, func(e earlyPush) bool {
		if e.h.Aux > a.version {
			return false
		}
		ready = append(ready, e)
		return true
	})
	from := d.Decision.Iteration
	if ws := d.Decision.Workers; ws != nil {
		keep := len(a.sets)
		for keep > 0 && a.sets[keep-1].from >= from {
			keep--
		}
		a.sets = append(a.sets[:keep], workerSet{from, slices.Clone(ws)})
		a.groups.regroup(from, ws)
		a.node.Logger().Info("workers of the sums changed", "from_iteration", from, "workers", ws, "version", d.Decision.Version)
	}
	if d.Retry {
		a.retries = append(a.retries, retry{d.Decision.Version, from})
		for pid := range a.covered {
			if pid.Iteration >= from && pid.Version < d.Decision.Version {
				delete(a.covered, pid) // dropped with its partial sum
			}
		}
		if n := a.table.DropStale(d.Decision.Version, from); n > 0 {
			a.node.Logger().Info("partial sums dropped after a retry", "partitions", n, "from_iteration", from, "version", d.Decision.Version)
		}
	}
	return ready
}

// AddLocal adds this worker's own contribution to a partition it
// aggregates, under the rules of HandlePush. h is the Push header it would
// have sent (Sender is this node); data is copied before AddLocal returns.
func (a *Aggregator) AddLocal(h *frame.Header, data []byte) error {
	return a.add(h, data, false)
}

// add counts the contribution h of one of the iteration's workers, drops
// it (taking an adopted buffer back) if it must not count, and sends the
// sum when it is complete.
func (a *Aggregator) add(h *frame.Header, data []byte, adopt bool) error {
	from := node.ID(h.Sender)
	a.mu.Lock()
	if h.Aux > a.version && a.follows {
		// Held, however far ahead: a server that joined a running job
		// starts at version 0 and hears only of decisions made since.
		defer a.mu.Unlock()
		if !adopt {
			buf := a.table.Buffer(len(data))
			copy(buf, data)
			data = buf
		}
		a.early = append(a.early, earlyPush{*h, data})
		return nil
	}
	ws, set := a.workersAt(h.Iteration)
	index := slices.Index(ws, from)
	if index < 0 || a.stale(h) {
		if adopt {
			a.table.Recycle(data)
		}
		lost := index < 0 && slices.ContainsFunc(a.sets[:set], func(s workerSet) bool { return slices.Contains(s.ids, from) })
		a.mu.Unlock()
		if index < 0 && !lost {
			return fmt.Errorf("push from %s, which is not a worker of iteration %d (workers %v)", from, h.Iteration, ws)
		}
		return nil
	}
	var also []int
	if h.Flags&frame.FlagHostSum != 0 {
		var err error
		if also, err = a.groups.also(from, h.Iteration, ws); err != nil {
			if adopt {
				a.table.Recycle(data)
			}
			a.mu.Unlock()
			return err
		}
	}
	// Under the lock: a dropped push must not open an aggregation span.
	a.trace.Begin(trace.Aggregate, h)
	sum, err := a.table.Add(reduce.Contribution{
		PartID:  partID(h),
		Adopt:   adopt,
		Workers: len(ws),
		Worker:  index,
		Also:    also,
		DType:   h.DType,
		Offset:  h.Offset,
		Total:   h.Total,
		Init:    h.Flags&frame.FlagInit != 0,
		Data:    data,
	})
	pid := partID(h)
	if err == nil && len(also) > 0 {
		if a.covered == nil {
			a.covered = map[reduce.PartID][]node.ID{}
		}
		for _, i := range also {
			a.covered[pid] = append(a.covered[pid], ws[i])
		}
	}
	var covered []node.ID
	if err == nil && sum != nil {
		covered = a.covered[pid]
		delete(a.covered, pid)
	}
	a.mu.Unlock()
	if err != nil || sum == nil {
		return err
	}
	a.trace.End(trace.Aggregate, h) // before any worker can have the sum
	return a.broadcast(h, sum, a.groups.recipients(h, ws, covered))
}

// broadcast sends sum to the workers of its iteration, ws (handing this
// node's own copy over in place), and returns its buffer to the table once
// the last copy has left.
func (a *Aggregator) broadcast(h *frame.Header, sum *reduce.Sum, ws []node.ID) error {
	self := uint32(a.node.Self().ID)
	remaining := int32(len(ws))
	release := func(error) {
		if atomic.AddInt32(&remaining, -1) == 0 {
			a.mu.Lock()
			a.table.Release(sum)
			a.mu.Unlock()
		}
	}
	msgs := make([]frame.Message, len(ws)) // live until their Done
	for i, id := range ws {
		msgs[i].Header = frame.Header{
			Type: frame.Result, DType: sum.DType, Flags: h.Flags &^ frame.FlagHostSum,
			Sender: self, Recipient: uint32(id),
			Key: sum.Key, Partition: sum.Partition, Iteration: sum.Iteration,
			Offset: sum.Offset, Total: sum.Total, Length: uint64(len(sum.Data)),
			Priority: h.Priority, Aux: h.Aux,
		}
		msgs[i].Payload = sum.Data
		msgs[i].Done = release
	}
	for i := range msgs {
		m := &msgs[i]
		if m.Header.Recipient == self {
			if a.deliver != nil {
				a.deliver(&m.Header, sum.Data)
			}
			release(nil)
			continue
		}
		if err := a.node.Van().Forward(m); err != nil {
			if cfg := a.node.Config(); cfg.Survives(ws[i]) {
				// A worker the job may go on without (FPT_ON_WORKER_LOSS=
				// continue): if it is gone, its retry sums this iteration
				// again without it; if not, the cluster fails anyway.
				a.node.Logger().Debug("sum not sent to a lost worker", "worker", ws[i], "err", err)
				release(err)
				continue
			}
			// Neither this frame nor the ones after it will call Done.
			for range len(msgs) - i {
				release(err)
			}
			return fmt.Errorf("broadcast to %s: %w", ws[i], err)
		}
	}
	return nil
}

func partID(h *frame.Header) reduce.PartID {
	return reduce.PartID{Key: h.Key, Partition: h.Partition, Iteration: h.Iteration, Version: h.Aux}
}
