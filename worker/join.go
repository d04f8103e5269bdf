package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/van"
)

// A worker may join a running job (started with the job's environment
// while it runs; the LB's grants must run: FPT_LB=on, FPT_ON_SERVER_LOSS=
// retry or FPT_ON_WORKER_LOSS=continue|wait). The scheduler admits it with
// a new id and an LB decision, taking effect at the first iteration no
// worker has pushed yet (J), whose Workers adds it: every sum from J on
// counts its pushes. Its program starts from the parameters the others
// have at the start of J. The library holds sums, not parameters, so a
// program that can be joined hands them over: SetParamsSource. On the
// joiner, Init returns them (in place of the init round, with no barrier)
// and its first push is of iteration J (StartIteration).

// ParamsSource copies the program's parameters of key into dst (exactly
// the key's declared bytes), as they are at the start of iteration (the
// values that iteration's gradients were computed from, before its sums
// are applied). An error is sent to the joining worker, which fails.
type ParamsSource func(iteration, key uint64, dst []byte) error

// errNoParamsSource is what a joining worker hears from a program that
// registered no ParamsSource.
var errNoParamsSource = errors.New("its program registered no parameters source (worker.SetParamsSource, fpt_set_params_source, fpt.set_params_source; fpt.torch registers the model's): a worker cannot join this job")

// SetParamsSource registers the source of the parameters a joining
// worker starts from. The worker that hands them over (the one with the
// lowest id among the workers of both J-1 and J) calls src once per
// declared key during its first FPTPush of iteration J, on the calling
// goroutine, before that push is sent: a program that pushes an
// iteration's gradients before applying its sums (every synchronous
// trainer does) still has the parameters of the start of J then. Set it
// before the first push; nil removes it.
func (w *Worker) SetParamsSource(src ParamsSource) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.params = src
}

// Joined reports whether this worker joined a running job (its node
// table said so), rather than starting with it.
func (w *Worker) Joined() bool { return w.node.Joined() }

// StartIteration is the iteration of this worker's first push after Init:
// 1 for a worker that started with the job (iteration 0 is the init
// round), J for one that joined it. On a joiner it is known once Init has
// returned (0 before).
func (w *Worker) StartIteration() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.c.startIteration()
}

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

