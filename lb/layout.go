package lb

import (
	"github.com/fptps/fpt/node"

	"fmt"
	"math"
	"math/bits"
	"slices"
)

// MinSplit is the size below which a tensor is not split across
// aggregators: it goes whole to one aggregator, chosen by its key. Splitting
// a small tensor buys no bandwidth (the transfer is dominated by per-message
// latency) while multiplying the messages every worker sends and every
// aggregator answers; spreading small tensors over the aggregators by key
// balances them in aggregate instead. MXNet's kvstore makes the same call
// with its "big array bound" below which a key lives on a single server.
const MinSplit = 256 << 10

// shareScale converts shares to integer weights (share * 2^32, rounded).
// Layout's arithmetic is then exact and identical on every machine; shares
// below 2^-33 count as zero.
const shareScale = 1 << 32

// Partition is one piece of a tensor: bytes [Offset, Offset+Length), summed
// by the node Aggregator.
type Partition struct {
	Index          uint32
	Offset, Length uint64
	Aggregator     node.ID
}

// Layout cuts one tensor of total bytes, made of elemSize-byte elements,
// into partitions of at most maxPart bytes and assigns each to an
// aggregator. It is deterministic: every node computing it from the same
// inputs gets the same result.
//
//   - total == 0: no partitions.
//   - total < MinSplit: the tensor goes whole to one aggregator, picked by
//     hashing the key and weighting by the shares (over many keys each
//     aggregator receives about its share of the small tensors), and is cut
//     into maxPart pieces if it is larger than that.
//   - otherwise each aggregator with a positive share gets one contiguous
//     segment, its length proportional to the share in whole elements
//     (largest-remainder rounding, so the segments add up exactly to
//     total), cut into maxPart pieces (all full but the segment's last). The
//     order of the segments is the decision's, rotated by a hash of the key,
//     so that the first and last pieces of many tensors do not all land on
//     the same aggregator.
//
// Partitions are indexed 0..n-1 in offset order; they are contiguous,
// element-aligned and cover [0, total). maxPart is rounded down to a whole
// number of elements, and raised to one element if smaller.
//
// Layout panics if elemSize is not positive, total is not a multiple of
// it, or d has no aggregator with a positive share or fewer shares than
// aggregators: check decisions with Validate when they arrive.
func (d Decision) Layout(key uint64, total uint64, elemSize int, maxPart uint64) []Partition {
	if elemSize <= 0 || total%uint64(elemSize) != 0 {
		panic(fmt.Sprintf("lb: Layout of key %d: total %d bytes is not a whole number of %d-byte elements", key, total, elemSize))
	}
	if len(d.Shares) < len(d.Aggregators) {
		panic(fmt.Sprintf("lb: Layout of key %d: %s", key, d))
	}
	if total == 0 {
		return nil
	}
	es := uint64(elemSize)
	maxPart -= maxPart % es
	if maxPart < es {
		maxPart = es
	}

	// Integer weights; the positive ones, in decision order.
	type seg struct {
		agg       int    // index into d.Aggregators
		weight    uint64 // share * 2^32
		elems     uint64
		remainder uint64
	}
	segs := make([]seg, 0, len(d.Aggregators))
	var sum uint64
	for i := range d.Aggregators {
		if w := weight(d.Shares[i]); w > 0 {
			segs = append(segs, seg{agg: i, weight: w})
			sum += w
		}
	}
	if sum == 0 {
		panic(fmt.Sprintf("lb: Layout of key %d: no aggregator has a positive share in %s", key, d))
	}
	h := mix64(key)

	if total < MinSplit {
		// Weighted pick: r is uniform over [0, sum).
		r, _ := bits.Mul64(h, sum)
		i := len(segs) - 1
		var cum uint64
		for j, s := range segs {
			cum += s.weight
			if r < cum {
				i = j
				break
			}
		}
		return cut(nil, 0, total, maxPart, d.Aggregators[segs[i].agg])
	}

	// Proportional segments in elements, largest remainder.
	n := total / es
	var given uint64
	for j := range segs {
		hi, lo := bits.Mul64(n, segs[j].weight)
		segs[j].elems, segs[j].remainder = bits.Div64(hi, lo, sum) // hi < sum since weight <= sum
		given += segs[j].elems
	}
	if left := n - given; left > 0 { // fewer than len(segs)
		order := make([]int, len(segs))
		for j := range order {
			order[j] = j
		}
		slices.SortStableFunc(order, func(a, b int) int {
			ra, rb := segs[a].remainder, segs[b].remainder
			switch {
			case ra > rb:
				return -1
			case ra < rb:
				return 1
			}
			return 0 // stable: the earlier aggregator first
		})
		for _, j := range order[:left] {
			segs[j].elems++
		}
	}

	// Rotate by the key and cut.
	start, _ := bits.Mul64(mix64(h), uint64(len(segs)))
	count := 0
	for _, s := range segs {
		l := s.elems * es
		count += int((l + maxPart - 1) / maxPart)
	}
	parts := make([]Partition, 0, count)
	var off uint64
	for j := range segs {
		s := segs[(int(start)+j)%len(segs)]
		l := s.elems * es
		parts = cut(parts, off, l, maxPart, d.Aggregators[s.agg])
		off += l
	}
	return parts
}

// cut appends the pieces of [off, off+length) of at most maxPart bytes, all
// full but the last, assigned to agg and indexed after those in parts.
func cut(parts []Partition, off, length, maxPart uint64, agg node.ID) []Partition {
	if parts == nil {
		parts = make([]Partition, 0, (length+maxPart-1)/maxPart)
	}
	for end := off + length; off < end; {
		l := min(maxPart, end-off)
		parts = append(parts, Partition{Index: uint32(len(parts)), Offset: off, Length: l, Aggregator: agg})
		off += l
	}
	return parts
}

// weight converts a share to its integer weight; invalid shares weigh 0.
func weight(share float64) uint64 {
	if !(share > 0) || share > 2 { // also NaN; a valid share is at most 1
		return 0
	}
	return uint64(math.Round(share * shareScale))
}

// mix64 is splitmix64's finalizer: a fixed bijective 64-bit mixer, so that
// nearby keys (0, 1, 2...) hash to unrelated values on every machine.
func mix64(z uint64) uint64 {
	z += 0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}
