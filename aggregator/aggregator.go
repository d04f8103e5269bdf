// Package aggregator is a node's aggregator role (docs/design.md): it takes
// the workers' pushed partitions off the van, sums them in a reduce.Table
// and, when a partition has all W contributions, sends the sum to every
// worker. Servers run one; so does every worker, since the LB may make a
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
	"sync"
	"sync/atomic"

	"github.com/fptps/fpt/cluster"
	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/reduce"
	"github.com/fptps/fpt/trace"
	"github.com/fptps/fpt/van"
)

// Deliver hands this node's own copy of a completed sum to it: h is the
// Result header the other workers receive, data the sum, valid only during
// the call.
type Deliver func(h *frame.Header, data []byte)

// Aggregator sums the partitions pushed to one node.
type Aggregator struct {
	node    *cluster.Member
	workers int
	deliver Deliver         // nil on servers
	trace   *trace.Recorder // nil: not tracing

	mu      sync.Mutex // the netconn van calls in parallel; workers add locally
	table   *reduce.Table
	adopted map[adoptKey]bool // pushes being read straight into a table buffer
	retries []retry           // re-cuts after lost servers: pushes they supersede are dropped
}

// retry is a decision that re-cut iterations from from on: pushes of those
// iterations cut under an older version are stale.
type retry struct {
	version uint32
	from    uint64
}

// adoptKey names one worker's contribution to one partition.
type adoptKey struct {
	part   reduce.PartID
	worker uint32
}

// New returns the aggregator of node n. deliver receives the node's own copy
// of each sum when n is a worker; it is nil on a server.
func New(n *cluster.Member, deliver Deliver) *Aggregator {
	w := n.Config().NumWorkers
	return &Aggregator{node: n, workers: w, deliver: deliver, table: reduce.NewTable(),
		adopted: make(map[adoptKey]bool), trace: n.Tracer()}
}

// PayloadBuffer is the van.Sink half for Push frames: a pushed partition is
// read straight into a buffer of the table, which becomes the partition's
// sum when it is the first contribution (no copy) and is summed and
// recycled otherwise.
func (a *Aggregator) PayloadBuffer(h *frame.Header) []byte {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.adopted[adoptKey{partID(h), h.Sender}] = true
	return a.table.Buffer(int(h.Length))
}

// HandlePush adds a Push frame received from a worker and sends the sum
// when it is complete.
func (a *Aggregator) HandlePush(h *frame.Header, payload []byte) error {
	from := node.ID(h.Sender)
	if r, ok := from.Role(); !ok || r != node.Worker || from.Rank() >= a.workers {
		return fmt.Errorf("push from %s, which is not a worker of this cluster", from)
	}
	a.mu.Lock()
	k := adoptKey{partID(h), h.Sender}
	adopt := a.adopted[k]
	delete(a.adopted, k)
	if a.stale(h) {
		if adopt {
			a.table.Recycle(payload)
		}
		a.mu.Unlock()
		return nil
	}
	a.mu.Unlock()
	return a.add(h, payload, adopt)
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

// Retry applies a retry decision (version, taking effect at from): the
// partial sums of iterations from on cut under older versions are
// dropped, and so are such pushes arriving later. Workers push those
// iterations again under the new version; its sums start from nothing, so
// no contribution is counted twice.
func (a *Aggregator) Retry(version uint32, from uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.retries = append(a.retries, retry{version, from})
	if n := a.table.DropStale(version, from); n > 0 {
		a.node.Logger().Info("partial sums dropped after a retry", "partitions", n, "from_iteration", from, "version", version)
	}
}

// AddLocal adds this worker's own contribution to a partition it
// aggregates. h is the Push header it would have sent (Sender is this
// node); data is copied before AddLocal returns.
func (a *Aggregator) AddLocal(h *frame.Header, data []byte) error {
	return a.add(h, data, false)
}

func (a *Aggregator) add(h *frame.Header, data []byte, adopt bool) error {
	a.trace.Begin(trace.Aggregate, h)
	a.mu.Lock()
	if !adopt && a.stale(h) {
		a.mu.Unlock()
		return nil
	}
	sum, err := a.table.Add(reduce.Contribution{
		PartID:  partID(h),
		Adopt:   adopt,
		Workers: a.workers,
		Worker:  node.ID(h.Sender).Rank(),
		DType:   h.DType,
		Offset:  h.Offset,
		Total:   h.Total,
		Init:    h.Flags&frame.FlagInit != 0,
		Data:    data,
	})
	a.mu.Unlock()
	if err != nil || sum == nil {
		return err
	}
	a.trace.End(trace.Aggregate, h) // before any worker can have the sum
	return a.broadcast(h, sum)
}

// broadcast sends sum to every worker (handing this node's own copy over
// in place) and returns its buffer to the table once the last copy has
// left.
func (a *Aggregator) broadcast(h *frame.Header, sum *reduce.Sum) error {
	self := uint32(a.node.Self().ID)
	remaining := int32(a.workers)
	release := func(error) {
		if atomic.AddInt32(&remaining, -1) == 0 {
			a.mu.Lock()
			a.table.Release(sum)
			a.mu.Unlock()
		}
	}
	msgs := make([]van.Message, a.workers) // live until their Done
	for rank := range msgs {
		msgs[rank].Header = frame.Header{
			Type: frame.Result, DType: sum.DType, Flags: h.Flags,
			Sender: self, Recipient: uint32(node.WorkerID(rank)),
			Key: sum.Key, Partition: sum.Partition, Iteration: sum.Iteration,
			Offset: sum.Offset, Total: sum.Total, Length: uint64(len(sum.Data)),
			Priority: h.Priority, Aux: h.Aux,
		}
		msgs[rank].Payload = sum.Data
		msgs[rank].Done = release
	}
	for rank := range msgs {
		m := &msgs[rank]
		if m.Header.Recipient == self {
			if a.deliver != nil {
				a.deliver(&m.Header, sum.Data)
			}
			release(nil)
			continue
		}
		if err := a.node.Van().Forward(m); err != nil {
			// Neither this frame nor the ones after it will call Done.
			for range a.workers - rank {
				release(err)
			}
			return fmt.Errorf("broadcast to worker %d: %w", rank, err)
		}
	}
	return nil
}

func partID(h *frame.Header) reduce.PartID {
	return reduce.PartID{Key: h.Key, Partition: h.Partition, Iteration: h.Iteration, Version: h.Aux}
}
