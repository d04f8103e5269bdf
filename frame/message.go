package frame

// Message is one outgoing frame: what a pure core returns for its shell to
// send, and what a van queues. The van never copies Payload: the slice
// must stay untouched until Done has been called.
type Message struct {
	Header  Header // Sender and Length are set by the van (Self, len(Payload))
	Payload []byte
	// Done, if set, is called exactly once, on the van's sender goroutine,
	// when the frame has been written to the socket (err == nil) or can no
	// longer be (err != nil: the peer is gone or the van closed). It must
	// not block. It is not called when the van's Send or Forward return an
	// error.
	Done func(err error)
}
