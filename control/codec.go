package control

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"

	"github.com/fptps/fpt/node"
)

// Wire format, version 1. Everything is little-endian; the layout is fixed
// so that the encoding is canonical (one message, one byte string), which is
// what lets the fuzzer check decode∘encode as an identity.
//
//	off  size  field
//	0    1     format byte: wireV1 (0xF1, "fpt control, version 1")
//	1    1     Command
//	2    1     Flags
//	3    1     Group
//	4    4     Sender
//	8    4     Recipient
//	12   4     Target
//	16   8     Seq
//	24   4     node count n (≤ MaxNodes)
//	28   ...   n × node: ID u32, Role u8, ControlPort u16, DataPort u16,
//	           host length u8, host bytes
//	     4     Text length (≤ MaxTextLen), then Text
//	     4     Body length (≤ MaxBodyLen), then Body
//
// A later version changes the format byte; a decoder rejects bytes it does
// not know rather than guessing. ps-lite's own frames start with a protobuf
// tag, never 0xF1 in practice, so a stray ps-lite frame is rejected cleanly.

// Limits of the wire format. Decoding checks each before allocating, so a
// hostile or corrupt message costs at most a bounded amount of memory.
const (
	MaxNodes      = 65536    // entries in Nodes
	MaxHostLen    = 255      // bytes in a node's Host
	MaxTextLen    = 64 << 10 // bytes in Text
	MaxBodyLen    = 16 << 20 // bytes in Body
	MaxMessageLen = 32 << 20 // bytes in one encoded message
)

const (
	wireV1     = 0xF1
	headerLen  = 28
	nodeMinLen = 4 + 1 + 2 + 2 + 1 // a node with an empty host
	maxPort    = 65535
)

// ErrMalformed is matched (errors.Is) by every error Unmarshal returns.
var ErrMalformed = errors.New("malformed control message")

// decodeError carries the precise reason while still matching ErrMalformed.
type decodeError struct{ reason string }

func (e *decodeError) Error() string        { return "control: decode: " + e.reason }
func (e *decodeError) Is(target error) bool { return target == ErrMalformed }

func malformed(format string, args ...any) error {
	return &decodeError{reason: fmt.Sprintf(format, args...)}
}

func (c Command) String() string {
	switch c {
	case AddNode:
		return "ADD_NODE"
	case NodeTable:
		return "NODE_TABLE"
	case Barrier:
		return "BARRIER"
	case BarrierDone:
		return "BARRIER_DONE"
	case Heartbeat:
		return "HEARTBEAT"
	case HeartbeatAck:
		return "HEARTBEAT_ACK"
	case NodeFailed:
		return "NODE_FAILED"
	case Terminate:
		return "TERMINATE"
	case Report:
		return "REPORT"
	case Decision:
		return "DECISION"
	case NodeLeft:
		return "NODE_LEFT"
	case NodeJoined:
		return "NODE_JOINED"
	case Joined:
		return "JOINED"
	case Layout:
		return "LAYOUT"
	case Leave:
		return "LEAVE"
	case App:
		return "APP"
	}
	return "command(" + strconv.Itoa(int(c)) + ")"
}

func (c Command) valid() bool { return c >= AddNode && c <= lastCommand }

func validRole(r node.Role) bool {
	return r == node.Scheduler || r == node.Server || r == node.Worker
}

// encodedLen validates m against the wire limits and returns its size.
func (m *Message) encodedLen() (int, error) {
	if !m.Command.valid() {
		return 0, fmt.Errorf("control: encode: unknown command %d", m.Command)
	}
	if len(m.Nodes) > MaxNodes {
		return 0, fmt.Errorf("control: encode: %d nodes, limit %d", len(m.Nodes), MaxNodes)
	}
	if len(m.Text) > MaxTextLen {
		return 0, fmt.Errorf("control: encode: text of %d bytes, limit %d", len(m.Text), MaxTextLen)
	}
	if len(m.Body) > MaxBodyLen {
		return 0, fmt.Errorf("control: encode: body of %d bytes, limit %d", len(m.Body), MaxBodyLen)
	}
	n := headerLen + 4 + len(m.Text) + 4 + len(m.Body)
	for i := range m.Nodes {
		in := &m.Nodes[i]
		switch {
		case len(in.Host) > MaxHostLen:
			return 0, fmt.Errorf("control: encode: node %d: host of %d bytes, limit %d", i, len(in.Host), MaxHostLen)
		case !validRole(in.Role):
			return 0, fmt.Errorf("control: encode: node %d: invalid role %d", i, in.Role)
		case in.ControlPort < 0 || in.ControlPort > maxPort:
			return 0, fmt.Errorf("control: encode: node %d: control port %d out of range", i, in.ControlPort)
		case in.DataPort < 0 || in.DataPort > maxPort:
			return 0, fmt.Errorf("control: encode: node %d: data port %d out of range", i, in.DataPort)
		}
		n += nodeMinLen + len(in.Host)
	}
	if n > MaxMessageLen {
		return 0, fmt.Errorf("control: encode: message of %d bytes, limit %d", n, MaxMessageLen)
	}
	return n, nil
}

