package reduce

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/fptps/fpt/frame"
)

// encode writes vals as little-endian elements of dt.
func encode(dt frame.DType, vals []float64) []byte {
	b := make([]byte, len(vals)*dt.Size())
	for i, v := range vals {
		switch dt {
		case frame.Float32:
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(v)))
		case frame.Float64:
			binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(v))
		case frame.Float16:
			binary.LittleEndian.PutUint16(b[2*i:], Float32ToFloat16(float32(v)))
		case frame.BFloat16:
			binary.LittleEndian.PutUint16(b[2*i:], Float32ToBFloat16(float32(v)))
		}
	}
	return b
}

// decode reads little-endian elements of dt.
func decode(dt frame.DType, b []byte) []float64 {
	es := dt.Size()
	vals := make([]float64, len(b)/es)
	for i := range vals {
		switch dt {
		case frame.Float32:
			vals[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
		case frame.Float64:
			vals[i] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
		case frame.Float16:
			vals[i] = float64(Float16ToFloat32(binary.LittleEndian.Uint16(b[2*i:])))
		case frame.BFloat16:
			vals[i] = float64(BFloat16ToFloat32(binary.LittleEndian.Uint16(b[2*i:])))
		}
	}
	return vals
}

// refSum is the expected elementwise sum, rounded to dt after each addition
// as the kernels do.
func refSum(dt frame.DType, a, b []float64) []float64 {
	out := make([]float64, len(a))
	for i := range a {
		switch dt {
		case frame.Float32:
			out[i] = float64(float32(a[i]) + float32(b[i]))
		case frame.Float64:
			out[i] = a[i] + b[i]
		case frame.Float16:
			out[i] = float64(Float16ToFloat32(Float32ToFloat16(float32(a[i]) + float32(b[i]))))
		case frame.BFloat16:
			out[i] = float64(BFloat16ToFloat32(Float32ToBFloat16(float32(a[i]) + float32(b[i]))))
		}
	}
	return out
}

// smallInts returns n values that every dtype represents exactly.
func smallInts(rng *rand.Rand, n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = float64(rng.IntN(200) - 100)
	}
	return v
}

func TestAddErrors(t *testing.T) {
	cases := []struct {
		name     string
		dt       frame.DType
		dst, src int
	}{
		{"unknown dtype", frame.DType(0), 8, 8},
		{"unknown dtype 9", frame.DType(9), 8, 8},
		{"length differs", frame.Float32, 8, 12},
		{"not whole float32", frame.Float32, 6, 6},
		{"not whole float64", frame.Float64, 12, 12},
		{"not whole float16", frame.Float16, 3, 3},
		{"not whole bfloat16", frame.BFloat16, 5, 5},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dst, src := make([]byte, c.dst), make([]byte, c.src)
			for i := range src {
				src[i] = 1
			}
			if err := Add(c.dt, dst, src); err == nil {
				t.Fatal("no error")
			}
			for _, b := range dst {
				if b != 0 {
					t.Fatal("dst changed on error")
				}
			}
		})
	}
	if err := Add(frame.Float32, nil, nil); err != nil {
		t.Errorf("empty: %v", err)
	}
}

// TestAddPaths checks the typed (aligned) and byte-wise (misaligned) paths
// for every dtype and lengths around the unrolling width.
func TestAddPaths(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, dt := range []frame.DType{frame.Float32, frame.Float64, frame.Float16, frame.BFloat16} {
		for n := 0; n <= 37; n++ {
			for _, shift := range []int{0, 1} { // shift 1 misaligns both slices
				a, b := smallInts(rng, n), smallInts(rng, n)
				want := refSum(dt, a, b)
				dstBuf := make([]byte, len(a)*dt.Size()+8)
				srcBuf := make([]byte, len(b)*dt.Size()+8)
				dst := dstBuf[shift : shift+len(a)*dt.Size()]
				src := srcBuf[shift : shift+len(b)*dt.Size()]
				copy(dst, encode(dt, a))
				copy(src, encode(dt, b))
				if err := Add(dt, dst, src); err != nil {
					t.Fatalf("%s n=%d shift=%d: %v", dt, n, shift, err)
				}
				got := decode(dt, dst)
				for i := range want {
					if got[i] != want[i] {
						t.Fatalf("%s n=%d shift=%d: [%d] = %g, want %g", dt, n, shift, i, got[i], want[i])
					}
				}
			}
		}
	}
}

