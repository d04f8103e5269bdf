package reduce

import (
	"encoding/binary"
	"math"
	"math/big"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/fptps/fpt/frame"
)

// refBFloat16 is the nearest bfloat16 to f, ties to even, chosen by
// comparing exact distances to the two bfloat16s around f (no bit tricks).
func refBFloat16(f float32) uint16 {
	b := math.Float32bits(f)
	if f != f {
		return uint16(b>>16) | 0x40
	}
	lo := uint16(b >> 16) // truncation: toward zero
	hi := lo + 1          // the next bfloat16 away from zero (may be infinity)
	if b&0xffff == 0 {
		return lo
	}
	exact := new(big.Float).SetFloat64(float64(f))
	dl := new(big.Float).Sub(exact, new(big.Float).SetFloat64(float64(BFloat16ToFloat32(lo))))
	dh := new(big.Float).Sub(new(big.Float).SetFloat64(float64(BFloat16ToFloat32(hi))), exact)
	if hi&0x7fff == 0x7f80 { // infinity: as far as a bfloat16 one step past the largest would be
		dh = new(big.Float).Sub(new(big.Float).SetFloat64(0x1p128), exact.Abs(exact))
		dl.Abs(dl)
	}
	dl.Abs(dl)
	dh.Abs(dh)
	switch dl.Cmp(dh) {
	case -1:
		return lo
	case 1:
		return hi
	}
	if lo&1 == 0 {
		return lo
	}
	return hi
}

func TestBFloat16Known(t *testing.T) {
	cases := []struct {
		name string
		in   float32
		want uint16
	}{
		{"zero", 0, 0x0000},
		{"negative zero", float32(math.Copysign(0, -1)), 0x8000},
		{"one", 1, 0x3f80},
		{"minus two", -2, 0xc000},
		{"pi", math.Pi, 0x4049},
		{"tie to even, down", 1 + 0x1p-8, 0x3f80},
		{"tie to even, up", 1 + 3*0x1p-8, 0x3f82},
		{"above tie rounds up", 1 + 0x1p-8 + 0x1p-20, 0x3f81},
		{"largest finite", math.Float32frombits(0x7f7f0000), 0x7f7f},
		{"overflow rounds to infinity", math.MaxFloat32, 0x7f80},
		{"+inf", float32(math.Inf(1)), 0x7f80},
		{"-inf", float32(math.Inf(-1)), 0xff80},
		{"smallest subnormal rounds to zero", math.Float32frombits(1), 0x0000},
		{"subnormal kept", math.Float32frombits(0x00010000), 0x0001},
		{"NaN whose payload lies in the dropped bits stays NaN", math.Float32frombits(0x7f800001), 0x7fc0},
		{"negative quiet NaN", math.Float32frombits(0xffc00000), 0xffc0},
	}
	for _, c := range cases {
		if got := Float32ToBFloat16(c.in); got != c.want {
			t.Errorf("%s: Float32ToBFloat16(%g) = %#04x, want %#04x", c.name, c.in, got, c.want)
		}
	}
}

// Every bfloat16 widens exactly and narrows back to itself.
func TestBFloat16RoundTripExhaustive(t *testing.T) {
	for h := range 1 << 16 {
		f := BFloat16ToFloat32(uint16(h))
		if math.Float32bits(f) != uint32(h)<<16 {
			t.Fatalf("%#04x widened to %#08x", h, math.Float32bits(f))
		}
		if f != f {
			continue
		}
		if got := Float32ToBFloat16(f); got != uint16(h) {
			t.Fatalf("%#04x -> %g -> %#04x", h, f, got)
		}
	}
}

// Narrowing agrees with the exact-distance reference on every exponent and
// on the ties.
func TestFloat32ToBFloat16MatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	check := func(b uint32) {
		f := math.Float32frombits(b)
		if got, want := Float32ToBFloat16(f), refBFloat16(f); got != want {
			t.Fatalf("Float32ToBFloat16(%#08x = %g) = %#04x, want %#04x", b, f, got, want)
		}
	}
	for range 200000 {
		check(rng.Uint32())
	}
	for hi := uint32(0); hi < 1<<16; hi += 7 {
		for _, lo := range []uint32{0x7fff, 0x8000, 0x8001, 0xffff} {
			check(hi<<16 | lo)
		}
	}
}

