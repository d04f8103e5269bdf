package worker

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/node"
)

// The byte-level API: for callers that hold tensors as raw memory of a
// declared element type rather than as Go float slices, such as the C
// library (package capi), which hands C buffers straight through. Lengths
// are in bytes; a call's dtype is its keys' declared one.

// Errors the byte-level calls wrap, so that a caller can tell a bad key or
// size from other failures (the C library maps them to its status codes).
var (
	ErrNotDeclared    = errors.New("key is not declared")
	ErrSizeMismatch   = errors.New("size does not match the declaration")
	ErrPullBeforePush = errors.New("pull of an iteration this worker has not pushed")
)

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
	w.mu.Lock()
	t := w.tensors[key]
	w.mu.Unlock()
	// Checked here, ahead of declare, only to wrap the sentinel; declare
	// checks again under its own lock.
	if t != nil && (t.dtype != dtype || t.bytes != bytes) {
		return fmt.Errorf("worker: key %d is already declared as %d bytes of %s: %w", key, t.bytes, t.dtype, ErrSizeMismatch)
	}
	return w.declare(key, dtype, bytes, priority)
}

// FPTPushBytes is FPTPush on raw memory: byteLens[i] bytes of data belong
// to keys[i], and every key must have been declared with that size and one
// dtype. data must stay untouched until the request completes.
func (w *Worker) FPTPushBytes(keys []uint64, data []byte, byteLens []int, priority int32, cb func()) (int, error) {
	dtype, err := w.checkBytes(keys, data, byteLens, false)
	if err != nil {
		return 0, err
	}
	return w.fptPush(keys, data, byteLens, dtype, priority, cb)
}

// FPTPullBytes is FPTPull on raw memory: the keys' sums for their next
// iteration land in data, laid out as in FPTPushBytes.
func (w *Worker) FPTPullBytes(keys []uint64, data []byte, byteLens []int, cb func()) (int, error) {
	dtype, err := w.checkBytes(keys, data, byteLens, true)
	if err != nil {
		return 0, err
	}
	return w.fptPull(keys, data, byteLens, dtype, cb)
}

// InitBytes is KV.Init on raw memory: collective, worker 0's values win and
// land in data on every worker.
func (w *Worker) InitBytes(ctx context.Context, keys []uint64, data []byte, byteLens []int) error {
	dtype, err := w.checkBytes(keys, data, byteLens, false)
	if err != nil {
		return err
	}
	return w.initBytes(ctx, keys, data, byteLens, dtype)
}

// initBytes makes the keys' first push worker 0's values, between two
// barriers over the workers, and pulls them into data.
func (w *Worker) initBytes(ctx context.Context, keys []uint64, data []byte, byteLens []int, dtype frame.DType) error {
	// The first barrier makes sure every worker declared the keys before
	// worker 0's values reach them.
	if err := w.Barrier(ctx, node.WorkerGroup); err != nil {
		return err
	}
	w.mu.Lock()
	for _, k := range keys {
		if t := w.tensors[k]; t != nil && t.pushed > 0 {
			w.mu.Unlock()
			return fmt.Errorf("worker: Init: key %d was pushed already", k)
		}
	}
	w.mu.Unlock()
	ts, err := w.fptPush(keys, data, byteLens, dtype, 0, nil)
	if err != nil {
		return err
	}
	if err := w.Wait(ts); err != nil {
		return err
	}
	if ts, err = w.fptPull(keys, data, byteLens, dtype, nil); err != nil {
		return err
	}
	if err := w.Wait(ts); err != nil {
		return err
	}
	return w.Barrier(ctx, node.WorkerGroup)
}

// checkBytes checks a byte-level call against the declarations and
// returns the keys' dtype. The worker checks again when it splits the
// call; this pass exists to name the fault with a sentinel error.
func (w *Worker) checkBytes(keys []uint64, data []byte, byteLens []int, pull bool) (frame.DType, error) {
	if len(byteLens) != len(keys) {
		return 0, fmt.Errorf("worker: %d lengths for %d keys", len(byteLens), len(keys))
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.ready {
		return 0, errors.New("worker: not started")
	}
	var dtype frame.DType
	total := 0
	for i, k := range keys {
		t := w.tensors[k]
		switch {
		case t == nil:
			return 0, fmt.Errorf("worker: key %d: %w", k, ErrNotDeclared)
		case byteLens[i] < 0 || uint64(byteLens[i]) != t.bytes:
			return 0, fmt.Errorf("worker: key %d is declared as %d bytes, the call gives %d: %w", k, t.bytes, byteLens[i], ErrSizeMismatch)
		case i > 0 && t.dtype != dtype:
			return 0, fmt.Errorf("worker: key %d is %s, key %d is %s: one call carries one dtype", keys[0], dtype, k, t.dtype)
		case pull && t.pulled >= t.pushed:
			return 0, fmt.Errorf("worker: key %d, iteration %d: %w", k, t.pulled, ErrPullBeforePush)
		}
		dtype = t.dtype
		total += byteLens[i]
	}
	if total != len(data) {
		return 0, fmt.Errorf("worker: lengths add up to %d bytes, the values have %d: %w", total, len(data), ErrSizeMismatch)
	}
	return dtype, nil
}
