// Package wiretest makes frames for the tests of the vans (package van's
// own, van/vantest's contract, van/memvan's): valid headers, their bytes
// as on the wire, and payloads whose content can be checked.
package wiretest

import (
	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/node"
)

// Fill writes a pattern determined by seed; Check verifies it.
func Fill(p []byte, seed uint64) {
	x := seed*0x9e3779b97f4a7c15 + 1
	for i := range p {
		x = x*6364136223846793005 + 1442695040888963407
		p[i] = byte(x >> 56)
	}
}

// Check returns the index of the first byte of p that differs from what
// Fill(p, seed) writes, or -1.
func Check(p []byte, seed uint64) int {
	x := seed*0x9e3779b97f4a7c15 + 1
	for i := range p {
		x = x*6364136223846793005 + 1442695040888963407
		if p[i] != byte(x>>56) {
			return i
		}
	}
	return -1
}

// PushHeader is a valid header of a float32 tensor frame of n bytes.
func PushHeader(from, to node.ID, key uint64, n int) frame.Header {
	return frame.Header{Type: frame.Push, DType: frame.Float32, Sender: uint32(from), Recipient: uint32(to), Key: key, Total: uint64(n), Length: uint64(n)}
}

// Encode returns a frame's bytes as they go on the wire (h.Length set to
// the payload's).
func Encode(h frame.Header, payload []byte) []byte {
	h.Length = uint64(len(payload))
	b := make([]byte, frame.HeaderSize+len(payload))
	h.Encode(b)
	copy(b[frame.HeaderSize:], payload)
	return b
}
