package worker

import (
	"context"
	"fmt"
	"unsafe"

	"github.com/fptps/fpt/frame"
)

// Float is an element type KV can carry.
type Float interface{ ~float32 | ~float64 }

// KV is the typed face of a Worker for one element type, like ps-lite's
// KVWorker<Val>. Values are laid end to end in one slice; lens[i] is the
// number of elements of keys[i] (nil: the values split evenly over the keys).
// Every call that returns a timestamp is asynchronous: vals must stay
// untouched (pushes) or unread (pulls) until Wait(ts) returns or cb runs;
// cb, if set, runs once with the request's error (see Callback).
type KV[T Float] struct {
	w     *Worker
	dtype frame.DType
}

// NewKV returns w's typed face for T.
func NewKV[T Float](w *Worker) *KV[T] {
	d := frame.Float32
	if unsafe.Sizeof(T(0)) == 8 {
		d = frame.Float64
	}
	return &KV[T]{w: w, dtype: d}
}

// Worker is the worker underneath.
func (kv *KV[T]) Worker() *Worker { return kv.w }

// Declare declares a tensor: its key, its number of elements and its
// priority (larger is more urgent; MXNet uses minus the layer index). Every
// worker must declare the same tensors before any of them pushes.
func (kv *KV[T]) Declare(key uint64, elems int, priority int32) error {
	if elems < 0 {
		return fmt.Errorf("worker: Declare(%d): negative size %d", key, elems)
	}
	return kv.w.declare(key, kv.dtype, uint64(elems)*uint64(kv.dtype.Size()), priority)
}

// FPTPush pushes one iteration's values of keys: each aggregator sums the
// workers' contributions and sends the sum to every worker. cb, if set,
// runs once the values have been sent (vals is free again), or the push
// failed. With the LB on,
// a push of an iteration beyond the horizon the scheduler has granted waits
// for the grant (normally already there: the horizon runs two iterations
// ahead of the slowest worker); like a full send pool, this blocks.
func (kv *KV[T]) FPTPush(keys []uint64, vals []T, lens []int, priority int32, cb Callback) (int, error) {
	byteLens, err := kv.byteLens(keys, vals, lens)
	if err != nil {
		return 0, err
	}
	return kv.w.fptPush(keys, AsBytes(vals), byteLens, kv.dtype, priority, cb)
}

// FPTPull copies the keys' sums for the next iteration into vals, once
// they have arrived. cb, if set, runs when vals holds them, or the pull
// failed. Between Init and the keys' next push it copies the values Init
// left instead (MXNet broadcasts a parameter by init, then pull).
func (kv *KV[T]) FPTPull(keys []uint64, vals []T, lens []int, cb Callback) (int, error) {
	byteLens, err := kv.byteLens(keys, vals, lens)
	if err != nil {
		return 0, err
	}
	return kv.w.fptPull(keys, AsBytes(vals), byteLens, kv.dtype, cb)
}

// FPTPushPull is FPTPush of vals followed by FPTPull into outs (vals'
// size; it may be vals itself, as in an in-place all-reduce), as one
// request: cb runs, and Wait returns, once vals is free again and outs
// holds the sums. Made in one step, the pull waits before any of the
// push's frames leave, so every partition of the sums is read once,
// straight into outs; an FPTPull made after its FPTPush returned finds
// the partitions that arrived in between staged, and copies them.
func (kv *KV[T]) FPTPushPull(keys []uint64, vals, outs []T, lens []int, priority int32, cb Callback) (int, error) {
	byteLens, err := kv.byteLens(keys, vals, lens)
	if err != nil {
		return 0, err
	}
	if len(outs) != len(vals) {
		return 0, fmt.Errorf("worker: FPTPushPull: %d outputs for %d values: %w", len(outs), len(vals), ErrSizeMismatch)
	}
	return kv.w.fptPushPull(keys, AsBytes(vals), AsBytes(outs), byteLens, kv.dtype, priority, cb)
}

// Broadcast is Init for keys that no iteration pushes again: a model's
// buffers, an optimizer's state, parameters a program updates itself.
// Every worker gets worker 0's vals; the iterations after it complete
// without these keys (retries and a lost worker's re-sums wait for every
// key an iteration pushes), and pushing one of them is an error.
func (kv *KV[T]) Broadcast(ctx context.Context, keys []uint64, vals []T, lens []int) error {
	byteLens, err := kv.byteLens(keys, vals, lens)
	if err != nil {
		return err
	}
	return kv.w.broadcast(ctx, keys, AsBytes(vals), byteLens, kv.dtype)
}