// TestAddFractions compares the kernels with a scalar reference on values
// that round.
func TestAddFractions(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, dt := range []frame.DType{frame.Float32, frame.Float64, frame.Float16, frame.BFloat16} {
		a, b := make([]float64, 1000), make([]float64, 1000)
		for i := range a {
			a[i], b[i] = rng.NormFloat64()*100, rng.NormFloat64()
		}
		// Round the inputs to dt first: that is what travels.
		a, b = decode(dt, encode(dt, a)), decode(dt, encode(dt, b))
		dst, src := encode(dt, a), encode(dt, b)
		if err := Add(dt, dst, src); err != nil {
			t.Fatal(err)
		}
		want, got := refSum(dt, a, b), decode(dt, dst)
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("%s [%d]: %g + %g = %g, want %g", dt, i, a[i], b[i], got[i], want[i])
			}
		}
	}
}

func TestTypedKernelsPanicOnLengthMismatch(t *testing.T) {
	for name, f := range map[string]func(){
		"float32":  func() { AddFloat32(make([]float32, 3), make([]float32, 4)) },
		"float64":  func() { AddFloat64(make([]float64, 9), make([]float64, 8)) },
		"float16":  func() { AddFloat16(make([]uint16, 1), nil) },
		"bfloat16": func() { AddBFloat16(make([]uint16, 1), nil) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
}

func TestAddAllocatesNothing(t *testing.T) {
	for _, dt := range []frame.DType{frame.Float32, frame.Float64, frame.Float16, frame.BFloat16} {
		dst, src := make([]byte, 4096), make([]byte, 4096)
		if n := testing.AllocsPerRun(100, func() { _ = Add(dt, dst, src) }); n != 0 {
			t.Errorf("%s: %v allocations per Add", dt, n)
		}
		if n := testing.AllocsPerRun(100, func() { _ = Add(dt, dst[1:4089], src[1:4089]) }); n != 0 {
			t.Errorf("%s misaligned: %v allocations per Add", dt, n)
		}
	}
}

func benchmarkAdd(b *testing.B, dt frame.DType, size int, misalign int) {
	dstBuf, srcBuf := make([]byte, size+8), make([]byte, size+8)
	dst, src := dstBuf[misalign:misalign+size], srcBuf[misalign:misalign+size]
	one := encode(dt, []float64{1})
	for i := 0; i < size; i += len(one) {
		copy(src[i:], one)
	}
	b.SetBytes(int64(size))
	b.ResetTimer()
	for b.Loop() {
		if err := Add(dt, dst, src); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAdd(b *testing.B) {
	for _, dt := range []frame.DType{frame.Float32, frame.Float64, frame.Float16, frame.BFloat16} {
		for _, size := range []struct {
			name string
			n    int
		}{{"4KiB", 4 << 10}, {"4MiB", 4 << 20}} {
			b.Run(dt.String()+"/"+size.name, func(b *testing.B) { benchmarkAdd(b, dt, size.n, 0) })
		}
	}
}

// BenchmarkAddMisaligned measures the byte-wise fallback.
func BenchmarkAddMisaligned(b *testing.B) {
	for _, dt := range []frame.DType{frame.Float32, frame.Float64, frame.Float16, frame.BFloat16} {
		b.Run(dt.String()+"/4KiB", func(b *testing.B) { benchmarkAdd(b, dt, 4<<10-8, 1) })
	}
}
