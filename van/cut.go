package van

import (
	"github.com/fptps/fpt/node"

	"errors"
	"fmt"
	"math"

	"github.com/fptps/fpt/frame"
)

// errProtocol marks a peer that broke the wire protocol (as opposed to a
// connection that broke); its connection is closed.
var errProtocol = errors.New("van: protocol error")

// maxChunk bounds one read or write: Linux moves at most 0x7ffff000 bytes
// per call, and a bounded slice keeps every length an int on any platform.
const maxChunk = 1 << 30

// cutter is the receive state machine of one connection: it cuts a byte
// stream into validated frames. It is pure (the caller does the reads) so
// that both vans share it and it can be fuzzed without sockets.
//
// The caller reads into next() (or, with a scattering read, nextv()) and
// reports the count to advance. Reading straight into the header array and
// then into the payload buffer costs no copy; the payload buffer is reused
// across frames and only grows. With a sink, the payload goes where the
// sink says instead (see Sink).
//
// Until the peer is known (an accepted connection), the first frame must be
// a Hello addressed to self with an empty payload; it names the peer. After
// that every frame must come from the peer and be addressed to self, and a
// second Hello is an error.
type cutter struct {
	self       node.ID
	peer       node.ID
	known      bool
	maxPayload uint64
	partBytes  uint64 // see lengthBound

	hdr       [frame.HeaderSize]byte
	hn        int // header bytes filled
	h         frame.Header
	inPayload bool
	buf       []byte // payload storage, reused
	cur       []byte // the current frame's payload: buf or the sink's buffer
	sunk      bool   // cur is the sink's buffer
	pn        uint64 // payload bytes filled

	sink func(h *frame.Header) []byte // nil: always buf

	growMax uint64 // see grow; 0: growBound (tests set less)
}

// newCutter returns a cutter for a connection to peer (known after a Dial),
// or, with known false, for an accepted connection awaiting its Hello.
func newCutter(self, peer node.ID, known bool, maxPayload uint64, sink func(*frame.Header) []byte) cutter {
	return cutter{self: self, peer: peer, known: known, maxPayload: maxPayload, sink: sink}
}

// next is the buffer the next read should fill; empty only when a header
// read ahead by nextv is complete (ready), which advance(0) then decodes.
func (c *cutter) next() []byte {
	if !c.inPayload {
		return c.hdr[c.hn:]
	}
	if !c.sunk && c.pn == uint64(len(c.cur)) {
		c.grow()
	}
	end := uint64(len(c.cur))
	if end-c.pn > maxChunk {
		end = c.pn + maxChunk
	}
	return c.cur[c.pn:end]
}

// nextv appends to dst the buffers a scattering read (readv) should fill,
// at most limit bytes in all: next(), and, when that ends the current
// frame's payload, the header array for the next frame. A stream of frames
// queued up then costs one read per frame, not one for the header and one
// for the payload, and no byte is copied: the next header is read where
// it would be read anyway. (The payload cannot be read with its header:
// where it goes depends on the header, the sink's answer.)
func (c *cutter) nextv(dst [][]byte, limit int) [][]byte {
	b := c.next()
	if len(b) > limit {
		return append(dst, b[:limit])
	}
	dst = append(dst, b)
	if c.inPayload && c.pn+uint64(len(b)) == c.h.Length && limit > len(b) {
		dst = append(dst, c.hdr[:min(frame.HeaderSize, limit-len(b))])
	}
	return dst
}

// ready reports whether a complete header is waiting for advance(0): read
// ahead by nextv together with the end of the frame before it, and not
// decoded then, so that the sink is asked for a frame's buffer only once
// the frame before it was handled.
func (c *cutter) ready() bool { return !c.inPayload && c.hn == frame.HeaderSize }

// growStart is the first size of the cutter's own payload buffer.
const growStart = 64 << 10

// growBound is the most payload the cutter's own buffer takes by doubling;
// past it the buffer grows once to the frame's length. It bounds every
// copy grow makes: one copy of a gigabyte is a memmove the runtime cannot
// preempt, so a stop-the-world waits on it (and on the faults of its fresh
// pages) and every goroutine of the process stalls.
const growBound = 64 << 20

// grow enlarges the cutter's own buffer, keeping what was read: it doubles
// up to the bound (growBound), then grows to the frame's length. It grows as bytes
// arrive rather than to the announced length at once, so that memory
// follows what a peer sent, not what it claimed it would send, until the
// peer has sent the bound's worth of the frame; then the rest is read in
// place with no further copy, and no copy is larger than the bound. The rest of
// the new buffer is not touched here: the runtime zeroes a large
// allocation only where its memory was used before, and then in
// preemptible chunks, and the reads fault fresh pages in inside the
// kernel, where they hold up no stop-the-world. The buffer is reused
// across frames, so a connection's steady state allocates nothing.
func (c *cutter) grow() {
	n := c.h.Length
	if l, b := uint64(len(c.cur)), c.bound(); l < b {
		n = min(n, b, max(2*l, growStart))
	}
	if uint64(cap(c.buf)) >= n {
		c.cur = c.buf[:n]
		return
	}
	b := make([]byte, n)
	copy(b, c.cur[:c.pn])
	c.buf, c.cur = b, b
}

// bound is growMax, or growBound where it is not set.
func (c *cutter) bound() uint64 {
	if c.growMax == 0 {
		return growBound
	}
	return c.growMax
}

