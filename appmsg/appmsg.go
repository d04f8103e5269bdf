// Package appmsg is the encoding of one message between customers
// (ps-lite's Message; fpt.h's fpt_msg_meta and up to FPT_MSG_MAX_SEGMENTS
// segments), the payload of a frame.App data-plane frame.
//
// The frame header already carries the sender, the recipient and the
// priority; the payload carries the rest of the meta, the segments'
// lengths and their bytes, laid end to end:
//
//	offset size
//	0      1    version (1)
//	1      1    number of segments, at most MaxSegments
//	2      1    dtype: 0, or a frame.DType
//	3      1    reserved, 0
//	4      4    flags (Request|Push|Pull|Simple; never Failed)
//	8      4    app id
//	12     4    customer id
//	16     4    timestamp
//	20     4    head
//	24     8*n  the segments' lengths
//	...         the segments' bytes
//
// Everything is little-endian. Decode validates every field and length
// against the payload it was given before it allocates anything; its
// segments alias that payload.
//
// The package is pure: it encodes and validates, it does no I/O.
package appmsg

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/fptps/fpt/frame"
)

// Version is the layout this package speaks.
const Version uint8 = 1

// MaxSegments is the most segments a message carries (fpt.h's
// FPT_MSG_MAX_SEGMENTS: ps-lite's keys, vals, lens, and one spare).
const MaxSegments = 4

// fixedSize is the size of the fixed part, before the segments' lengths.
const fixedSize = 24

// Overhead is the most bytes an encoding adds to its segments' bytes.
const Overhead = fixedSize + 8*MaxSegments

// Flags, as fpt.h's FPT_MSG_*.
const (
	Request uint32 = 1  // a request (else a response to one)
	Push    uint32 = 2  // ps-lite's meta.push
	Pull    uint32 = 4  // ps-lite's meta.pull
	Simple  uint32 = 8  // a SimpleApp message
	Failed  uint32 = 16 // delivered only: the cluster failed; never on the wire
	// wireFlags are the flags a message may carry on the wire.
	wireFlags = Request | Push | Pull | Simple
)

// Meta is fpt_msg_meta. Sender, Recipient and Priority travel in the frame
// header, not in the payload.
type Meta struct {
	App, Customer int32
	Timestamp     int32
	Head          int32
	Sender        uint32
	Recipient     uint32
	Flags         uint32
	DType         frame.DType // 0 when the data are not tensor values
	Priority      int32
}

// Message is a meta and its segments.
type Message struct {
	Meta     Meta
	Segments [][]byte
	// Buffer, when set, is the memory the segments alias, which the
	// receiver's allocator made (customer.Allocator): whoever holds the
	// message last frees it there. Never encoded.
	Buffer []byte
}

// ErrInvalid is returned (wrapped, with detail) for a message that cannot
// be encoded or a payload that is not one.
var ErrInvalid = errors.New("appmsg: invalid message")

// Check validates what a sender gives: at most MaxSegments segments, a
// known dtype (or 0), only wire flags, and at most maxBytes of payload in
// all (FPT_MAX_FRAME_BYTES). Encode does not call it.
func Check(m *Meta, segs [][]byte, maxBytes uint64) error {
	if len(segs) > MaxSegments {
		return fmt.Errorf("%w: %d segments, at most %d", ErrInvalid, len(segs), MaxSegments)
	}
	if m.DType != 0 && m.DType.Size() == 0 {
		return fmt.Errorf("%w: unknown dtype %d", ErrInvalid, m.DType)
	}
	if m.Flags&^wireFlags != 0 {
		return fmt.Errorf("%w: flags %#x (only FPT_MSG_REQUEST, _PUSH, _PULL and _SIMPLE may be sent)", ErrInvalid, m.Flags)
	}
	if n := Size(segs); n > maxBytes {
		return fmt.Errorf("%w: %d bytes with the message's header, more than FPT_MAX_FRAME_BYTES (%d)", ErrInvalid, n, maxBytes)
	}
	return nil
}

