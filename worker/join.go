package worker

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/node"
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

// maxRefusal bounds a refusal's text; minRefusal is the least a frame of
// a partition may carry (van.lengthBound's floor).
const maxRefusal, minRefusal = 1024, 16

// sendParams carries out a parameters duty: it asks the program for each
// key's parameters and sends them to the joining workers, or why not.
func (w *Worker) sendParams(d *paramsDuty) {
	w.mu.Lock()
	src := w.params
	w.mu.Unlock()
	log := w.node.Logger()
	var msgs []frame.Message
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
			msgs = append(msgs, frame.Message{
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
func (w *Worker) paramsFrames(src ParamsSource, d *paramsDuty) ([]frame.Message, error) {
	partBytes := w.node.Config().PartitionBytes
	var msgs []frame.Message
	for _, t := range d.keys {
		buf := make([]byte, t.bytes)
		if err := src(d.iter, t.key, buf); err != nil {
			return nil, fmt.Errorf("the parameters source failed for key %d of iteration %d: %w", t.key, d.iter, err)
		}
		for idx, span := range frame.Chunks(t.bytes, partBytes, t.dtype.Size()) {
			for _, to := range d.to {
				msgs = append(msgs, frame.Message{
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

// paramsBuffer is PayloadBuffer for a Params frame: the span of its key's
// receive buffer, mapped on its first frame, or nil.
func (w *Worker) paramsBuffer(h *frame.Header) []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.node.Joined() {
		w.c.joining() // the frame may come a moment before Start marks the core
	}
	span, need := w.c.paramsSink(h)
	if need == 0 {
		return span
	}
	mem, err := mapKept(int(need))
	if err != nil {
		w.node.Logger().Warn("no buffer to read a joining worker's parameters into; copying them", "key", h.Key, "err", err)
		return nil
	}
	span, unwanted := w.c.paramsBuffer(h, mem)
	if err := unmapKept(unwanted); err != nil {
		w.node.Logger().Warn("unmapping a parameters buffer", "err", err)
	}
	return span
}

// handleParams takes a Params frame on a joining worker: read in place
// into its key's receive buffer, or still in the van's, which is reused
// after the call.
func (w *Worker) handleParams(h *frame.Header, payload []byte, inPlace bool) error {
	data := payload
	if !inPlace {
		data = slices.Clone(payload)
	}
	w.mu.Lock()
	if w.node.Joined() {
		w.c.joining() // the frame may come a moment before Start marks the core
	}
	t, err := w.c.params(h, data, !inPlace)
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
	var t effects
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
		w.update(func(c *core) effects { return c.cancelParams(ts, err) })
		<-done
		return err
	}
	if err != nil {
		return fmt.Errorf("worker: Init: waiting for the parameters of a joining worker: %w", err)
	}
	w.mu.Lock()
	copies, kept, err := w.c.paramsTake(keys, data, byteLens)
	w.mu.Unlock()
	if err != nil {
		return fmt.Errorf("worker: Init: %w", err)
	}
	for _, c := range copies {
		copyPreemptible(c.dst, c.src)
	}
	// The values read into receive buffers stay there as the keys'
	// values after Init; the others are copied to be kept.
	inBuf := make(map[uint64]bool, len(kept))
	for _, k := range kept {
		if !k.keep {
			if err := unmapKept(k.mem); err != nil {
				w.node.Logger().Warn("unmapping a parameters buffer", "err", err)
			}
			continue
		}
		inBuf[k.key] = true
		w.update(func(c *core) effects { return c.keepInitial([]uint64{k.key}, k.mem, []int{len(k.mem)}) })
	}
	off := 0
	for i, k := range keys {
		span := data[off : off+byteLens[i]]
		off += byteLens[i]
		if inBuf[k] {
			continue
		}
		if err := w.keepInit([]uint64{k}, span, byteLens[i:i+1]); err != nil {
			return err
		}
	}
	return nil
}
