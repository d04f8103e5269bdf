package classic_test

import (
	"fmt"
	"math"

	"github.com/fptps/fpt/classic"
	"github.com/fptps/fpt/node"
)

func ExampleLayout() {
	l := classic.Initial([]node.ID{node.ServerID(2), node.ServerID(0), node.ServerID(1)})
	fmt.Println(l)
	for _, key := range []uint64{0, math.MaxUint64 / 3, math.MaxUint64 / 2, math.MaxUint64} {
		fmt.Println(key, l.Owner(key))
	}

	// A fourth server joins: it takes the last quarter of the key space.
	l = l.With(node.ServerID(3))
	fmt.Println(l)
	from, to, _ := l.Range(node.ServerID(3))
	fmt.Println(from, to, l.Owner(math.MaxUint64))
	// Output:
	// v0[server0(8) server1(10) server2(12)]
	// 0 server0(8)
	// 6148914691236517205 server1(10)
	// 9223372036854775807 server1(10)
	// 18446744073709551615 server2(12)
	// v1[server0(8) server1(10) server2(12) server3(14)]
	// 13835058055282163709 0 server3(14)
}
