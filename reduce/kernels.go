// Package reduce is the arithmetic of aggregation: it sums the workers'
// contributions to a tensor partition.
//
// In FPT every partition of every tensor has one aggregator (a server or a
// worker, chosen by the LB decision). Each iteration the aggregator receives
// exactly one contribution per worker, adds them up and broadcasts the sum.
// That summation is the system's hot loop, so this package keeps it apart
// from all I/O:
//
//   - Add and the typed kernels (AddFloat32, AddFloat64, AddFloat16,
//     AddBFloat16) do dst += src on payload bytes in place, unrolled and
//     allocation-free; 16-bit values are added in float32 and rounded once;
//   - Table does the bookkeeping: which workers have contributed to which
//     (key, partition, iteration), checking every contribution against the
//     first, and recycling the sum buffers so that a steady training loop
//     allocates nothing.
//
// Nothing here starts goroutines, touches sockets or takes locks: the caller
// (one goroutine per node) serializes access, as with the pool and the LB
// decision arithmetic.
package reduce

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"

	"github.com/fptps/fpt/frame"
)

// Add adds src into dst elementwise (dst[i] += src[i]), both holding
// little-endian elements of type dt. It fails, leaving dst untouched, if dt
// is unknown, the lengths differ, or the length is not a multiple of the
// element size. It does not allocate.
//
// When the machine is little-endian and both slices are aligned for the
// element type, the bytes are summed in place as a typed slice; otherwise
// each element is decoded, summed and re-encoded.
func Add(dt frame.DType, dst, src []byte) error {
	es := dt.Size()
	if es == 0 {
		return fmt.Errorf("aggregator: add: unknown dtype %s", dt)
	}
	if len(dst) != len(src) {
		return fmt.Errorf("aggregator: add %s: dst has %d bytes, src %d", dt, len(dst), len(src))
	}
	if len(dst)%es != 0 {
		return fmt.Errorf("aggregator: add %s: %d bytes is not a whole number of %d-byte elements", dt, len(dst), es)
	}
	if len(dst) == 0 {
		return nil
	}
	switch dt {
	case frame.Float32:
		if d, ok := asFloat32(dst); ok {
			if s, ok := asFloat32(src); ok {
				AddFloat32(d, s)
				return nil
			}
		}
		addFloat32Bytes(dst, src)
	case frame.Float64:
		if d, ok := asFloat64(dst); ok {
			if s, ok := asFloat64(src); ok {
				AddFloat64(d, s)
				return nil
			}
		}
		addFloat64Bytes(dst, src)
	case frame.Float16:
		if d, ok := asUint16(dst); ok {
			if s, ok := asUint16(src); ok {
				AddFloat16(d, s)
				return nil
			}
		}
		addHalfBytes(dst, src, Float16ToFloat32, Float32ToFloat16)
	case frame.BFloat16:
		if d, ok := asUint16(dst); ok {
			if s, ok := asUint16(src); ok {
				AddBFloat16(d, s)
				return nil
			}
		}
		addHalfBytes(dst, src, BFloat16ToFloat32, Float32ToBFloat16)
	}
	return nil
}

// asFloat32 views b (non-empty) as []float32 when that is legal: the machine
// is little-endian and b is 4-byte aligned.
func asFloat32(b []byte) ([]float32, bool) {
	p := unsafe.Pointer(unsafe.SliceData(b))
	if !nativeLittleEndian || uintptr(p)%unsafe.Alignof(float32(0)) != 0 {
		return nil, false
	}
	return unsafe.Slice((*float32)(p), len(b)/4), true
}

// asFloat64 views b (non-empty) as []float64 when it is little-endian and
// 8-byte aligned.
func asFloat64(b []byte) ([]float64, bool) {
	p := unsafe.Pointer(unsafe.SliceData(b))
	if !nativeLittleEndian || uintptr(p)%unsafe.Alignof(float64(0)) != 0 {
		return nil, false
	}
	return unsafe.Slice((*float64)(p), len(b)/8), true
}

// asUint16 views b (non-empty) as []uint16 when it is little-endian and
// 2-byte aligned.
func asUint16(b []byte) ([]uint16, bool) {
	p := unsafe.Pointer(unsafe.SliceData(b))
	if !nativeLittleEndian || uintptr(p)%unsafe.Alignof(uint16(0)) != 0 {
		return nil, false
	}
	return unsafe.Slice((*uint16)(p), len(b)/2), true
}

// AddFloat32 adds src into dst elementwise. It panics if the lengths differ.
func AddFloat32(dst, src []float32) { addFloats("AddFloat32", dst, src) }

// AddFloat64 adds src into dst elementwise. It panics if the lengths differ.
func AddFloat64(dst, src []float64) { addFloats("AddFloat64", dst, src) }