// Size is the encoded size of a message with segs (which Check has
// bounded to MaxSegments). It saturates rather than overflows.
func Size(segs [][]byte) uint64 {
	n := uint64(fixedSize + 8*len(segs))
	for _, s := range segs {
		if uint64(len(s)) > math.MaxUint64-n {
			return math.MaxUint64
		}
		n += uint64(len(s))
	}
	return n
}

// Encode appends the payload of m (meta and segments, copied) to dst and
// returns it. m must pass Check.
func Encode(dst []byte, m *Meta, segs [][]byte) []byte {
	dst = EncodeHead(dst, m, segs)
	for _, s := range segs {
		dst = append(dst, s...)
	}
	return dst
}

// EncodeHead appends what Encode puts before the segments' bytes (the
// meta and the segments' lengths) to dst and returns it: the head of a
// payload whose segments a gathering write sends from where they lie.
func EncodeHead(dst []byte, m *Meta, segs [][]byte) []byte {
	le := binary.LittleEndian
	var fixed [fixedSize]byte
	fixed[0] = Version
	fixed[1] = byte(len(segs))
	fixed[2] = byte(m.DType)
	le.PutUint32(fixed[4:], m.Flags)
	le.PutUint32(fixed[8:], uint32(m.App))
	le.PutUint32(fixed[12:], uint32(m.Customer))
	le.PutUint32(fixed[16:], uint32(m.Timestamp))
	le.PutUint32(fixed[20:], uint32(m.Head))
	dst = append(dst, fixed[:]...)
	for _, s := range segs {
		dst = le.AppendUint64(dst, uint64(len(s)))
	}
	return dst
}

// Decode parses a payload. The meta's Sender, Recipient and Priority are
// left 0 (they are the frame header's). The segments alias payload: copy
// it first if it is not yours to keep. Every length is checked against
// len(payload) before the segment list is made.
func Decode(payload []byte) (Message, error) {
	if len(payload) < fixedSize {
		return Message{}, fmt.Errorf("%w: %d bytes, shorter than the %d-byte header", ErrInvalid, len(payload), fixedSize)
	}
	if payload[0] != Version {
		return Message{}, fmt.Errorf("%w: version %d, want %d", ErrInvalid, payload[0], Version)
	}
	n := int(payload[1])
	if n > MaxSegments {
		return Message{}, fmt.Errorf("%w: %d segments, at most %d", ErrInvalid, n, MaxSegments)
	}
	le := binary.LittleEndian
	m := Meta{
		DType:     frame.DType(payload[2]),
		Flags:     le.Uint32(payload[4:]),
		App:       int32(le.Uint32(payload[8:])),
		Customer:  int32(le.Uint32(payload[12:])),
		Timestamp: int32(le.Uint32(payload[16:])),
		Head:      int32(le.Uint32(payload[20:])),
	}
	if m.DType != 0 && m.DType.Size() == 0 {
		return Message{}, fmt.Errorf("%w: unknown dtype %d", ErrInvalid, payload[2])
	}
	if payload[3] != 0 {
		return Message{}, fmt.Errorf("%w: reserved byte %d", ErrInvalid, payload[3])
	}
	if m.Flags&^wireFlags != 0 {
		return Message{}, fmt.Errorf("%w: flags %#x", ErrInvalid, m.Flags)
	}
	lens := payload[fixedSize:]
	if len(lens) < 8*n {
		return Message{}, fmt.Errorf("%w: %d segments' lengths need %d bytes, %d left", ErrInvalid, n, 8*n, len(lens))
	}
	data := lens[8*n:]
	rest := uint64(len(data))
	for i := range n {
		l := le.Uint64(lens[8*i:])
		if l > rest {
			return Message{}, fmt.Errorf("%w: segment %d of %d bytes; only %d bytes left", ErrInvalid, i, l, rest)
		}
		rest -= l
	}
	if rest != 0 {
		return Message{}, fmt.Errorf("%w: %d bytes after the last segment", ErrInvalid, rest)
	}
	var segs [][]byte
	if n > 0 {
		segs = make([][]byte, n)
		for i := range segs {
			l := le.Uint64(lens[8*i:])
			segs[i], data = data[:l:l], data[l:]
		}
	}
	return Message{Meta: m, Segments: segs}, nil
}
