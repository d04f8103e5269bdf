package van

// A frame is written as a gather list: its header, then its payload's
// parts (frame.Message's Payload and More), never joined into one buffer.
// window and advance are the pure half of a gathering write loop.

// window appends to dst the first limit bytes of bufs (all of them when
// fewer), as slices of bufs' own memory.
func window(dst, bufs [][]byte, limit int) [][]byte {
	for _, b := range bufs {
		if limit <= 0 {
			break
		}
		if len(b) > limit {
			b = b[:limit]
		}
		dst = append(dst, b)
		limit -= len(b)
	}
	return dst
}

// advance drops the first n bytes of bufs (n at most their total), and
// the slices they empty.
func advance(bufs [][]byte, n int) [][]byte {
	for len(bufs) > 0 && n >= len(bufs[0]) {
		n -= len(bufs[0])
		bufs = bufs[1:]
	}
	if n > 0 {
		bufs[0] = bufs[0][n:]
	}
	return bufs
}

// size is the bytes in bufs.
func size(bufs [][]byte) int {
	n := 0
	for _, b := range bufs {
		n += len(b)
	}
	return n
}
