package worker

// The core's half of a worker joining a running job (see join.go): where
// it starts, the parameters as they arrive, and the duty of the worker
// that hands them over. No I/O, like the rest of core.

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/node"
)

// joinState is a joining worker's: where it starts and the parameters
// it starts from, as they arrive (Params frames), until Init takes them.
type joinState struct {
	// first is J, the iteration of its first push: 0 until the decision
	// that names it among the workers.
	first uint64
	parts map[uint64][]paramsPart // by key
	got   map[uint64]uint64       // bytes received, by key
	// waits are the Init calls waiting for their keys' parameters (MXNet
	// initialises one key per call); took the keys an Init took.
	waits []paramsWait
	took  map[uint64]bool
	// bufs are the keys' receive buffers (the shell maps them): Params
	// frames are read into them in place (paramsSink), and Init keeps
	// them as the keys' values after it (paramsTake) rather than copying
	// them again.
	bufs map[uint64][]byte
	// cloned counts the Params bytes copied out of the van's buffer (a
	// frame that had no receive buffer); kept those Init kept where they
	// were read.
	cloned, kept uint64
}

// paramsKept is a key's receive buffer once Init took the key: kept as
// its value after Init (keep: every value was read into it), else handed
// back (unmapped) once Init's copies are made.
type paramsKept struct {
	key  uint64
	mem  []byte
	keep bool
}

// paramsWait is an Init call waiting for the parameters of its keys.
type paramsWait struct {
	keys []uint64
	req  *request
}

// paramsPart is one Params frame's values.
type paramsPart struct {
	sender node.ID
	iter   uint64
	dtype  frame.DType
	total  uint64
	off    uint64
	data   []byte
}

// paramsDuty is this worker's turn to hand its parameters of the start
// of iteration iter to the workers joining then.
type paramsDuty struct {
	iter     uint64
	to       []node.ID
	priority int32
	keys     []*tensor
}

// joining marks the core as a worker that joined a running job.
func (c *core) joining() {
	if c.join == nil {
		c.join = &joinState{parts: make(map[uint64][]paramsPart), got: make(map[uint64]uint64), took: make(map[uint64]bool), bufs: make(map[uint64][]byte)}
	}
}

// joinedAt starts a joining worker's tensors at iteration first, that of
// the decision naming it.
func (c *core) joinedAt(d lb.Decision) error {
	sched, err := lb.NewSchedule(d)
	if err != nil {
		return fmt.Errorf("worker: the decision this worker joins by: %w", err)
	}
	c.schedule = sched
	c.join.first = d.Iteration
	c.sumsIn = d.Iteration
	for t := range c.allTensors() {
		c.untally(t)
		c.startTensor(t)
		c.tally(t)
	}
	return c.paramsReady()
}

// startTensor numbers a joining worker's tensor from its first iteration.
func (c *core) startTensor(t *tensor) {
	if c.join == nil || c.join.first == 0 {
		return
	}
	t.pushed, t.pulled, t.sumsIn = c.join.first, c.join.first, c.join.first
}

// startIteration is the iteration of the first push after Init: 1, or
// for a worker that joined a running job the iteration it joined at (0
// until it knows).
func (c *core) startIteration() uint64 {
	if c.join != nil {
		return c.join.first
	}
	return 1
}

// duty returns this worker's parameters duty for iteration iter: it
// hands them over when some worker joins at iter and it has the lowest id
// among the workers of both iter-1 and iter. Each iteration is looked at
// once, at its first push: a join's decision comes before the grant of
// its iteration, so before any push of it.
func (c *core) duty(iter uint64, priority int32) *paramsDuty {
	if iter == 0 || iter < c.dutyFrom || c.schedule == nil {
		return nil
	}
	c.dutyFrom = iter + 1
	now, before := c.schedule.WorkersAt(iter), c.schedule.WorkersAt(iter-1)
	var to []node.ID
	sender, stays := node.ID(0), false
	for _, id := range now {
		switch {
		case !slices.Contains(before, id):
			to = append(to, id)
		case !stays || id < sender:
			sender, stays = id, true
		}
	}
	if len(to) == 0 || !stays || sender != c.self {
		return nil
	}
	keys := make([]*tensor, 0, len(c.tensors))
	for t := range c.allTensors() {
		keys = append(keys, t)
	}
	slices.SortFunc(keys, func(a, b *tensor) int { return cmp.Compare(a.key, b.key) })
	return &paramsDuty{iter: iter, to: to, priority: priority, keys: keys}
}

