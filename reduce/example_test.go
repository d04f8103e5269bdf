package reduce_test

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/reduce"
)

func float32s(vals ...float32) []byte {
	b := make([]byte, 4*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

// Three workers contribute (each says how many make up the round) to partition 0 of key 42 in iteration 5; the
// third contribution completes the sum.
func Example() {
	t := reduce.NewTable()
	id := reduce.PartID{Key: 42, Partition: 0, Iteration: 5}
	for w, vals := range [][]float32{{1, 2}, {10, 20}, {100, 200}} {
		sum, err := t.Add(reduce.Contribution{
			PartID: id, Workers: 3, Worker: w, DType: frame.Float32,
			Offset: 0, Total: 8, Data: float32s(vals...),
		})
		if err != nil {
			fmt.Println(err)
			return
		}
		if sum == nil {
			fmt.Printf("worker %d: waiting (%d pending)\n", w, t.Pending())
			continue
		}
		a := math.Float32frombits(binary.LittleEndian.Uint32(sum.Data))
		b := math.Float32frombits(binary.LittleEndian.Uint32(sum.Data[4:]))
		fmt.Printf("worker %d: sum of key %d partition %d = [%g %g]\n", w, sum.Key, sum.Partition, a, b)
		t.Release(sum) // after broadcasting it
	}
	_, err := t.Add(reduce.Contribution{PartID: id, Workers: 3, Worker: 3, DType: frame.Float32, Total: 8, Data: float32s(1, 1)})
	fmt.Println(err)
	// Output:
	// worker 0: waiting (1 pending)
	// worker 1: waiting (1 pending)
	// worker 2: sum of key 42 partition 0 = [111 222]
	// key 42 partition 0 iteration 5 worker 3: aggregator: worker index out of range: index 3 of 3 workers
}