// AppendBinary appends m's encoding to b (encoding.BinaryAppender). It fails,
// leaving b unchanged, when m breaks a limit of the wire format or names an
// unknown command or role; whatever it accepts, Unmarshal accepts.
func (m *Message) AppendBinary(b []byte) ([]byte, error) {
	n, err := m.encodedLen()
	if err != nil {
		return b, err
	}
	b = grow(b, n)
	b = append(b, wireV1, byte(m.Command), m.Flags, byte(m.Group))
	b = binary.LittleEndian.AppendUint32(b, uint32(m.Sender))
	b = binary.LittleEndian.AppendUint32(b, uint32(m.Recipient))
	b = binary.LittleEndian.AppendUint32(b, uint32(m.Target))
	b = binary.LittleEndian.AppendUint64(b, m.Seq)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(m.Nodes)))
	for i := range m.Nodes {
		in := &m.Nodes[i]
		b = binary.LittleEndian.AppendUint32(b, uint32(in.ID))
		b = append(b, byte(in.Role))
		b = binary.LittleEndian.AppendUint16(b, uint16(in.ControlPort))
		b = binary.LittleEndian.AppendUint16(b, uint16(in.DataPort))
		b = append(b, byte(len(in.Host)))
		b = append(b, in.Host...)
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(m.Text)))
	b = append(b, m.Text...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(m.Body)))
	b = append(b, m.Body...)
	return b, nil
}

// MarshalBinary encodes m (encoding.BinaryMarshaler); see AppendBinary.
func (m *Message) MarshalBinary() ([]byte, error) {
	return m.AppendBinary(nil)
}

// grow makes room for n more bytes in one allocation.
func grow(b []byte, n int) []byte {
	if cap(b)-len(b) >= n {
		return b
	}
	nb := make([]byte, len(b), len(b)+n)
	copy(nb, b)
	return nb
}

// reader walks an input buffer; every accessor checks the bounds first, so
// decoding cannot index out of range whatever the input.
type reader struct {
	b   []byte
	off int
}

func (r *reader) left() int { return len(r.b) - r.off }

func (r *reader) bytes(n int, what string) ([]byte, error) {
	if n < 0 || n > r.left() {
		return nil, malformed("%s: need %d bytes at offset %d, have %d", what, n, r.off, r.left())
	}
	s := r.b[r.off : r.off+n]
	r.off += n
	return s, nil
}

func (r *reader) u32(what string) (uint32, error) {
	s, err := r.bytes(4, what)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(s), nil
}

// Unmarshal decodes one message. It never panics and allocates only after
// checking each length against the limits and against the bytes actually
// present. Unknown format bytes, commands and roles, and trailing bytes, are
// errors (matching ErrMalformed). The result does not alias b.
func Unmarshal(b []byte) (*Message, error) {
	m := new(Message)
	if err := m.UnmarshalBinary(b); err != nil {
		return nil, err
	}
	return m, nil
}

// UnmarshalBinary decodes b into m (encoding.BinaryUnmarshaler), replacing
// all of m's fields; see Unmarshal. On error m is left unchanged.
func (m *Message) UnmarshalBinary(b []byte) error {
	if len(b) > MaxMessageLen {
		return malformed("message of %d bytes, limit %d", len(b), MaxMessageLen)
	}
	if len(b) < headerLen {
		return malformed("message of %d bytes, shorter than the %d-byte header", len(b), headerLen)
	}
	if b[0] != wireV1 {
		return malformed("unknown format byte 0x%02x (want 0x%02x)", b[0], wireV1)
	}
	var out Message
	out.Command = Command(b[1])
	if !out.Command.valid() {
		return malformed("unknown command %d", b[1])
	}
	out.Flags = b[2]
	out.Group = node.Group(b[3])
	out.Sender = node.ID(binary.LittleEndian.Uint32(b[4:]))
	out.Recipient = node.ID(binary.LittleEndian.Uint32(b[8:]))
	out.Target = node.ID(binary.LittleEndian.Uint32(b[12:]))
	out.Seq = binary.LittleEndian.Uint64(b[16:])
	count := binary.LittleEndian.Uint32(b[24:])
	r := reader{b: b, off: headerLen}
	if count > MaxNodes {
		return malformed("%d nodes, limit %d", count, MaxNodes)
	}
	// Each node takes at least nodeMinLen bytes: refuse counts the input
	// cannot hold before allocating the slice.
	if int(count) > r.left()/nodeMinLen {
		return malformed("%d nodes cannot fit in the %d bytes left", count, r.left())
	}
	if count > 0 {
		out.Nodes = make([]node.Info, count)
	}
	for i := range out.Nodes {
		in := &out.Nodes[i]
		fixed, err := r.bytes(nodeMinLen, "node "+strconv.Itoa(i))
		if err != nil {
			return err
		}
		in.ID = node.ID(binary.LittleEndian.Uint32(fixed))
		in.Role = node.Role(fixed[4])
		if !validRole(in.Role) {
			return malformed("node %d: invalid role %d", i, fixed[4])
		}
		in.ControlPort = int(binary.LittleEndian.Uint16(fixed[5:]))
		in.DataPort = int(binary.LittleEndian.Uint16(fixed[7:]))
		host, err := r.bytes(int(fixed[9]), "node "+strconv.Itoa(i)+" host")
		if err != nil {
			return err
		}
		in.Host = string(host)
	}
	n, err := r.u32("text length")
	if err != nil {
		return err
	}
	if n > MaxTextLen {
		return malformed("text of %d bytes, limit %d", n, MaxTextLen)
	}
	text, err := r.bytes(int(n), "text")
	if err != nil {
		return err
	}
	out.Text = string(text)
	if n, err = r.u32("body length"); err != nil {
		return err
	}
	if n > MaxBodyLen {
		return malformed("body of %d bytes, limit %d", n, MaxBodyLen)
	}
	body, err := r.bytes(int(n), "body")
	if err != nil {
		return err
	}
	if len(body) > 0 {
		out.Body = append([]byte(nil), body...)
	}
	if r.left() != 0 {
		return malformed("%d trailing bytes", r.left())
	}
	*m = out
	return nil
}
