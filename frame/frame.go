// Package frame is the data plane's wire format: a fixed 72-byte
// little-endian header followed by a payload.
//
// The header carries everything a receiver needs to place the payload
// (key, partition, iteration, byte offset within the tensor, the tensor's
// total size) and a CRC-32C of itself, so that a corrupt or foreign stream
// is recognised before a single payload byte is allocated. Lengths are 64-bit:
// tensors larger than 2 GiB are ordinary.
//
// The package is pure: it encodes and validates, it does no I/O.
package frame

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// HeaderSize is the encoded size of a Header.
const HeaderSize = 72

// Magic opens every header ("FPT1" read as little-endian bytes).
const Magic uint32 = 0x31545046

// Version is the header layout version this package speaks.
const Version uint8 = 1

// Type says what a frame is.
type Type uint8

// Frame types. Push and Result carry FPT traffic (aggregate and broadcast);
// the KV* types carry ps-lite's classic key-value requests; App carries
// the messages ps-lite's C++ API (include/ps) is built on.
const (
	// Hello opens a connection: its Sender names the dialling node.
	Hello Type = 1 + iota
	// Bye announces an orderly close; an EOF after it is not a failure.
	Bye
	// Push is a worker's contribution to one partition of one iteration.
	Push
	// Result is an aggregator's sum of a partition, sent to every worker.
	Result
	// KVPush adds the payload into a server's stored value (classic Push).
	KVPush
	// KVPull asks a server for a stored value (classic Pull).
	KVPull
	// KVPushPull adds, then answers with the new value (classic PushPull).
	KVPushPull
	// KVAck acknowledges a KVPush.
	KVAck
	// KVData answers a KVPull or KVPushPull with (a chunk of) a value.
	KVData
	// KVError answers a classic request that failed; the payload is the reason.
	KVError
	// App carries one message between customers (ps-lite's Customer and
	// Message, fpt.h's fpt_msg_send): its payload is package appmsg's
	// encoding, not tensor data, so DType, Key, Offset and Total are 0.
	App
	// Params carries (a partition of) a key's parameters from a worker to
	// one that joins the running job at Iteration: the values it starts
	// from, as its Init's. A Params frame with FlagRefused instead says
	// why the sender has none (its payload, text; no DType).
	Params
	// KVMoved answers a classic request sent to a server that no longer
	// owns the key: Iteration is the server's layout version (package
	// classic), the payload the owner's id (4 bytes, little-endian). The
	// worker sends the request again, to that owner.
	KVMoved
	// KVMove carries (a chunk of) a classic value from the server that
	// owned its key to the one that owns it in layout version Iteration.
	KVMove
	// KVMoveEnd follows a server's KVMove frames of layout version
	// Iteration to one server: Aux is how many there were (none is a
	// valid count), so that the receiver knows when it has them all.
	KVMoveEnd
	// KVPullRange asks a server for every classic key it holds in
	// [Key, Total) (Total 0: no upper bound) of DType, under layout
	// version Iteration. The answer is a KVData frame per chunk of each
	// key, then a KVRangeEnd.
	KVPullRange
	// KVRangeEnd ends a server's answer to a KVPullRange: Total is how
	// many KVData frames it sent.
	KVRangeEnd
	// KVDrained tells a server that the worker's layout (version
	// Iteration) leaves out, a leaving one or one not counted yet, that
	// this worker sends it nothing more under that layout: Total is how
	// many classic requests (KVPush, KVPull, KVPushPull, KVPullRange
	// frames) it sent it in all, so that a server leaving the job knows
	// when it has answered them all.
	KVDrained
	lastType = KVDrained
)

var typeNames = [...]string{"", "hello", "bye", "push", "result", "kv-push", "kv-pull", "kv-pushpull", "kv-ack", "kv-data", "kv-error", "app", "params", "kv-moved", "kv-move", "kv-move-end", "kv-pull-range", "kv-range-end", "kv-drained"}

