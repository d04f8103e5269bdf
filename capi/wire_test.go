package capi

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/reduce"
)

// Three workers push float32 values over a bfloat16 and a float16 wire:
// each gets the float32 sum of the 16-bit rounded values, rounded once,
// widened back into its float32 buffer (with and without a callback);
// exact where the values and sums are representable. A call mixing wire
// types, and a wire for float64 values, are refused.
func TestLibWire(t *testing.T) {
	c := startLibs(t, 1, 3)
	const n = 1000
	wires := []frame.DType{frame.BFloat16, frame.Float16}
	val := func(rank, i int) float32 { return float32(rank+1)*0.1 + float32(i%50) } // rounds on both wires
	err := c.each(func(rank int, l *Lib) error {
		for k, wd := range wires {
			if err := l.DeclareWire(uint64(k+1), 4*n, int(frame.Float32), 0, int(wd)); err != nil {
				return err
			}
		}
		if err := l.DeclareWire(9, 8, int(frame.Float64), 0, int(frame.BFloat16)); err == nil || CodeOf(err) != CodeArg {
			return fmt.Errorf("a bfloat16 wire for float64 values: %v, want FPT_ERR_ARG", err)
		}
		mixed := Tensors{Keys: []uint64{1, 2}, Lens: []int{4 * n, 4 * n}, Data: make([]byte, 8*n)}
		if _, err := l.Push(mixed, 0, nil); err == nil || CodeOf(err) != CodeArg {
			return fmt.Errorf("a push mixing wire types: %v, want FPT_ERR_ARG", err)
		}
		for k, wd := range wires {
			key := uint64(k + 1)
			one := func(b []byte) Tensors { return Tensors{Keys: []uint64{key}, Lens: []int{4 * n}, Data: b} }
			if err := l.Init(one(make([]byte, 4*n))); err != nil {
				return err
			}
			grads, sums := make([]byte, 4*n), make([]byte, 4*n)
			g := f32s(grads)
			for i := range g {
				g[i] = val(rank, i)
			}
			for round := range 3 {
				push, err := l.Push(one(grads), 0, nil)
				if err != nil {
					return err
				}
				called := make(chan error, 1)
				var cb Callback
				if k == 0 {
					cb = func(_ int, err error) { called <- err }
				}
				pull, err := l.Pull(one(sums), cb)
				if err != nil {
					return err
				}
				if err := errors.Join(l.Wait(push), l.Wait(pull)); err != nil {
					return err
				}
				if k == 0 {
					if err := <-called; err != nil {
						return err
					}
				}
				// The push's and the pull's wire buffers are back, and the
				// next round takes them again rather than new ones: two
				// at most, or one where the push settled before the pull
				// was made and the pull took its buffer.
				l.stageMu.Lock()
				idle, made := len(l.staged[2*n]), l.stageMade
				l.stageMu.Unlock()
				if idle != made || made > 2 {
					return fmt.Errorf("%s wire, round %d: %d idle wire buffers of %d bytes, %d made; want all idle, at most 2", wd, round, idle, 2*n, made)
				}
			}
			// PushPull narrows the values, and widens the sums into its
			// output: the same sums as a push and a pull.
			pp := make([]byte, 4*n)
			ts, err := l.PushPull(one(grads), pp, 0, nil)
			if err != nil {
				return err
			}
			if err := l.Wait(ts); err != nil {
				return err
			}
			if !bytes.Equal(pp, sums) {
				return fmt.Errorf("%s wire, worker %d: PushPull's sums differ from a push and a pull's", wd, rank)
			}
			round, widen := reduce.Float32ToBFloat16, reduce.BFloat16ToFloat32
			if wd == frame.Float16 {
				round, widen = reduce.Float32ToFloat16, reduce.Float16ToFloat32
			}
			for i, got := range f32s(sums) {
				var acc float32
				for r := range 3 {
					acc += widen(round(val(r, i)))
				}
				if want := widen(round(acc)); got != want {
					return fmt.Errorf("%s wire, worker %d: [%d] = %g, want %g (float32 sum of the rounded values, rounded once)", wd, rank, i, got, want)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range c.finalize() {
		if err != nil {
			t.Error(err)
		}
	}
}
