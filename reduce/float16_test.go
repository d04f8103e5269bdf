package reduce

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
)

// Known binary16 bit patterns and their exact values.
var halfTable = []struct {
	name string
	bits uint16
	val  float32
}{
	{"zero", 0x0000, 0},
	{"one", 0x3c00, 1},
	{"minus one", 0xbc00, -1},
	{"two", 0x4000, 2},
	{"one third", 0x3555, 0.333251953125},
	{"just below one", 0x3bff, 0.99951171875},
	{"just above one", 0x3c01, 1.0009765625},
	{"max normal", 0x7bff, 65504},
	{"min normal", 0x0400, 0x1p-14},
	{"min subnormal", 0x0001, 0x1p-24},
	{"max subnormal", 0x03ff, 1023 * 0x1p-24},
	{"negative subnormal", 0x8200, -0x1p-15},
	{"pi", 0x4248, 3.140625},
	{"-max", 0xfbff, -65504},
}

func TestFloat16ToFloat32Known(t *testing.T) {
	for _, c := range halfTable {
		if got := Float16ToFloat32(c.bits); got != c.val {
			t.Errorf("%s: Float16ToFloat32(%#04x) = %g, want %g", c.name, c.bits, got, c.val)
		}
	}
	specials := []struct {
		name string
		bits uint16
		want uint32 // float32 bits
	}{
		{"negative zero", 0x8000, 0x80000000},
		{"+inf", 0x7c00, 0x7f800000},
		{"-inf", 0xfc00, 0xff800000},
		{"quiet NaN", 0x7e00, 0x7fc00000},
		{"NaN payload", 0x7c01, 0x7f802000},
		{"negative NaN", 0xfe00, 0xffc00000},
	}
	for _, c := range specials {
		if got := math.Float32bits(Float16ToFloat32(c.bits)); got != c.want {
			t.Errorf("%s: Float16ToFloat32(%#04x) bits = %#08x, want %#08x", c.name, c.bits, got, c.want)
		}
	}
}

func TestFloat32ToFloat16Known(t *testing.T) {
	for _, c := range halfTable {
		if got := Float32ToFloat16(c.val); got != c.bits {
			t.Errorf("%s: Float32ToFloat16(%g) = %#04x, want %#04x", c.name, c.val, got, c.bits)
		}
	}
	rounding := []struct {
		name string
		in   float32
		want uint16
	}{
		{"negative zero", float32(math.Copysign(0, -1)), 0x8000},
		{"+inf", float32(math.Inf(1)), 0x7c00},
		{"-inf", float32(math.Inf(-1)), 0xfc00},
		{"overflow", 1e10, 0x7c00},
		{"negative overflow", -1e10, 0xfc00},
		{"just below the overflow tie", 65519.996, 0x7bff},
		{"overflow tie rounds to inf", 65520, 0x7c00},
		{"tie to even, down", 1 + 0x1p-11, 0x3c00},
		{"tie to even, up", 1 + 3*0x1p-11, 0x3c02},
		{"above tie rounds up", 1 + 0x1p-11 + 0x1p-20, 0x3c01},
		{"below tie rounds down", 1 + 0x1p-11 - 0x1p-22, 0x3c00},
		{"half min subnormal ties to zero", 0x1p-25, 0x0000},
		{"above half min subnormal", 0x1p-25 + 0x1p-35, 0x0001},
		{"1.5 min subnormal ties to even 2", 3 * 0x1p-25, 0x0002},
		{"2.5 min subnormal ties to even 2", 5 * 0x1p-25, 0x0002},
		{"subnormal to min normal tie", 0x1p-14 - 0x1p-25, 0x0400},
		{"underflow", 1e-10, 0x0000},
		{"negative underflow", -1e-10, 0x8000},
		{"float32 subnormal", 1e-40, 0x0000},
		// 2 - 2^-11 lies halfway between 0x3fff (2 - 2^-10) and 0x4000
		// (2): ties to even carries into the exponent.
		{"tie carries into the exponent", 2 - 0x1p-11, 0x4000},
	}
	for _, c := range rounding {
		if got := Float32ToFloat16(c.in); got != c.want {
			t.Errorf("%s: Float32ToFloat16(%g) = %#04x, want %#04x", c.name, c.in, got, c.want)
		}
	}
	for _, nan := range []uint32{0x7fc00000, 0x7f800001, 0xffc00000, 0x7fbfffff} {
		h := Float32ToFloat16(math.Float32frombits(nan))
		if h&0x7c00 != 0x7c00 || h&0x3ff == 0 {
			t.Errorf("Float32ToFloat16(NaN %#08x) = %#04x, not a NaN", nan, h)
		}
		if h>>15 != uint16(nan>>31) {
			t.Errorf("Float32ToFloat16(NaN %#08x) = %#04x lost the sign", nan, h)
		}
	}
}