// Sums of two bfloat16s: exact where the sum is a bfloat16, and otherwise
// the correctly rounded sum (within half a unit in the last place: one
// rounding).
func TestAddBFloat16Exactness(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	const n = 100000
	dst, src := make([]uint16, n), make([]uint16, n)
	for i := range dst {
		// Integers below 128 in magnitude, scaled by a power of two, are
		// bfloat16s whose sums are too: exact; the rest round.
		if i%2 == 0 {
			scale := math.Ldexp(1, rng.IntN(40)-20)
			dst[i] = Float32ToBFloat16(float32(float64(rng.IntN(128)-64) * scale))
			src[i] = Float32ToBFloat16(float32(float64(rng.IntN(128)-64) * scale))
		} else {
			dst[i] = Float32ToBFloat16(float32(rng.NormFloat64() * 1e3))
			src[i] = Float32ToBFloat16(float32(rng.NormFloat64()))
		}
	}
	a := slices.Clone(dst)
	AddBFloat16(dst, src)
	for i := range dst {
		exact := float64(BFloat16ToFloat32(a[i])) + float64(BFloat16ToFloat32(src[i])) // exact in float64
		got := float64(BFloat16ToFloat32(dst[i]))
		if i%2 == 0 && got != exact {
			t.Fatalf("[%d] %g + %g = %g, want exactly %g", i, BFloat16ToFloat32(a[i]), BFloat16ToFloat32(src[i]), got, exact)
		}
		// Half an ulp of a bfloat16 near exact: 2^(exponent-8).
		_, e := math.Frexp(exact)
		if exact != 0 && math.Abs(got-exact) > math.Ldexp(1, e-9) {
			t.Fatalf("[%d] %g + %g = %g, more than half an ulp from %g", i, BFloat16ToFloat32(a[i]), BFloat16ToFloat32(src[i]), got, exact)
		}
	}
}

// A round of three or more 16-bit contributions is summed in float32 and
// rounded once: 1 + 2^-8 + 2^-8 is 1 + 2^-7, a bfloat16, where rounding
// after each addition would give 1 (1 + 2^-8 is a tie that rounds to even,
// twice). The float16 counterpart is 1 + 2^-11 + 2^-11.
func TestTableHalfRoundsOnce(t *testing.T) {
	cases := []struct {
		dt      frame.DType
		one, up float64 // 1 and half an ulp of 1
	}{
		{frame.BFloat16, 1, 0x1p-8},
		{frame.Float16, 1, 0x1p-11},
	}
	for _, c := range cases {
		t.Run(c.dt.String(), func(t *testing.T) {
			tb := NewTable()
			for iter := uint64(1); iter <= 3; iter++ { // recycled slots too
				id := PartID{Key: 1, Iteration: iter}
				var s *Sum
				for w, v := range [][]float64{{c.one, -4}, {c.up, 1}, {c.up, 2}, {0, 0.5}} {
					var err error
					s, err = tb.Add(Contribution{PartID: id, Workers: 4, Worker: w, DType: c.dt, Total: 4, Data: encode(c.dt, v)})
					if err != nil {
						t.Fatal(err)
					}
				}
				if s == nil {
					t.Fatal("no sum")
				}
				got := decode(c.dt, s.Data)
				if want := []float64{1 + 2*c.up, -0.5}; !slices.Equal(got, want) {
					t.Fatalf("iteration %d: sum %v, want %v (rounded once)", iter, got, want)
				}
				tb.Release(s)
			}
		})
	}
}

// A steady loop of 16-bit rounds over more than two workers allocates
// nothing once warm: the float32 accumulators stay with the records.
func TestTableHalfSteadyStateAllocatesNothing(t *testing.T) {
	tb := NewTable()
	data := make([]byte, 4096)
	iter := uint64(0)
	round := func() {
		iter++
		for w := range 4 {
			s, err := tb.Add(Contribution{PartID: PartID{Key: 1, Iteration: iter}, Workers: 4, Worker: w,
				DType: frame.BFloat16, Total: 4096, Data: data})
			if err != nil {
				t.Fatal(err)
			}
			if s != nil {
				tb.Release(s)
			}
		}
	}
	for range 3 {
		round()
	}
	if n := testing.AllocsPerRun(100, round); n != 0 {
		t.Fatalf("%v allocations per round", n)
	}
}

