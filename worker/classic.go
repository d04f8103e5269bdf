package worker

import "github.com/fptps/fpt/frame"

// The shell of ps-lite's classic calls (the core's half is in
// classic_core.go): Push, Pull and PushPull over keys sliced by range
// across the servers, each reply settling its request.

// kvRequest sends a classic request of type typ; out receives the values
// of a Pull or PushPull.
func (w *Worker) kvRequest(typ frame.Type, keys []uint64, data, out []byte, byteLens []int, dtype frame.DType, cb Callback) (int, error) {
	w.mu.Lock()
	t, err := w.c.kvRequest(typ, keys, data, out, byteLens, dtype, newCall(cb, typ != frame.KVPush))
	w.mu.Unlock()
	if err != nil {
		return 0, err
	}
	w.do(t)
	return t.req.ts, nil
}

// handleKV takes a server's reply to a classic request; a KVData payload
// is copied into the caller's buffer outside the lock.
func (w *Worker) handleKV(h *frame.Header, payload []byte) error {
	w.mu.Lock()
	span, t, err := w.c.kvReply(h, payload)
	w.mu.Unlock()
	if err != nil {
		return err
	}
	if h.Type == frame.KVData {
		copy(span, payload)
		t = w.landKV(h)
	}
	w.do(t)
	return nil
}

// PullRangeBytes asks the servers for every classic key they hold in
// [from, to) (to 0: no upper bound) of dtype; out has them, in key order,
// once the request completes (Wait, or cb).
func (w *Worker) PullRangeBytes(from, to uint64, dtype frame.DType, out *RangeResult, cb Callback) (int, error) {
	w.mu.Lock()
	t, err := w.c.pullRange(from, to, dtype, w.node.Config().MaxFrameBytes, out, newCall(cb, true))
	w.mu.Unlock()
	if err != nil {
		return 0, err
	}
	w.do(t)
	return t.req.ts, nil
}

func (w *Worker) landKV(h *frame.Header) effects {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.c.kvLanded(h)
}
