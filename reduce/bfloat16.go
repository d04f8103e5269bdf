package reduce

import (
	"encoding/binary"
	"math"

	"github.com/fptps/fpt/frame"
)

// bfloat16 is the top half of a float32: 1 sign bit, 8 exponent bits (bias
// 127, float32's range) and 7 fraction bits. Widening is a shift; narrowing
// rounds the dropped 16 bits to nearest, ties to even. As with halves,
// float32 has enough precision (24 >= 2*8+2 bits) that adding two widened
// bfloat16s and rounding the float32 sum once gives the correctly rounded
// bfloat16 sum.

// BFloat16ToFloat32 widens the bfloat16 value with bit pattern h to float32
// (exactly: every bfloat16 is a float32).
func BFloat16ToFloat32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// Float32ToBFloat16 narrows f to the nearest bfloat16, ties to even, and
// returns its bit pattern. Values beyond the largest bfloat16 round to
// infinity as IEEE 754 says (the carry runs into the exponent), subnormals
// round like any other value, and NaN stays NaN (made quiet, sign and top
// payload bits kept) rather than rounding into infinity.
func Float32ToBFloat16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

// isHalf says whether dt is one of the 16-bit types that are summed in
// float32.
func isHalf(dt frame.DType) bool { return dt == frame.Float16 || dt == frame.BFloat16 }

// halfConv is dt's pair of conversions (dt 16-bit).
func halfConv(dt frame.DType) (func(uint16) float32, func(float32) uint16) {
	if dt == frame.BFloat16 {
		return BFloat16ToFloat32, Float32ToBFloat16
	}
	return Float16ToFloat32, Float32ToFloat16
}

// widenInto sets acc to the 16-bit little-endian values of dt in src
// (len(acc) == len(src)/2).
func widenInto(dt frame.DType, acc []float32, src []byte) {
	if s, ok := asUint16(src); ok && len(s) == len(acc) {
		if dt == frame.BFloat16 {
			for i, h := range s {
				acc[i] = BFloat16ToFloat32(h)
			}
			return
		}
		for i, h := range s {
			acc[i] = Float16ToFloat32(h)
		}
		return
	}
	widen, _ := halfConv(dt)
	le := binary.LittleEndian
	for i := range acc {
		acc[i] = widen(le.Uint16(src[2*i:]))
	}
}

// addWidened adds the 16-bit values of dt in src into acc.
func addWidened(dt frame.DType, acc []float32, src []byte) {
	if s, ok := asUint16(src); ok && len(s) == len(acc) {
		if dt == frame.BFloat16 {
			for i, h := range s {
				acc[i] += BFloat16ToFloat32(h)
			}
			return
		}
		for i, h := range s {
			acc[i] += Float16ToFloat32(h)
		}
		return
	}
	widen, _ := halfConv(dt)
	le := binary.LittleEndian
	for i := range acc {
		acc[i] += widen(le.Uint16(src[2*i:]))
	}
}

// narrow rounds acc once into dst's 16-bit little-endian values of dt.
func narrow(dt frame.DType, dst []byte, acc []float32) {
	if d, ok := asUint16(dst); ok && len(d) == len(acc) {
		if dt == frame.BFloat16 {
			for i, f := range acc {
				d[i] = Float32ToBFloat16(f)
			}
			return
		}
		for i, f := range acc {
			d[i] = Float32ToFloat16(f)
		}
		return
	}
	_, round := halfConv(dt)
	le := binary.LittleEndian
	for i, f := range acc {
		le.PutUint16(dst[2*i:], round(f))
	}
}

// Narrow rounds the little-endian float32 values in src to the 16-bit type
// dt (Float16 or BFloat16) into dst, which holds half as many bytes: a
// compressed wire's encoding. Typed loops where the slices are aligned
// (the conversions inline there), byte-wise otherwise.
func Narrow(dt frame.DType, dst, src []byte) {
	n := min(len(dst)/2, len(src)/4)
	if n == 0 {
		return
	}
	d, ok1 := asUint16(dst[:2*n])
	s, ok2 := asFloat32(src[:4*n])
	switch {
	case ok1 && ok2 && dt == frame.BFloat16:
		for i, f := range s {
			d[i] = Float32ToBFloat16(f)
		}
	case ok1 && ok2:
		for i, f := range s {
			d[i] = Float32ToFloat16(f)
		}
	default:
		_, round := halfConv(dt)
		le := binary.LittleEndian
		for i := range n {
			le.PutUint16(dst[2*i:], round(math.Float32frombits(le.Uint32(src[4*i:]))))
		}
	}
}

// Widen sets the little-endian float32 values in dst to the 16-bit values
// of dt in src (half as many bytes), exactly.
func Widen(dt frame.DType, dst, src []byte) {
	n := min(len(dst)/4, len(src)/2)
	if n == 0 {
		return
	}
	d, ok1 := asFloat32(dst[:4*n])
	s, ok2 := asUint16(src[:2*n])
	switch {
	case ok1 && ok2 && dt == frame.BFloat16:
		for i, h := range s {
			d[i] = BFloat16ToFloat32(h)
		}
	case ok1 && ok2:
		for i, h := range s {
			d[i] = Float16ToFloat32(h)
		}
	default:
		widen, _ := halfConv(dt)
		le := binary.LittleEndian
		for i := range n {
			le.PutUint32(dst[4*i:], math.Float32bits(widen(le.Uint16(src[2*i:]))))
		}
	}
}