// paramsSink is the van.Sink half for Params frames: the span of the
// key's receive buffer the frame's values are read into, or nil (need 0)
// for a frame params will refuse or a key not declared yet (its values
// are copied out of the van's buffer). need > 0 asks the shell for the
// key's buffer first (paramsBuffer).
func (c *core) paramsSink(h *frame.Header) (span []byte, need uint64) {
	j := c.join
	if j == nil || h.Flags&frame.FlagRefused != 0 || j.took[h.Key] {
		return nil, 0
	}
	t := c.tensors[h.Key]
	if t == nil || h.DType != t.dtype || h.Total != t.bytes || h.Offset+h.Length > t.bytes {
		return nil, 0
	}
	buf := j.bufs[h.Key]
	if buf == nil {
		return nil, t.bytes
	}
	return buf[h.Offset : h.Offset+h.Length], 0
}

// paramsBuffer gives a key its receive buffer (paramsSink's need), then
// answers as paramsSink. mem is the core's until paramsTake or fail hands
// it back.
func (c *core) paramsBuffer(h *frame.Header, mem []byte) (span []byte, unmap []byte) {
	if _, need := c.paramsSink(h); need != uint64(len(mem)) {
		return nil, mem // the key changed meanwhile: not wanted
	}
	c.join.bufs[h.Key] = mem
	span, _ = c.paramsSink(h)
	return span, nil
}

// params takes a Params frame, its values data: read in place into the
// key's receive buffer, or (cloned) copied out of the van's.
func (c *core) params(h *frame.Header, data []byte, cloned bool) (effects, error) {
	j := c.join
	switch {
	case j == nil:
		return effects{}, errors.New("parameters for a worker that did not join a running job")
	case h.Flags&frame.FlagRefused != 0:
		return effects{}, fmt.Errorf("%s cannot hand over the parameters this joining worker starts from: %s", node.ID(h.Sender), data)
	case j.took[h.Key]:
		return effects{}, fmt.Errorf("parameters of key %d after Init took them", h.Key)
	}
	for _, p := range j.parts[h.Key] {
		switch {
		case p.dtype != h.DType || p.total != h.Total || p.sender != node.ID(h.Sender) || p.iter != h.Iteration:
			return effects{}, fmt.Errorf("key %d's parameters disagree: %s from %s of iteration %d, then %s", h.Key, p.dtype, p.sender, p.iter, h)
		case p.off < h.Offset+h.Length && h.Offset < p.off+uint64(len(p.data)):
			return effects{}, fmt.Errorf("key %d's parameters [%d,+%d) received twice", h.Key, h.Offset, h.Length)
		}
	}
	j.parts[h.Key] = append(j.parts[h.Key], paramsPart{sender: node.ID(h.Sender), iter: h.Iteration, dtype: h.DType, total: h.Total, off: h.Offset, data: data})
	j.got[h.Key] += h.Length
	if cloned {
		j.cloned += h.Length
	}
	if err := c.checkParams(h.Key); err != nil {
		return effects{}, err
	}
	return c.paramsSettle(), nil
}

// awaitParams is a joining worker's Init: a request that completes once
// the keys' parameters are all here (paramsTake then hands them over).
func (c *core) awaitParams(keys []uint64, cl *call) (effects, error) {
	j := c.join
	for _, k := range keys {
		switch {
		case c.tensors[k] == nil:
			return effects{}, fmt.Errorf("worker: Init: key %d is not declared", k)
		case j.took[k] || slices.ContainsFunc(j.waits, func(w paramsWait) bool { return slices.Contains(w.keys, k) }):
			return effects{}, fmt.Errorf("worker: Init: key %d: a joining worker gets a key's parameters once", k)
		}
	}
	if err := c.paramsReady(); err != nil {
		return effects{}, err
	}
	req, err := c.newRequest(cl, 1)
	if err != nil {
		return effects{}, err
	}
	j.waits = append(j.waits, paramsWait{slices.Clone(keys), req})
	out := effects{req: req}
	out.merge(c.paramsSettle())
	return out, nil
}