func (t Type) String() string {
	if t == 0 || t > lastType {
		return fmt.Sprintf("type(%d)", uint8(t))
	}
	return typeNames[t]
}

// carriesTensor reports whether a frame's payload is tensor data.
func (t Type) carriesTensor() bool {
	switch t {
	case Push, Result, KVPush, KVPushPull, KVData, Params, KVMove:
		return true
	}
	return false
}

// DType is the element type of a tensor payload.
type DType uint8

// Element types, as MXNet uses them.
const (
	Float32 DType = 1 + iota
	Float64
	Float16
	// BFloat16 is bfloat16: float32's sign and exponent with 7 fraction
	// bits (its top 16 bits), as GPUs train in.
	BFloat16
	lastDType = BFloat16
)

// Size is the size of one element in bytes (0 for an unknown type).
func (d DType) Size() int {
	switch d {
	case Float32:
		return 4
	case Float64:
		return 8
	case Float16, BFloat16:
		return 2
	}
	return 0
}

func (d DType) String() string {
	switch d {
	case Float32:
		return "float32"
	case Float64:
		return "float64"
	case Float16:
		return "float16"
	case BFloat16:
		return "bfloat16"
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// ParseDType reads a dtype by name ("float32", "float64", "float16",
// "bfloat16").
func ParseDType(s string) (DType, error) {
	for d := Float32; d <= lastDType; d++ {
		if d.String() == s {
			return d, nil
		}
	}
	return 0, fmt.Errorf("unknown dtype %q (want float32, float64, float16 or bfloat16)", s)
}

// Header is the fixed part of a frame.
type Header struct {
	Type  Type
	DType DType // element type of a tensor payload; 0 otherwise
	Flags uint8 // see Flag*
	// Sender and Recipient are node ids (node.ID; kept as uint32 so that
	// this package depends on nothing).
	Sender    uint32
	Recipient uint32
	Key       uint64
	Iteration uint64 // FPT: the key's iteration; classic: the layout version (package classic)
	Offset    uint64 // byte offset of the payload within the tensor
	Total     uint64 // the tensor's size in bytes
	Length    uint64 // payload size in bytes
	Partition uint32
	Priority  int32 // larger is more urgent (ps-lite convention)
	// Aux is the classic request's timestamp, or for FPT frames the
	// version of the decision that placed the partition.
	Aux uint32
}

// Flags.
const (
	// FlagInit marks the init round of a key: the aggregator takes worker
	// 0's value instead of a sum.
	FlagInit uint8 = 1 << iota
	// FlagRefused marks a Params frame that carries the reason the sender
	// has no parameters to give, not values.
	FlagRefused
	// FlagHostSum marks a Push that carries the sum of the sender's local
	// group (package localagg): it counts for every worker of the group.
	FlagHostSum
)

// Errors returned by Decode. They are wrapped with detail; test with errors.Is.
var (
	ErrShort    = errors.New("frame: short header")
	ErrMagic    = errors.New("frame: bad magic")
	ErrVersion  = errors.New("frame: unsupported version")
	ErrChecksum = errors.New("frame: header checksum mismatch")
	ErrInvalid  = errors.New("frame: invalid header")
	ErrTooLarge = errors.New("frame: payload larger than allowed")
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Encode writes h into dst[:HeaderSize]; dst must be at least that long.
func (h *Header) Encode(dst []byte) {
	_ = dst[HeaderSize-1]
	le := binary.LittleEndian
	le.PutUint32(dst[0:], Magic)
	dst[4] = Version
	dst[5] = byte(h.Type)
	dst[6] = byte(h.DType)
	dst[7] = h.Flags
	le.PutUint32(dst[8:], h.Sender)
	le.PutUint32(dst[12:], h.Recipient)
	le.PutUint64(dst[16:], h.Key)
	le.PutUint64(dst[24:], h.Iteration)
	le.PutUint64(dst[32:], h.Offset)
	le.PutUint64(dst[40:], h.Total)
	le.PutUint64(dst[48:], h.Length)
	le.PutUint32(dst[56:], h.Partition)
	le.PutUint32(dst[60:], uint32(h.Priority))
	le.PutUint32(dst[64:], h.Aux)
	le.PutUint32(dst[68:], crc32.Checksum(dst[:68], castagnoli))
}

// Decode parses and validates a header. maxPayload bounds Length: a header
// announcing more is rejected before the caller allocates anything.
func Decode(src []byte, maxPayload uint64) (Header, error) {
	if len(src) < HeaderSize {
		return Header{}, fmt.Errorf("%w: %d bytes", ErrShort, len(src))
	}
	le := binary.LittleEndian
	if m := le.Uint32(src[0:]); m != Magic {
		return Header{}, fmt.Errorf("%w: %#08x", ErrMagic, m)
	}
	if src[4] != Version {
		return Header{}, fmt.Errorf("%w: %d", ErrVersion, src[4])
	}
	if want, got := crc32.Checksum(src[:68], castagnoli), le.Uint32(src[68:]); want != got {
		return Header{}, fmt.Errorf("%w: %#08x, computed %#08x", ErrChecksum, got, want)
	}
	h := Header{
		Type:      Type(src[5]),
		DType:     DType(src[6]),
		Flags:     src[7],
		Sender:    le.Uint32(src[8:]),
		Recipient: le.Uint32(src[12:]),
		Key:       le.Uint64(src[16:]),
		Iteration: le.Uint64(src[24:]),
		Offset:    le.Uint64(src[32:]),
		Total:     le.Uint64(src[40:]),
		Length:    le.Uint64(src[48:]),
		Partition: le.Uint32(src[56:]),
		Priority:  int32(le.Uint32(src[60:])),
		Aux:       le.Uint32(src[64:]),
	}
	if err := h.Validate(maxPayload); err != nil {
		return Header{}, err
	}
	return h, nil
}

// Validate checks the header's fields against each other and against
// maxPayload. Encode does not call it; senders construct valid headers and
// tests may want invalid ones.
func (h *Header) Validate(maxPayload uint64) error {
	if h.Type == 0 || h.Type > lastType {
		return fmt.Errorf("%w: unknown type %d", ErrInvalid, uint8(h.Type))
	}
	if h.Length > maxPayload {
		return fmt.Errorf("%w: %d > %d bytes (%s)", ErrTooLarge, h.Length, maxPayload, h.Type)
	}
	if !h.Type.carriesTensor() || h.Type == Params && h.Flags&FlagRefused != 0 {
		return nil
	}
	es := h.DType.Size()
	if es == 0 {
		return fmt.Errorf("%w: %s frame with unknown dtype %d", ErrInvalid, h.Type, uint8(h.DType))
	}
	if h.Offset > h.Total || h.Length > h.Total-h.Offset {
		return fmt.Errorf("%w: %s payload [%d, +%d) outside tensor of %d bytes", ErrInvalid, h.Type, h.Offset, h.Length, h.Total)
	}
	if h.Offset%uint64(es) != 0 || h.Length%uint64(es) != 0 || h.Total%uint64(es) != 0 {
		return fmt.Errorf("%w: %s offset %d, length %d or total %d not a multiple of %s's %d bytes", ErrInvalid, h.Type, h.Offset, h.Length, h.Total, h.DType, es)
	}
	return nil
}

func (h *Header) String() string {
	return fmt.Sprintf("%s %d->%d key=%d part=%d iter=%d [%d,+%d)/%d %s prio=%d aux=%d",
		h.Type, h.Sender, h.Recipient, h.Key, h.Partition, h.Iteration, h.Offset, h.Length, h.Total, h.DType, h.Priority, h.Aux)
}
