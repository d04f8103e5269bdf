package worker

// The core's pushes: a call's tensors cut into frames under the decision
// in force at their iteration, and the count of iterations pushed in full.

import (
	"errors"
	"fmt"
	"slices"

	"github.com/fptps/fpt/frame"
)

// push is FPTPush on bytes: byteLens[i] bytes of data belong to keys[i].
// It answers errHorizon, changing nothing, while an iteration it would
// push lies beyond the LB's horizon.
func (c *core) push(keys []uint64, data []byte, byteLens []int, dtype frame.DType, priority int32, cl *call) (effects, error) {
	ts, parts, err := c.split(keys, data, byteLens, dtype)
	if err != nil {
		return effects{}, err
	}
	if c.join != nil && slices.ContainsFunc(ts, func(t *tensor) bool { return !c.join.took[t.key] }) {
		return effects{}, errors.New("worker: a worker that joined a running job calls Init first: it gets the parameters there")
	}
	if i := slices.IndexFunc(ts, func(t *tensor) bool { return t.once }); i >= 0 {
		return effects{}, fmt.Errorf("worker: key %d was broadcast: it has its init round only, and is never pushed again", ts[i].key)
	}
	if slices.ContainsFunc(ts, func(t *tensor) bool { return t.pushed > c.horizon }) {
		return effects{}, errHorizon
	}
	// One slice holds the request's frames: they live until their Done.
	// locals are the partitions this worker aggregates itself.
	var msgs, locals []frame.Message
	began := uint64(0)
	for i, t := range ts {
		began = max(began, t.pushed)
		msgs, locals = c.cut(msgs, locals, t, t.pushed, parts[i], priority)
	}
	hold := 0
	if c.retryMode && began >= c.done {
		hold = 1 // settled once every worker has the sums (releaseHeld)
	}
	req, err := c.newRequest(cl, len(msgs)+hold)
	if err != nil {
		return effects{}, err
	}
	req.iter, req.bytes, req.fpt = began, uint64(len(data)), true
	if len(ts) > 0 { // a push of no keys is a request that settles at once
		req.key = ts[0].key
	}
	if hold > 0 {
		hp := &heldPush{req: req, ts: ts, iters: make([]uint64, len(ts)), parts: parts, priority: priority, last: began}
		for i, t := range ts {
			hp.iters[i] = t.pushed
		}
		c.hold(hp)
	}
	out := effects{req: req, locals: locals, sends: msgs, counted: true}
	for _, t := range ts {
		iter := t.pushed
		if out.duty == nil {
			out.duty = c.duty(iter, priority)
		}
		c.untally(t)
		t.pushed++
		c.tally(t)
		out.unmap = append(out.unmap, t.forgetInitial()...)
		if _, layout := c.layoutFor(t, iter); len(layout) == 0 {
			// An empty tensor's sum is complete as soon as it is pushed.
			r := c.resultFor(t, iter)
			r.complete = true
			out.merge(c.sumIn(t, iter))
		}
	}
	if !c.retryMode {
		out.began = &iterationBegan{iter: began, modelBytes: c.modelBytes, version: c.retryVersion()}
	} else {
		// A sum that landed before its key's push counts from the push:
		// where it was the last one out, no later sum would report it.
		out.merge(c.reportSums())
	}
	return out, nil
}

// cut appends t's frames for an iteration, from its values data, under
// the decision in force then: to sends the partitions to send, to locals
// those this worker aggregates itself. In the init round only worker 0
// sends.
func (c *core) cut(sends, locals []frame.Message, t *tensor, iter uint64, data []byte, priority int32) ([]frame.Message, []frame.Message) {
	var flags uint8
	if iter == 0 {
		if c.rank != 0 {
			return sends, locals
		}
		flags = frame.FlagInit
	}
	d, layout := c.layoutFor(t, iter)
	for _, p := range layout {
		m := frame.Message{
			Header: frame.Header{
				Type: frame.Push, DType: t.dtype, Flags: flags,
				Sender: uint32(c.self), Recipient: uint32(p.Aggregator),
				Key: t.key, Partition: p.Index, Iteration: iter,
				Offset: p.Offset, Total: t.bytes, Length: p.Length, Priority: priority, Aux: d.Version,
			},
			Payload: data[p.Offset : p.Offset+p.Length],
		}
		if p.Aggregator == c.self {
			locals = append(locals, m)
		} else {
			sends = append(sends, m)
		}
	}
	return sends, locals
}

// iterationsPushed is how many iterations this worker has pushed in full:
// the fewest pushes of any declared key but broadcast ones (0 before any).
func (c *core) iterationsPushed() uint64 {
	n, _ := c.pushes.min()
	return n
}

// unpushed reports an error unless none of keys has been pushed: Init
// must be a key's first push.
func (c *core) unpushed(keys []uint64) error {
	for _, k := range keys {
		if t := c.tensors[k]; t != nil && t.pushed > 0 {
			return fmt.Errorf("worker: Init: key %d was pushed already", k)
		}
	}
	return nil
}

// broadcastOnly marks keys initialised by Broadcast: their init round is
// all they have (see tensor.once).
func (c *core) broadcastOnly(keys []uint64) {
	for _, k := range keys {
		if t := c.tensors[k]; t != nil && !t.once {
			c.untally(t)
			t.once = true
		}
	}
}
