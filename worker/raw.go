package worker

import (
	"context"
	"fmt"
	"math"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/node"
	"golang.org/x/sys/unix"
)

// The byte-level API: for callers that hold tensors as raw memory of a
// declared element type rather than as Go float slices, such as the C
// library (package capi), which hands C buffers straight through. Lengths
// are in bytes; a call's dtype is its keys' declared one.

// DeclareBytes declares a tensor of the given size in bytes, a whole
// number of dtype's elements. Declaring a key again with the same size and
// dtype only updates its priority.
func (w *Worker) DeclareBytes(key, bytes uint64, dtype frame.DType, priority int32) error {
	size := dtype.Size()
	if size == 0 {
		return fmt.Errorf("worker: Declare(%d): unknown dtype %d", key, dtype)
	}
	if bytes%uint64(size) != 0 || bytes > math.MaxInt {
		return fmt.Errorf("worker: Declare(%d): %d bytes is not a whole number of %s: %w", key, bytes, dtype, ErrSizeMismatch)
	}
	return w.declare(key, dtype, bytes, priority)
}

// FPTPushBytes is FPTPush on raw memory: byteLens[i] bytes of data belong
// to keys[i], and every key must have been declared with that size and one
// dtype. data must stay untouched until the request completes.
func (w *Worker) FPTPushBytes(keys []uint64, data []byte, byteLens []int, priority int32, cb Callback) (int, error) {
	return w.fptPush(keys, data, byteLens, w.dtypeOf(keys), priority, cb)
}

// FPTPullBytes is FPTPull on raw memory: the keys' sums for their next
// iteration land in data, laid out as in FPTPushBytes.
func (w *Worker) FPTPullBytes(keys []uint64, data []byte, byteLens []int, cb Callback) (int, error) {
	return w.fptPull(keys, data, byteLens, w.dtypeOf(keys), cb)
}

// FPTPushPullBytes is FPTPushPull on raw memory: data is pushed, and the
// sums land in outs (data's size; it may be data itself).
func (w *Worker) FPTPushPullBytes(keys []uint64, data, outs []byte, byteLens []int, priority int32, cb Callback) (int, error) {
	return w.fptPushPull(keys, data, outs, byteLens, w.dtypeOf(keys), priority, cb)
}

// InitBytes is KV.Init on raw memory: collective, worker 0's values win and
// land in data on every worker.
func (w *Worker) InitBytes(ctx context.Context, keys []uint64, data []byte, byteLens []int) error {
	return w.initBytes(ctx, keys, data, byteLens, w.dtypeOf(keys))
}

// BroadcastBytes is KV.Broadcast on raw memory.
func (w *Worker) BroadcastBytes(ctx context.Context, keys []uint64, data []byte, byteLens []int) error {
	return w.broadcast(ctx, keys, data, byteLens, w.dtypeOf(keys))
}

// broadcast is Init, after which no iteration waits for the keys.
func (w *Worker) broadcast(ctx context.Context, keys []uint64, data []byte, byteLens []int, dtype frame.DType) error {
	if err := w.initBytes(ctx, keys, data, byteLens, dtype); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.c.broadcastOnly(keys)
	return nil
}

// initBytes makes the keys' first push worker 0's values, between two
// barriers over the workers, and pulls them into data.
func (w *Worker) initBytes(ctx context.Context, keys []uint64, data []byte, byteLens []int, dtype frame.DType) error {
	if w.node.Joined() {
		return w.initJoined(ctx, keys, data, byteLens, dtype)
	}
	// A bad call fails here, before the barrier, rather than after it.
	w.mu.Lock()
	_, _, err := w.c.split(keys, data, byteLens, dtype)
	w.mu.Unlock()
	if err != nil {
		return fmt.Errorf("worker: Init: %w", err)
	}
	// The first barrier makes sure every worker declared the keys before
	// worker 0's values reach them.
	if err := w.Barrier(ctx, node.WorkerGroup); err != nil {
		return err
	}
	w.mu.Lock()
	err = w.c.unpushed(keys)
	w.mu.Unlock()
	if err != nil {
		return err
	}
	// One request: the pull waits before worker 0's values leave, so
	// they land once, in data, never staged and copied.
	ts, err := w.fptPushPull(keys, data, data, byteLens, dtype, 0, nil)
	if err != nil {
		return err
	}
	if err := w.Wait(ts); err != nil {
		return err
	}
	if err := w.keepInit(keys, data, byteLens); err != nil {
		return err
	}
	return w.Barrier(ctx, node.WorkerGroup)
}

// keepInit keeps the keys' values after Init for a pull that comes
// before their next push; copied here, outside the lock, since data is
// the caller's.
func (w *Worker) keepInit(keys []uint64, data []byte, byteLens []int) error {
	kept, err := mapKept(len(data))
	if err != nil {
		return fmt.Errorf("worker: Init: keeping the initial values: %w", err)
	}
	copyPreemptible(kept, data)
	w.update(func(c *core) effects { return c.keepInitial(keys, kept, byteLens) })
	return nil
}

// dtypeOf is the declared dtype of a byte-level call's keys (see core.dtypeOf).
func (w *Worker) dtypeOf(keys []uint64) frame.DType {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.c.dtypeOf(keys)
}

// mapKept maps n bytes of anonymous memory for Init's kept values. They
// stay outside the Go heap: a model-sized copy on the heap set off a
// garbage collection while the worker received at full rate, and the
// worker then did not run for 30 s (TestBigTensorOver2GiB beside the
// van's 2 GiB test, GODEBUG=gctrace=1: a 43 s mark phase at 8 GiB).
func mapKept(n int) ([]byte, error) {
	if n == 0 {
		return nil, nil
	}
	mem, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, err
	}
	// Huge pages: the copy into fresh memory is mostly page faults, one
	// per 4 KiB page without them (a 64 MiB copy took about 16 times the
	// CPU). Only advice: where the kernel has no transparent huge pages
	// the memory works as well with small ones, so a refusal is ignored.
	_ = unix.Madvise(mem, unix.MADV_HUGEPAGE)
	return mem, nil
}

// unmapKept returns memory from mapKept.
func unmapKept(mem []byte) error {
	if len(mem) == 0 {
		return nil
	}
	return unix.Munmap(mem)
}

// copyChunk bounds one memmove of copyPreemptible.
const copyChunk = 64 << 20

// copyPreemptible copies src into dst in chunks: one memmove of gigabytes
// (seconds, where fresh pages fault in slowly) cannot be preempted, and a
// garbage collection that must stop every goroutine would wait for it with
// the whole process frozen.
func copyPreemptible(dst, src []byte) {
	for len(src) > 0 {
		n := copy(dst, src[:min(len(src), copyChunk)])
		dst, src = dst[n:], src[n:]
	}
}
