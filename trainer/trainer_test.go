package trainer

import (
	"testing"
	"time"

	"github.com/fptps/fpt/frame"
)

func TestSizes(t *testing.T) {
	tests := []struct {
		o    Options
		want []int
	}{
		{Options{Tensors: 3, MinBytes: 4096, MaxBytes: 16384, DType: frame.Float32}, []int{1024, 2048, 4096}},
		{Options{Tensors: 1, MinBytes: 800, MaxBytes: 800, DType: frame.Float64}, []int{100}},
		{Options{Tensors: 3, MinBytes: 0, MaxBytes: 80, DType: frame.Float64}, []int{0, 5, 10}},
	}
	for _, tt := range tests {
		got := tt.o.Sizes()
		if len(got) != len(tt.want) {
			t.Fatalf("%+v: %v", tt.o, got)
		}
		for i := range got {
			if got[i] != tt.want[i] {
				t.Errorf("%+v: Sizes() = %v, want %v", tt.o, got, tt.want)
				break
			}
		}
	}
}

func TestExpected(t *testing.T) {
	for _, k := range []uint64{0, 5, 1 << 60} {
		for _, j := range []int{0, 1, 1000, 1 << 28} {
			if got, want := Expected([]int{0, 1, 2, 3}, 0, k, j), Value(0, 0, k, j); got != want {
				t.Errorf("init: Expected = %v, want worker 0's %v", got, want)
			}
			sum := Value(0, 3, k, j) + Value(1, 3, k, j) + Value(2, 3, k, j)
			if got := Expected([]int{0, 1, 2}, 3, k, j); got != sum {
				t.Errorf("Expected(ranks 0-2, 3, %d, %d) = %v, want %v", k, j, got, sum)
			}
			// Small integers: every float32 sum is exact, whatever the order.
			if v := Value(7, 1<<20, k, j); v < 0 || v > 60 || v != float64(float32(v)) {
				t.Errorf("Value out of the exact range: %v", v)
			}
		}
	}
}

func TestValidate(t *testing.T) {
	good := DefaultOptions()
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []func(o *Options){
		func(o *Options) { o.Tensors = 0 },
		func(o *Options) { o.MaxBytes = o.MinBytes - 1 },
		func(o *Options) { o.DType = frame.Float16 },
		func(o *Options) { o.Iterations = -1 },
		func(o *Options) { o.Compute = -time.Millisecond },
	} {
		o := DefaultOptions()
		bad(&o)
		if o.Validate() == nil {
			t.Errorf("accepted %+v", o)
		}
	}
}
