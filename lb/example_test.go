package lb_test

import (
	"github.com/fptps/fpt/node"

	"fmt"

	"github.com/fptps/fpt/lb"
)

// A 3 MiB float32 tensor split evenly over three servers (node ids 8, 10,
// 12), in partitions of at most 768 KiB; a 4 KiB tensor goes whole to one
// server.
func ExampleDecision_Layout() {
	d := lb.Even(1, 0, []node.ID{8, 10, 12})
	for _, p := range d.Layout(42, 3<<20, 4, 768<<10) {
		fmt.Printf("partition %d: [%d, +%d) -> node %d\n", p.Index, p.Offset, p.Length, p.Aggregator)
	}
	for _, p := range d.Layout(43, 4<<10, 4, 768<<10) {
		fmt.Printf("small: partition %d: [%d, +%d) -> node %d\n", p.Index, p.Offset, p.Length, p.Aggregator)
	}
	// Output:
	// partition 0: [0, +786432) -> node 10
	// partition 1: [786432, +262144) -> node 10
	// partition 2: [1048576, +786432) -> node 12
	// partition 3: [1835008, +262144) -> node 12
	// partition 4: [2097152, +786432) -> node 8
	// partition 5: [2883584, +262144) -> node 8
	// small: partition 0: [0, +4096) -> node 12
}
