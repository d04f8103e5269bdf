package capi

import (
	"math"
	"unsafe"
)

// Tensors is the argument list of fpt_push, fpt_pull and fpt_init as Go
// slices: Lens[i] bytes of Data belong to Keys[i], end to end.
type Tensors struct {
	Keys []uint64
	Lens []int
	Data []byte
}

// maxKeys bounds a call's key count before any slice is made from it: far
// above any model's tensor count, far below what would overflow a length.
const maxKeys = 1 << 24

// View checks the pointers and lengths of a C call and views the caller's
// memory as Go slices, without copying: keys and lens are arrays of n
// uint64, vals holds the sum of lens bytes. Any of them may be NULL when n
// (or the byte total) is zero. Only Lens is copied (to Go ints).
//
// The slices alias C memory, which Go's garbage collector neither moves
// nor frees: they stay valid as long as the caller keeps the memory, which
// fpt.h requires until the request completes. No Go pointer goes the other
// way, so there is nothing to pin.
func View(op string, keys unsafe.Pointer, n uint64, vals unsafe.Pointer, lens unsafe.Pointer) (Tensors, error) {
	if n == 0 {
		return Tensors{}, nil
	}
	switch {
	case n > maxKeys:
		return Tensors{}, fail(CodeArg, op, "%d keys in one call (at most %d)", n, maxKeys)
	case keys == nil:
		return Tensors{}, fail(CodeArg, op, "keys is NULL, num_keys is %d", n)
	case lens == nil:
		return Tensors{}, fail(CodeArg, op, "lens is NULL, num_keys is %d", n)
	}
	t := Tensors{
		Keys: unsafe.Slice((*uint64)(keys), n),
		Lens: make([]int, n),
	}
	var total uint64
	for i, b := range unsafe.Slice((*uint64)(lens), n) {
		if b > math.MaxInt || total+b > math.MaxInt {
			return Tensors{}, fail(CodeSize, op, "key %d: %d bytes overflows the call's total", t.Keys[i], b)
		}
		t.Lens[i] = int(b)
		total += b
	}
	if total > 0 {
		if vals == nil {
			return Tensors{}, fail(CodeArg, op, "vals is NULL with %d bytes to carry", total)
		}
		if total > math.MaxUint64-uint64(uintptr(vals)) {
			// unsafe.Slice would panic: the lengths cannot describe real memory.
			return Tensors{}, fail(CodeSize, op, "%d bytes at %p run past the end of the address space", total, vals)
		}
		t.Data = unsafe.Slice((*byte)(vals), total)
	}
	return t, nil
}

// Segment views one segment of a C message (fpt_segment i: bytes at
// data) as a Go slice, without copying: data may be NULL only when bytes
// is 0, and bytes may not run past the address space. Sending copies it.
func Segment(op string, i int, data unsafe.Pointer, bytes uint64) ([]byte, error) {
	switch {
	case bytes == 0:
		return nil, nil
	case data == nil:
		return nil, fail(CodeArg, op, "segment %d: data is NULL with %d bytes", i, bytes)
	case bytes > math.MaxInt || bytes > math.MaxUint64-uint64(uintptr(data)):
		return nil, fail(CodeSize, op, "segment %d: %d bytes at %p run past the end of the address space", i, bytes, data)
	}
	return unsafe.Slice((*byte)(data), bytes), nil
}
