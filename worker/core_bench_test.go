package worker

import (
	"fmt"
	"testing"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/lb"
)

// landAll lands every partition of key's result of iteration iter, cut
// under the decision in force then.
func landAll(t testing.TB, c *core, key, iter uint64) effects {
	t.Helper()
	var out effects
	hs := results(c, key, iter)
	for i := range hs {
		h := &hs[i]
		h.Aux = c.schedule.At(iter).Version
		td, err := receive(c, h, make([]byte, h.Length))
		if err != nil {
			t.Fatalf("result %s: %v", h, err)
		}
		out.merge(td)
	}
	return out
}

// pullOne pulls key's next iteration into dst, as the shell would.
func pullOne(t testing.TB, c *core, key uint64, dst []byte) {
	t.Helper()
	td, err := c.pull([]uint64{key}, dst, []int{len(dst)}, frame.Float32, &call{})
	if err != nil {
		t.Fatal(err)
	}
	handOver(c, td)
	for _, d := range td.copies {
		copyStaged(c, d)
	}
}

// BenchmarkCorePush is the cost of one tensor's push, result and pull,
// one tensor per call, by the number of tensors declared: it stays flat
// from 10 to 10^5 tensors (bytes are the 4 of each tensor's value).
func BenchmarkCorePush(b *testing.B) {
	for _, retry := range []bool{false, true} {
		for _, n := range []int{10, 100, 1000, 10000, 100000} {
			b.Run(fmt.Sprintf("retry=%v/tensors=%d", retry, n), func(b *testing.B) {
				c := newCore(testPartBytes, true)
				if err := c.start(0, testWorkers(1), testWorkers(1)); err != nil {
					b.Fatal(err)
				}
				c.self, c.rank = testWorkers(1)[0], 0
				c.retryMode = retry
				for k := range uint64(n) {
					if err := c.declare(k, frame.Float32, 4, 0); err != nil {
						b.Fatal(err)
					}
				}
				buf := make([]byte, 4)
				b.SetBytes(4)
				b.ReportAllocs()
				b.ResetTimer()
				for i := range b.N {
					k, iter := uint64(i%n), uint64(i/n)
					if k == 0 {
						if _, _, err := c.follow(lb.Directive{Horizon: iter, Done: iter}); err != nil {
							b.Fatal(err)
						}
					}
					td, err := c.push([]uint64{k}, buf, []int{4}, frame.Float32, 0, &call{})
					if err != nil {
						b.Fatal(err)
					}
					handOver(c, td)
					c.iterationsPushed()
					landAll(b, c, k, iter)
					pullOne(b, c, k, buf)
				}
			})
		}
	}
}

// BenchmarkCoreSplitAll is the check of one call naming every declared
// tensor (an FPTPull of the whole model), by the number of tensors: its
// throughput stays flat from 10 to 10^5 tensors (bytes are 4 per tensor).
func BenchmarkCoreSplitAll(b *testing.B) {
	for _, n := range []int{10, 100, 1000, 10000, 100000} {
		b.Run(fmt.Sprintf("tensors=%d", n), func(b *testing.B) {
			c := newCore(testPartBytes, true)
			if err := c.start(0, testWorkers(1), testWorkers(1)); err != nil {
				b.Fatal(err)
			}
			keys, lens := make([]uint64, n), make([]int, n)
			for i := range keys {
				keys[i], lens[i] = uint64(i), 4
				if err := c.declare(keys[i], frame.Float32, 4, 0); err != nil {
					b.Fatal(err)
				}
			}
			data := make([]byte, 4*n)
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := c.split(keys, data, lens, frame.Float32); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