// TestFloat16RoundTrip checks every half: widening agrees with a reference
// computed with math.Ldexp, and narrowing the widened value gives the same
// bits back (NaNs stay NaNs).
func TestFloat16RoundTrip(t *testing.T) {
	for i := 0; i < 1<<16; i++ {
		h := uint16(i)
		f := Float16ToFloat32(h)
		exp, mant := int(h>>10&0x1f), float64(h&0x3ff)
		var ref float64
		switch exp {
		case 0:
			ref = math.Ldexp(mant, -24)
		case 0x1f:
			if mant != 0 {
				ref = math.NaN()
			} else {
				ref = math.Inf(1)
			}
		default:
			ref = math.Ldexp(1+mant/1024, exp-15)
		}
		if h&0x8000 != 0 {
			ref = -ref
		}
		isNaN := math.IsNaN(ref)
		if isNaN != math.IsNaN(float64(f)) || (!isNaN && float64(f) != ref) || math.Signbit(float64(f)) != (h&0x8000 != 0) {
			t.Fatalf("Float16ToFloat32(%#04x) = %g, want %g", h, f, ref)
		}
		back := Float32ToFloat16(f)
		if isNaN {
			if back&0x7c00 != 0x7c00 || back&0x3ff == 0 || back&0x8000 != h&0x8000 {
				t.Fatalf("NaN %#04x round-tripped to %#04x", h, back)
			}
			continue
		}
		if back != h {
			t.Fatalf("Float32ToFloat16(Float16ToFloat32(%#04x)) = %#04x", h, back)
		}
	}
}

// refToHalf narrows f by search: the nearest of all finite halves, ties to
// the even one, infinity at or beyond 65520.
func refToHalf(pos []float64, f float32) uint16 {
	v := float64(f)
	var sign uint16
	if math.Signbit(v) {
		sign, v = 0x8000, -v
	}
	if math.IsNaN(v) {
		return 0x7e00
	}
	if v >= 65520 {
		return sign | 0x7c00
	}
	// pos[i] is the value of half bits i, for i in [0, 0x7bff].
	i := sort.SearchFloat64s(pos, v) // first with pos[i] >= v
	if i < len(pos) && pos[i] == v {
		return sign | uint16(i)
	}
	lo, hi := i-1, i
	if hi == len(pos) { // between 65504 and 65520: rounds down
		return sign | uint16(lo)
	}
	dlo, dhi := v-pos[lo], pos[hi]-v
	switch {
	case dlo < dhi:
		return sign | uint16(lo)
	case dhi < dlo:
		return sign | uint16(hi)
	case lo%2 == 0:
		return sign | uint16(lo)
	}
	return sign | uint16(hi)
}

func TestFloat32ToFloat16Reference(t *testing.T) {
	pos := make([]float64, 0x7c00)
	for i := range pos {
		pos[i] = float64(Float16ToFloat32(uint16(i)))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	check := func(f float32) {
		if math.IsNaN(float64(f)) {
			return
		}
		if got, want := Float32ToFloat16(f), refToHalf(pos, f); got != want {
			t.Fatalf("Float32ToFloat16(%g = %#08x) = %#04x, want %#04x", f, math.Float32bits(f), got, want)
		}
	}
	for range 1_000_000 {
		check(math.Float32frombits(rng.Uint32()))
	}
	// Concentrate on the half's range, where rounding matters: every
	// float32 with exponent in [-26, 16] is reachable by these.
	for range 1_000_000 {
		e := rng.IntN(43) - 26
		m := rng.Uint32() & 0x7fffff
		f := math.Float32frombits(uint32(e+127)<<23 | m)
		if rng.IntN(2) == 0 {
			f = -f
		}
		check(f)
	}
	// Every exact midpoint between adjacent halves (all are float32s).
	for i := 0; i < 0x7bff; i++ {
		check(float32((pos[i] + pos[i+1]) / 2))
	}
}

func TestAddFloat16Values(t *testing.T) {
	h := Float32ToFloat16
	inf, ninf := float32(math.Inf(1)), float32(math.Inf(-1))
	cases := []struct {
		name string
		a, b uint16
		want uint16
	}{
		{"1+1", h(1), h(1), h(2)},
		{"1.5+0.25", h(1.5), h(0.25), h(1.75)},
		{"x+(-x)", h(3.25), h(-3.25), 0x0000},
		{"subnormals", 0x0001, 0x0001, 0x0002},
		{"subnormal to normal", 0x03ff, 0x0001, 0x0400},
		{"overflow", 0x7bff, 0x7bff, 0x7c00},
		{"inf+1", h(inf), h(1), 0x7c00},
		{"-inf+1", h(ninf), h(1), 0xfc00},
		{"tie to even: 2048+1", h(2048), h(1), h(2048)},
		{"tie to even: 2050+1", h(2050), h(1), h(2052)},
		{"-0 + -0", 0x8000, 0x8000, 0x8000},
	}
	for _, c := range cases {
		dst, src := []uint16{c.a}, []uint16{c.b}
		AddFloat16(dst, src)
		if dst[0] != c.want {
			t.Errorf("%s: %#04x + %#04x = %#04x, want %#04x", c.name, c.a, c.b, dst[0], c.want)
		}
	}
	dst, src := []uint16{h(inf)}, []uint16{h(ninf)}
	AddFloat16(dst, src)
	if dst[0]&0x7c00 != 0x7c00 || dst[0]&0x3ff == 0 {
		t.Errorf("inf + -inf = %#04x, want NaN", dst[0])
	}
	dst, src = []uint16{0x7e00}, []uint16{h(1)}
	AddFloat16(dst, src)
	if dst[0]&0x7c00 != 0x7c00 || dst[0]&0x3ff == 0 {
		t.Errorf("NaN + 1 = %#04x, want NaN", dst[0])
	}
}
