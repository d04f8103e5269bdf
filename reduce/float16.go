package reduce

import "math"

// IEEE 754 binary16 ("half") has 1 sign bit, 5 exponent bits (bias 15) and
// 10 fraction bits. Go has no float16 type, so halves travel as their bit
// patterns (uint16) and are widened to float32 for arithmetic. Every half is
// exactly representable as a float32, and float32 has enough precision
// (24 >= 2*11+2 bits) that adding two widened halves and rounding the float32
// sum back to a half gives the correctly rounded half sum: no double-rounding
// error.
//
// Both conversions are written to be small enough for the compiler to inline
// into the summation loop, with few and predictable branches: they lean on
// exact float32 arithmetic (a multiplication by a power of two, an addition
// that rounds to nearest even) instead of case analysis. The tests check
// them exhaustively against a plain case-by-case implementation.

// Float16ToFloat32 widens the binary16 value with bit pattern h to float32.
// The conversion is exact. Subnormal halves become normal float32s, infinities
// stay infinities and NaNs stay NaNs (sign and payload preserved).
func Float16ToFloat32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	if h&0x7c00 == 0x7c00 { // infinity or NaN
		return math.Float32frombits(sign | 0x7f800000 | uint32(h&0x3ff)<<13)
	}
	// Placing the half's exponent and fraction at the top of a float32's
	// gives the right value scaled by 2^(15-127): a normal half becomes a
	// normal float32, a subnormal half a subnormal float32, zero stays zero.
	// Multiplying by 2^112 (exact) undoes the scaling.
	f := math.Float32frombits(uint32(h&0x7fff)<<13) * 0x1p112
	return math.Float32frombits(math.Float32bits(f) | sign)
}

// Float32ToFloat16 narrows f to the nearest binary16 value, ties to even
// (IEEE 754's default rounding), and returns its bit pattern. Values too large
// for a half become infinity, values too small become (signed) zero or a
// subnormal, and NaN stays NaN (made quiet, sign and top payload bits kept).
func Float32ToFloat16(f float32) uint16 {
	b := math.Float32bits(f)
	x := b & 0x7fffffff // |f|
	// A normal half: adding 0xfff plus the lowest kept bit to the 13
	// dropped bits carries exactly when round-to-nearest-even rounds up
	// (into the exponent if need be), and subtracting 112 rebiases the
	// exponent. The result grows with |f|: clamping it at infinity's bits
	// handles every overflow, including 65520 <= |f| < 65536.
	h := min((x+0xfff+(x>>13)&1-112<<23)>>13, 0x7c00)
	if x < 0x38800000 {
		// |f| < 2^-14: the half is subnormal or zero. Adding 0.5 moves
		// the binary point so that the float32's last fraction bit is
		// worth 2^-24, the half's smallest subnormal: the hardware rounds
		// to nearest even, and the low bits are then the half's (1024
		// meaning the smallest normal, as it should).
		h = math.Float32bits(math.Float32frombits(x)+0.5) - 0x3f000000
	}
	if x > 0x7f800000 { // NaN: made quiet, top payload bits kept
		h = 0x7e00 | x>>13&0x3ff
	}
	return uint16(b>>16)&0x8000 | uint16(h)
}