// cancelParams gives up an Init's wait for its parameters (its context
// ended): the keys may be waited for again.
func (c *core) cancelParams(ts int, err error) effects {
	var out effects
	c.join.waits = slices.DeleteFunc(c.join.waits, func(w paramsWait) bool {
		if w.req.ts != ts {
			return false
		}
		out.merge(c.settle(w.req, 1, err))
		return true
	})
	return out
}

// paramsReady checks every key's parameters arrived so far (see
// checkParams): once this worker knows where it starts, and before an
// Init waits for them.
func (c *core) paramsReady() error {
	for k := range c.join.parts {
		if err := c.checkParams(k); err != nil {
			return err
		}
	}
	return nil
}

// checkParams checks key's parameters against its declaration and,
// once this worker knows where it starts, against that iteration and the
// worker that hands them over. The parts agree with one another (params),
// so the first stands for all.
func (c *core) checkParams(key uint64) error {
	parts := c.join.parts[key]
	t := c.tensors[key]
	if len(parts) == 0 || t == nil {
		return nil // declared later
	}
	p, first := parts[0], c.join.first
	switch {
	case p.dtype != t.dtype || p.total != t.bytes:
		return fmt.Errorf("key %d's parameters are %d bytes of %s; it is declared as %d bytes of %s", key, p.total, p.dtype, t.bytes, t.dtype)
	case first != 0 && p.iter != first:
		return fmt.Errorf("key %d's parameters are of iteration %d; this worker joined at %d", key, p.iter, first)
	case first != 0 && p.sender != c.sender():
		return fmt.Errorf("key %d's parameters came from %s, not %s", key, p.sender, c.sender())
	}
	return nil
}

// sender is the worker that hands a joining worker its parameters.
func (c *core) sender() node.ID {
	return slices.Min(c.schedule.WorkersAt(c.join.first))
}

// paramsSettle completes the waiting Inits whose keys have all their
// parameters, once this worker knows where it starts.
func (c *core) paramsSettle() effects {
	j := c.join
	var out effects
	if j.first == 0 {
		return out
	}
	j.waits = slices.DeleteFunc(j.waits, func(w paramsWait) bool {
		for _, k := range w.keys {
			if j.got[k] != c.tensors[k].bytes {
				return false
			}
		}
		out.merge(c.settle(w.req, 1, nil))
		return true
	})
	return out
}

// paramsTake hands the parameters to the joining worker's Init, once its
// request completed: spans of data to copy them into, by key, and the
// keys' receive buffers, which are the shell's now: once it copied them,
// it keeps those that hold all their key's values as the values after
// Init (keepInitial) and unmaps the others (some frame of the key was
// copied out of the van's buffer instead).
func (c *core) paramsTake(keys []uint64, data []byte, byteLens []int) ([]initialCopy, []paramsKept, error) {
	j := c.join
	var out []initialCopy
	var kept []paramsKept
	off := 0
	for i, k := range keys {
		dst := data[off : off+byteLens[i]]
		off += byteLens[i]
		if j.got[k] != uint64(len(dst)) {
			return nil, nil, fmt.Errorf("key %d: %d bytes of parameters, want %d", k, j.got[k], len(dst))
		}
		buf := j.bufs[k]
		inBuf := buf != nil
		for _, p := range j.parts[k] {
			out = append(out, initialCopy{dst: dst[p.off : p.off+uint64(len(p.data))], src: p.data})
			inBuf = inBuf && overlaps(p.data, buf)
		}
		if buf != nil {
			kept = append(kept, paramsKept{k, buf, inBuf})
			delete(j.bufs, k)
		}
		if inBuf {
			j.kept += uint64(len(buf))
		}
		delete(j.parts, k)
		delete(j.got, k)
		j.took[k] = true
	}
	return out, kept, nil
}

// paramsBufs hands back the receive buffers of keys Init did not take
// (the node failed): nothing reads into them any more.
func (c *core) paramsBufs() [][]byte {
	if c.join == nil {
		return nil
	}
	var out [][]byte
	for k, b := range c.join.bufs {
		out = append(out, b)
		delete(c.join.bufs, k)
	}
	return out
}
