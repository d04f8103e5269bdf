package frame

// Message is one outgoing frame: what a pure core returns for its shell to
// send, and what a van queues. The van never copies Payload or More: the
// slices must stay untouched until Done has been called.
type Message struct {
	Header  Header // Sender and Length are set by the van (Self, Len())
	Payload []byte
	// More continues the payload: the frame carries Payload, then each of
	// More in order, gathered by the van's write without a copy (a
	// message's parts in the sender's own memory).
	More [][]byte
	// Done, if set, is called exactly once, on the van's sender goroutine,
	// when the frame has been written to the socket (err == nil) or can no
	// longer be (err != nil: the peer is gone or the van closed). It must
	// not block. It is not called when the van's Send or Forward return an
	// error.
	Done func(err error)
}

// Len is the payload's length: Payload's and More's.
func (m *Message) Len() int {
	n := len(m.Payload)
	for _, b := range m.More {
		n += len(b)
	}
	return n
}

// Parts appends the payload's non-empty parts, in order, to dst.
func (m *Message) Parts(dst [][]byte) [][]byte {
	if len(m.Payload) > 0 {
		dst = append(dst, m.Payload)
	}
	for _, b := range m.More {
		if len(b) > 0 {
			dst = append(dst, b)
		}
	}
	return dst
}