// midFrame reports whether a frame has been partly received.
func (c *cutter) midFrame() bool { return c.hn > 0 || c.inPayload }

// advance records that n bytes were read into next() or nextv(). When a
// frame is complete it returns its header and payload, valid until the
// next call of next, nextv or advance; bytes nextv read past it are the
// next frame's header, decoded by a later advance. An error is final: the
// connection must be closed.
func (c *cutter) advance(n int) (h *frame.Header, payload []byte, err error) {
	if !c.inPayload {
		c.hn += n
		if c.hn < frame.HeaderSize {
			return nil, nil, nil
		}
		c.hn = 0
		if c.h, err = frame.Decode(c.hdr[:], c.maxPayload); err != nil {
			return nil, nil, fmt.Errorf("%w: %w", errProtocol, err)
		}
		if err := c.check(&c.h); err != nil {
			return nil, nil, err
		}
		if c.h.Length == 0 {
			return &c.h, nil, nil
		}
		c.cur, c.sunk = nil, false
		if c.sink != nil {
			if b := c.sink(&c.h); uint64(len(b)) == c.h.Length {
				c.cur, c.sunk = b, true
			}
		}
		if c.cur == nil {
			// What the buffer already holds, up to the frame's length;
			// next grows it as bytes arrive. Where it must grow, at
			// most the bound of it is filled first: that is what grow
			// copies.
			n := min(c.h.Length, uint64(cap(c.buf)))
			if n < c.h.Length {
				n = min(n, c.bound())
			}
			c.cur = c.buf[:n]
		}
		c.inPayload, c.pn = true, 0
		return nil, nil, nil
	}
	c.pn += uint64(n)
	if c.pn < c.h.Length {
		return nil, nil, nil
	}
	// Past the payload: the next header's first bytes, read into hdr.
	c.hn = int(c.pn - c.h.Length)
	c.pn = c.h.Length
	c.inPayload = false
	return &c.h, c.cur, nil
}

// inPlace reports whether the payload of the frame advance just returned
// was read into the sink's buffer (true) or into the cutter's own, to be
// copied by the handler (false). An empty payload is neither; the caller
// counts bytes, so the answer does not matter then.
func (c *cutter) inPlace() bool { return c.sunk }

// check applies the connection rules to a decoded header.
func (c *cutter) check(h *frame.Header) error {
	if node.ID(h.Recipient) != c.self {
		return fmt.Errorf("%w: %s frame for node %d arrived at node %d", errProtocol, h.Type, h.Recipient, c.self)
	}
	if !c.known {
		if h.Type != frame.Hello {
			return fmt.Errorf("%w: first frame is %s, want hello", errProtocol, h.Type)
		}
		if node.ID(h.Sender) == c.self || h.Sender == 0 {
			return fmt.Errorf("%w: hello from invalid node id %d", errProtocol, h.Sender)
		}
		c.peer, c.known = node.ID(h.Sender), true
	} else {
		if node.ID(h.Sender) != c.peer {
			return fmt.Errorf("%w: %s frame claims sender %d on the connection of node %d", errProtocol, h.Type, h.Sender, c.peer)
		}
		if h.Type == frame.Hello {
			return fmt.Errorf("%w: second hello from node %d", errProtocol, h.Sender)
		}
	}
	if (h.Type == frame.Hello || h.Type == frame.Bye) && h.Length != 0 {
		return fmt.Errorf("%w: %s frame with a %d-byte payload", errProtocol, h.Type, h.Length)
	}
	if b := lengthBound(h.Type, c.partBytes); h.Length > b {
		return fmt.Errorf("%w: %s frame with a %d-byte payload; at most %d bytes are legal", errProtocol, h.Type, h.Length, b)
	}
	return nil
}

// maxElemSize bounds a dtype's element size (a partition holds at least one
// element, however small FPT_PARTITION_BYTES is).
const maxElemSize = 16

// lengthBound is the largest payload a member may legally send in a frame
// of type t, checked before any buffer exists: tensor pieces are cut into
// partitions of at most partBytes (lb.Decision.Layout, frame.Chunks), and
// requests and acknowledgements carry nothing. A KVError's reason and an
// App message (package appmsg: a program's keys, values and lengths, not
// cut into partitions) are bounded by MaxPayload (FPT_MAX_FRAME_BYTES)
// only. partBytes 0: no bound but MaxPayload, which Decode applied.
func lengthBound(t frame.Type, partBytes uint64) uint64 {
	switch t {
	case frame.Hello, frame.Bye, frame.KVPull, frame.KVAck, frame.KVMoveEnd, frame.KVPullRange, frame.KVRangeEnd, frame.KVDrained:
		return 0
	case frame.KVMoved:
		return 4 // the owner's id
	case frame.Push, frame.Result, frame.KVPush, frame.KVPushPull, frame.KVData, frame.Params, frame.KVMove:
		if partBytes > 0 {
			return max(partBytes, maxElemSize)
		}
	case frame.KVError, frame.App:
	}
	return math.MaxUint64
}

// feed pushes data through the cutter as if it had been read, calling emit
// per complete frame; it stops at the first error. The fuzz target and the
// unit tests use it; the vans read straight into next() instead.
func (c *cutter) feed(data []byte, emit func(h *frame.Header, payload []byte)) error {
	for len(data) > 0 {
		n := copy(c.next(), data)
		data = data[n:]
		h, p, err := c.advance(n)
		if err != nil {
			return err
		}
		if h != nil {
			emit(h, p)
		}
	}
	return nil
}