// maxRefusal bounds a refusal's text; minRefusal is the least a frame of
// a partition may carry (van.lengthBound's floor).
const maxRefusal, minRefusal = 1024, 16

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
		c.join = &joinState{parts: make(map[uint64][]paramsPart), got: make(map[uint64]uint64), took: make(map[uint64]bool)}
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
	for _, t := range c.tensors {
		c.startTensor(t)
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

// duty returns this worker's parameters duty for iteration iter, once:
// it hands them over when some worker joins at iter and it has the lowest
// id among the workers of both iter-1 and iter.
func (c *core) duty(iter uint64, priority int32) *paramsDuty {
	if iter == 0 || c.schedule == nil || c.dutiesDone[iter] {
		return nil
	}
	now, before := c.schedule.WorkersAt(iter), c.schedule.WorkersAt(iter-1)
	var to []node.ID
	for _, id := range now {
		if !slices.Contains(before, id) {
			to = append(to, id)
		}
	}
	stay := slices.DeleteFunc(slices.Clone(now), func(id node.ID) bool { return slices.Contains(to, id) })
	if len(to) == 0 || len(stay) == 0 || slices.Min(stay) != c.self {
		return nil
	}
	if c.dutiesDone == nil {
		c.dutiesDone = make(map[uint64]bool)
	}
	c.dutiesDone[iter] = true
	keys := make([]*tensor, 0, len(c.tensors))
	for _, t := range c.tensors {
		keys = append(keys, t)
	}
	slices.SortFunc(keys, func(a, b *tensor) int { return cmp.Compare(a.key, b.key) })
	return &paramsDuty{iter: iter, to: to, priority: priority, keys: keys}
}

// params takes a Params frame (its payload copied already): values this
// joining worker starts from.
func (c *core) params(h *frame.Header, data []byte) (todo, error) {
	j := c.join
	switch {
	case j == nil:
		return todo{}, errors.New("parameters for a worker that did not join a running job")
	case h.Flags&frame.FlagRefused != 0:
		return todo{}, fmt.Errorf("%s cannot hand over the parameters this joining worker starts from: %s", node.ID(h.Sender), data)
	case j.took[h.Key]:
		return todo{}, fmt.Errorf("parameters of key %d after Init took them", h.Key)
	}
	for _, p := range j.parts[h.Key] {
		switch {
		case p.dtype != h.DType || p.total != h.Total || p.sender != node.ID(h.Sender) || p.iter != h.Iteration:
			return todo{}, fmt.Errorf("key %d's parameters disagree: %s from %s of iteration %d, then %s", h.Key, p.dtype, p.sender, p.iter, h)
		case p.off < h.Offset+h.Length && h.Offset < p.off+uint64(len(p.data)):
			return todo{}, fmt.Errorf("key %d's parameters [%d,+%d) received twice", h.Key, h.Offset, h.Length)
		}
	}
	j.parts[h.Key] = append(j.parts[h.Key], paramsPart{sender: node.ID(h.Sender), iter: h.Iteration, dtype: h.DType, total: h.Total, off: h.Offset, data: data})
	j.got[h.Key] += h.Length
	if err := c.paramsReady(); err != nil {
		return todo{}, err
	}
	return c.paramsSettle(), nil
}

// awaitParams is a joining worker's Init: a request that completes once
// the keys' parameters are all here (paramsTake then hands them over).
func (c *core) awaitParams(keys []uint64, cl *call) (todo, error) {
	j := c.join
	for _, k := range keys {
		switch {
		case c.tensors[k] == nil:
			return todo{}, fmt.Errorf("worker: Init: key %d is not declared", k)
		case j.took[k] || slices.ContainsFunc(j.waits, func(w paramsWait) bool { return slices.Contains(w.keys, k) }):
			return todo{}, fmt.Errorf("worker: Init: key %d: a joining worker gets a key's parameters once", k)
		}
	}
	if err := c.paramsReady(); err != nil {
		return todo{}, err
	}
	req, err := c.newRequest(cl, 1)
	if err != nil {
		return todo{}, err
	}
	j.waits = append(j.waits, paramsWait{slices.Clone(keys), req})
	out := todo{req: req}
	out.merge(c.paramsSettle())
	return out, nil
}

// cancelParams gives up an Init's wait for its parameters (its context
// ended): the keys may be waited for again.
func (c *core) cancelParams(ts int, err error) todo {
	var out todo
	c.join.waits = slices.DeleteFunc(c.join.waits, func(w paramsWait) bool {
		if w.req.ts != ts {
			return false
		}
		out.merge(c.settle(w.req, 1, err))
		return true
	})
	return out
}

// paramsReady checks what has arrived against the keys declared, once
// this worker knows where it starts.
func (c *core) paramsReady() error {
	j := c.join
	for k, parts := range j.parts {
		t := c.tensors[k]
		if t == nil {
			continue // declared later
		}
		p := parts[0]
		switch {
		case p.dtype != t.dtype || p.total != t.bytes:
			return fmt.Errorf("key %d's parameters are %d bytes of %s; it is declared as %d bytes of %s", k, p.total, p.dtype, t.bytes, t.dtype)
		case j.first != 0 && p.iter != j.first:
			return fmt.Errorf("key %d's parameters are of iteration %d; this worker joined at %d", k, p.iter, j.first)
		case j.first != 0 && p.sender != c.sender():
			return fmt.Errorf("key %d's parameters came from %s, not %s", k, p.sender, c.sender())
		}
	}
	return nil
}

// sender is the worker that hands a joining worker its parameters.
func (c *core) sender() node.ID {
	return slices.Min(c.schedule.WorkersAt(c.join.first))
}

// paramsSettle completes the waiting Inits whose keys have all their
// parameters, once this worker knows where it starts.
func (c *core) paramsSettle() todo {
	j := c.join
	var out todo
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
// request completed: spans of data to copy them into, by key.
func (c *core) paramsTake(keys []uint64, data []byte, byteLens []int) ([]initialCopy, error) {
	j := c.join
	var out []initialCopy
	off := 0
	for i, k := range keys {
		dst := data[off : off+byteLens[i]]
		off += byteLens[i]
		if j.got[k] != uint64(len(dst)) {
			return nil, fmt.Errorf("key %d: %d bytes of parameters, want %d", k, j.got[k], len(dst))
		}
		for _, p := range j.parts[k] {
			out = append(out, initialCopy{dst: dst[p.off : p.off+uint64(len(p.data))], src: p.data})
		}
		delete(j.parts, k)
		delete(j.got, k)
		j.took[k] = true
	}
	return out, nil
}

// sendParams carries out a parameters duty: it asks the program for each
// key's parameters and sends them to the joining workers, or why not.
func (w *Worker) sendParams(d *paramsDuty) {
	w.mu.Lock()
	src := w.params
	w.mu.Unlock()
	log := w.node.Logger()
	var msgs []van.Message
	err := errNoParamsSource
	if src != nil {
		msgs, err = w.paramsFrames(src, d)
	}
	if err != nil {
		log.Error("a worker joins, but its parameters cannot be handed over", "iteration", d.iter, "joining", d.to, "err", err)
		why := []byte(err.Error())
		// A frame of at most a partition, which the joiner's van accepts.
		why = why[:min(len(why), maxRefusal, max(int(w.node.Config().PartitionBytes), minRefusal))]
		msgs = msgs[:0]
		for _, to := range d.to {
			msgs = append(msgs, van.Message{
				Header:  frame.Header{Type: frame.Params, Flags: frame.FlagRefused, Sender: uint32(w.node.Self().ID), Recipient: uint32(to), Iteration: d.iter, Length: uint64(len(why))},
				Payload: why,
			})
		}
	} else {
		log.Info("handing the parameters to the joining workers", "iteration", d.iter, "joining", d.to, "keys", len(d.keys))
	}
	for i := range msgs {
		if err := w.node.Van().Send(&msgs[i]); err != nil {
			// The joiner is gone: the scheduler hears of it.
			log.Warn("sending the parameters to a joining worker", "to", node.ID(msgs[i].Header.Recipient), "err", err)
		}
	}
}

// paramsFrames asks src for every key's parameters of d.iter and cuts
// them into Params frames for each joining worker.
func (w *Worker) paramsFrames(src ParamsSource, d *paramsDuty) ([]van.Message, error) {
	partBytes := w.node.Config().PartitionBytes
	var msgs []van.Message
	for _, t := range d.keys {
		buf := make([]byte, t.bytes)
		if err := src(d.iter, t.key, buf); err != nil {
			return nil, fmt.Errorf("the parameters source failed for key %d of iteration %d: %w", t.key, d.iter, err)
		}
		for idx, span := range frame.Chunks(t.bytes, partBytes, t.dtype.Size()) {
			for _, to := range d.to {
				msgs = append(msgs, van.Message{
					Header: frame.Header{
						Type: frame.Params, DType: t.dtype, Sender: uint32(w.node.Self().ID), Recipient: uint32(to),
						Key: t.key, Partition: idx, Iteration: d.iter, Offset: span[0], Total: t.bytes, Length: span[1] - span[0], Priority: d.priority,
					},
					Payload: buf[span[0]:span[1]],
				})
			}
		}
	}
	return msgs, nil
}

// handleParams takes a Params frame on a joining worker.
func (w *Worker) handleParams(h *frame.Header, payload []byte) error {
	data := slices.Clone(payload) // the van's buffer is reused after the call
	w.mu.Lock()
	if w.node.Joined() {
		w.c.joining() // the frame may come a moment before Start marks the core
	}
	t, err := w.c.params(h, data)
	w.mu.Unlock()
	if err != nil {
		return err
	}
	w.do(t)
	return nil
}

// initJoined is Init on a worker that joined a running job: it waits for
// the parameters the others have at the start of its first iteration and
// returns them in data, with no init round and no barrier (the others
// are training).
func (w *Worker) initJoined(ctx context.Context, keys []uint64, data []byte, byteLens []int, dtype frame.DType) error {
	w.mu.Lock()
	_, _, err := w.c.split(keys, data, byteLens, dtype)
	var t todo
	if err == nil {
		// No began: waiting for a join is no pull's latency.
		t, err = w.c.awaitParams(keys, &call{done: make(chan struct{})})
	}
	w.mu.Unlock()
	if err != nil {
		return fmt.Errorf("worker: Init: %w", err)
	}
	ts := t.req.ts
	w.do(t)
	done := make(chan error, 1)
	go func() { done <- w.Wait(ts) }()
	select {
	case err = <-done:
	case <-ctx.Done():
		err = fmt.Errorf("worker: Init: waiting for the parameters of a joining worker: %w", ctx.Err())
		w.update(func(c *core) todo { return c.cancelParams(ts, err) })
		<-done
		return err
	}
	if err != nil {
		return fmt.Errorf("worker: Init: waiting for the parameters of a joining worker: %w", err)
	}
	w.mu.Lock()
	copies, err := w.c.paramsTake(keys, data, byteLens)
	w.mu.Unlock()
	if err != nil {
		return fmt.Errorf("worker: Init: %w", err)
	}
	for _, c := range copies {
		copyPreemptible(c.dst, c.src)
	}
	kept, err := mapKept(len(data))
	if err != nil {
		return fmt.Errorf("worker: Init: keeping the initial values: %w", err)
	}
	copyPreemptible(kept, data)
	w.update(func(c *core) todo { return c.keepInitial(keys, kept, byteLens) })
	return nil
}