// addFloats is the float32 and float64 kernel: unrolled by eight, with
// fixed-length subslices so that the compiler drops the bounds checks.
// (float32 and float64 have different GC shapes, so each gets its own
// compiled body: the generic costs nothing.)
func addFloats[T float32 | float64](name string, dst, src []T) {
	if len(src) != len(dst) {
		panic(fmt.Sprintf("aggregator: %s: len(dst)=%d != len(src)=%d", name, len(dst), len(src)))
	}
	for len(dst) >= 8 && len(src) >= 8 {
		d, s := dst[:8:8], src[:8:8]
		d[0] += s[0]
		d[1] += s[1]
		d[2] += s[2]
		d[3] += s[3]
		d[4] += s[4]
		d[5] += s[5]
		d[6] += s[6]
		d[7] += s[7]
		dst, src = dst[8:], src[8:]
	}
	src = src[:len(dst)]
	for i := range dst {
		dst[i] += src[i]
	}
}

// AddFloat16 adds src into dst elementwise, both holding IEEE 754 binary16
// bit patterns: each pair is widened to float32, added, and rounded back to
// the nearest half (ties to even), which is the correctly rounded half sum.
// It panics if the lengths differ.
func AddFloat16(dst, src []uint16) {
	if len(src) != len(dst) {
		panic(fmt.Sprintf("aggregator: AddFloat16: len(dst)=%d != len(src)=%d", len(dst), len(src)))
	}
	for len(dst) >= 4 && len(src) >= 4 {
		d, s := dst[:4:4], src[:4:4]
		d[0] = Float32ToFloat16(Float16ToFloat32(d[0]) + Float16ToFloat32(s[0]))
		d[1] = Float32ToFloat16(Float16ToFloat32(d[1]) + Float16ToFloat32(s[1]))
		d[2] = Float32ToFloat16(Float16ToFloat32(d[2]) + Float16ToFloat32(s[2]))
		d[3] = Float32ToFloat16(Float16ToFloat32(d[3]) + Float16ToFloat32(s[3]))
		dst, src = dst[4:], src[4:]
	}
	src = src[:len(dst)]
	for i := range dst {
		dst[i] = Float32ToFloat16(Float16ToFloat32(dst[i]) + Float16ToFloat32(src[i]))
	}
}

// AddBFloat16 adds src into dst elementwise, both holding bfloat16 bit
// patterns: each pair is widened to float32, added, and rounded back to the
// nearest bfloat16 (ties to even), the correctly rounded bfloat16 sum. It
// panics if the lengths differ.
func AddBFloat16(dst, src []uint16) {
	if len(src) != len(dst) {
		panic(fmt.Sprintf("aggregator: AddBFloat16: len(dst)=%d != len(src)=%d", len(dst), len(src)))
	}
	for len(dst) >= 4 && len(src) >= 4 {
		d, s := dst[:4:4], src[:4:4]
		d[0] = Float32ToBFloat16(BFloat16ToFloat32(d[0]) + BFloat16ToFloat32(s[0]))
		d[1] = Float32ToBFloat16(BFloat16ToFloat32(d[1]) + BFloat16ToFloat32(s[1]))
		d[2] = Float32ToBFloat16(BFloat16ToFloat32(d[2]) + BFloat16ToFloat32(s[2]))
		d[3] = Float32ToBFloat16(BFloat16ToFloat32(d[3]) + BFloat16ToFloat32(s[3]))
		dst, src = dst[4:], src[4:]
	}
	src = src[:len(dst)]
	for i := range dst {
		dst[i] = Float32ToBFloat16(BFloat16ToFloat32(dst[i]) + BFloat16ToFloat32(src[i]))
	}
}

// The byte-wise paths: for misaligned slices or big-endian machines. The
// caller has checked that len(dst) == len(src) and is a multiple of the
// element size.

func addFloat32Bytes(dst, src []byte) {
	le := binary.LittleEndian
	for len(dst) >= 4 && len(src) >= 4 {
		sum := math.Float32frombits(le.Uint32(dst)) + math.Float32frombits(le.Uint32(src))
		le.PutUint32(dst, math.Float32bits(sum))
		dst, src = dst[4:], src[4:]
	}
}

func addFloat64Bytes(dst, src []byte) {
	le := binary.LittleEndian
	for len(dst) >= 8 && len(src) >= 8 {
		sum := math.Float64frombits(le.Uint64(dst)) + math.Float64frombits(le.Uint64(src))
		le.PutUint64(dst, math.Float64bits(sum))
		dst, src = dst[8:], src[8:]
	}
}

func addHalfBytes(dst, src []byte, widen func(uint16) float32, narrow func(float32) uint16) {
	le := binary.LittleEndian
	for len(dst) >= 2 && len(src) >= 2 {
		le.PutUint16(dst, narrow(widen(le.Uint16(dst))+widen(le.Uint16(src))))
		dst, src = dst[2:], src[2:]
	}
}
