package frame

import "iter"

// Chunks cuts a value of n bytes into frame payloads of at most limit
// bytes (rounded down to whole elemSize-byte elements, and at least one
// element), and yields each chunk's index and [off, end). An empty value is
// one empty chunk: a request for it still needs a frame.
func Chunks(n, limit uint64, elemSize int) iter.Seq2[uint32, [2]uint64] {
	es := uint64(elemSize)
	limit = max(limit-limit%es, es)
	return func(yield func(uint32, [2]uint64) bool) {
		for i, off := uint32(0), uint64(0); ; i++ {
			end := min(off+limit, n)
			if !yield(i, [2]uint64{off, end}) || end == n {
				return
			}
			off = end
		}
	}
}