// BenchmarkTableHalf measures a 4-worker round of 16-bit contributions
// (float32 accumulation, one rounding) per byte contributed.
func BenchmarkTableHalf(b *testing.B) {
	for _, dt := range []frame.DType{frame.Float16, frame.BFloat16, frame.Float32} {
		b.Run(dt.String(), func(b *testing.B) {
			const size, workers = 1 << 20, 4
			tb := NewTable()
			data := make([]byte, size)
			for i := 0; i+1 < size; i += 2 {
				binary.LittleEndian.PutUint16(data[i:], 0x3f80)
			}
			b.SetBytes(size * workers)
			iter := uint64(0)
			for b.Loop() {
				iter++
				for w := range workers {
					s, err := tb.Add(Contribution{PartID: PartID{Key: 1, Iteration: iter}, Workers: workers, Worker: w,
						DType: dt, Total: size, Data: data})
					if err != nil {
						b.Fatal(err)
					}
					if s != nil {
						tb.Release(s)
					}
				}
			}
		})
	}
}

// Narrow and Widen (a compressed wire's encoding): float32 to 16 bits
// rounds as the scalar conversions do, and back is exact.
func TestNarrowWiden(t *testing.T) {
	vals := []float32{0, 1, -2.5, 1 + 0x1p-8, 3.14159, 65504, 1e-3}
	src := make([]byte, 4*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint32(src[4*i:], math.Float32bits(v))
	}
	for _, c := range []struct {
		dt    frame.DType
		round func(float32) uint16
		widen func(uint16) float32
	}{
		{frame.BFloat16, Float32ToBFloat16, BFloat16ToFloat32},
		{frame.Float16, Float32ToFloat16, Float16ToFloat32},
	} {
		half := make([]byte, 2*len(vals))
		Narrow(c.dt, half, src)
		back := make([]byte, len(src))
		Widen(c.dt, back, half)
		// The byte-wise path (misaligned slices) gives the same bytes.
		srcM, halfM, backM := make([]byte, len(src)+1)[1:], make([]byte, len(half)+1)[1:], make([]byte, len(src)+1)[1:]
		copy(srcM, src)
		Narrow(c.dt, halfM, srcM)
		Widen(c.dt, backM, halfM)
		if !slices.Equal(halfM, half) || !slices.Equal(backM, back) {
			t.Errorf("%s: the misaligned path gives %x and %x, the aligned %x and %x", c.dt, halfM, backM, half, back)
		}
		for i, v := range vals {
			if got, want := binary.LittleEndian.Uint16(half[2*i:]), c.round(v); got != want {
				t.Errorf("%s: Narrow(%g) = %#04x, want %#04x", c.dt, v, got, want)
			}
			if got, want := math.Float32frombits(binary.LittleEndian.Uint32(back[4*i:])), c.widen(c.round(v)); got != want {
				t.Errorf("%s: Widen(Narrow(%g)) = %g, want %g", c.dt, v, got, want)
			}
		}
	}
}

// BenchmarkNarrowWiden measures a compressed wire's encoding and decoding
// per float32 byte.
func BenchmarkNarrowWiden(b *testing.B) {
	const n = 1 << 20
	src, half := make([]byte, 4*n), make([]byte, 2*n)
	for _, dt := range []frame.DType{frame.BFloat16, frame.Float16} {
		b.Run("narrow/"+dt.String(), func(b *testing.B) {
			b.SetBytes(4 * n)
			for b.Loop() {
				Narrow(dt, half, src)
			}
		})
		b.Run("widen/"+dt.String(), func(b *testing.B) {
			b.SetBytes(4 * n)
			for b.Loop() {
				Widen(dt, src, half)
			}
		})
	}
}