// Init sets the keys' starting values on every worker to worker 0's vals
// (MXNet's kvstore init): it must be the keys' first push. It is collective:
// every worker calls it with the same keys, and it returns once every worker
// holds the value, between two barriers over the workers.
func (kv *KV[T]) Init(ctx context.Context, keys []uint64, vals []T, lens []int) error {
	byteLens, err := kv.byteLens(keys, vals, lens)
	if err != nil {
		return err
	}
	return kv.w.initBytes(ctx, keys, AsBytes(vals), byteLens, kv.dtype)
}

// Push adds vals into the servers' stored values of keys (ps-lite's Push;
// keys sorted, sliced by range over the servers).
func (kv *KV[T]) Push(keys []uint64, vals []T, lens []int, cb Callback) (int, error) {
	byteLens, err := kv.byteLens(keys, vals, lens)
	if err != nil {
		return 0, err
	}
	return kv.w.kvRequest(frame.KVPush, keys, AsBytes(vals), nil, byteLens, kv.dtype, cb)
}

// Pull copies the servers' stored values of keys into vals (ps-lite's Pull).
func (kv *KV[T]) Pull(keys []uint64, vals []T, lens []int, cb Callback) (int, error) {
	byteLens, err := kv.byteLens(keys, vals, lens)
	if err != nil {
		return 0, err
	}
	b := AsBytes(vals)
	return kv.w.kvRequest(frame.KVPull, keys, b, b, byteLens, kv.dtype, cb)
}

// PushPull adds vals into the stored values and copies the new values into
// outs, in one round trip (ps-lite's PushPull).
func (kv *KV[T]) PushPull(keys []uint64, vals, outs []T, lens []int, cb Callback) (int, error) {
	byteLens, err := kv.byteLens(keys, vals, lens)
	if err != nil {
		return 0, err
	}
	if len(outs) != len(vals) {
		return 0, fmt.Errorf("worker: PushPull: %d outputs for %d values", len(outs), len(vals))
	}
	return kv.w.kvRequest(frame.KVPushPull, keys, AsBytes(vals), AsBytes(outs), byteLens, kv.dtype, cb)
}

// PullRange returns every classic key the servers hold in [from, to) (to
// 0: no upper bound), in key order, with its values and their lengths (in
// elements): a sparse model's keys need not be known to be pulled. It
// waits for the answer; a key of another dtype fails it.
func (kv *KV[T]) PullRange(from, to uint64) (keys []uint64, vals []T, lens []int, err error) {
	var out RangeResult
	ts, err := kv.w.PullRangeBytes(from, to, kv.dtype, &out, nil)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := kv.w.Wait(ts); err != nil {
		return nil, nil, nil, err
	}
	es, total := kv.dtype.Size(), 0
	lens = make([]int, len(out.Values))
	for i, v := range out.Values {
		lens[i] = len(v) / es
		total += lens[i]
	}
	vals = make([]T, total)
	b := AsBytes(vals)
	for _, v := range out.Values {
		b = b[copy(b, v):]
	}
	return out.Keys, vals, lens, nil
}

// Wait blocks until request ts completes; see Worker.Wait.
func (kv *KV[T]) Wait(ts int) error { return kv.w.Wait(ts) }

func (kv *KV[T]) byteLens(keys []uint64, vals []T, lens []int) ([]int, error) {
	size := kv.dtype.Size()
	out := make([]int, len(keys))
	if lens == nil {
		if len(keys) == 0 {
			if len(vals) != 0 {
				return nil, fmt.Errorf("worker: %d values for no keys", len(vals))
			}
			return out, nil
		}
		if len(vals)%len(keys) != 0 {
			return nil, fmt.Errorf("worker: %d values do not split evenly over %d keys; pass lens", len(vals), len(keys))
		}
		for i := range out {
			out[i] = len(vals) / len(keys) * size
		}
		return out, nil
	}
	if len(lens) != len(keys) {
		return nil, fmt.Errorf("worker: %d lens for %d keys", len(lens), len(keys))
	}
	total := 0
	for i, n := range lens {
		if n < 0 {
			return nil, fmt.Errorf("worker: key %d: negative length %d", keys[i], n)
		}
		out[i] = n * size
		total += n
	}
	if total != len(vals) {
		return nil, fmt.Errorf("worker: lens add up to %d elements, vals has %d", total, len(vals))
	}
	return out, nil
}

// AsBytes views a float slice as its bytes, without copying, in this
// machine's byte order: what KV sends (the van sends the caller's memory
// as it is), and what a ParamsSource copies a key's parameters from.
func AsBytes[T Float](v []T) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), len(v)*int(unsafe.Sizeof(v[0])))
}
