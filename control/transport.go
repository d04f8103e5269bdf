package control

// Transport is a node's end of the control plane, as cluster.Member and the
// scheduler use it. *Plane implements it over ZeroMQ; package
// control/memplane implements it in memory, for tests.
//
// The contract is Plane's: Send never blocks and fails only when the
// message cannot be encoded, the endpoint is malformed, or after Close;
// delivery is in order per sender and recipient; Incoming is closed by
// Close.
type Transport interface {
	// Port is the port the node's endpoint listens on.
	Port() int
	// Incoming yields every message received, in arrival order.
	Incoming() <-chan *Message
	// Send queues m for the node listening at endpoint ("tcp://host:port").
	Send(endpoint string, m *Message) error
	// Close stops the transport and closes Incoming.
	Close() error
}

var _ Transport = (*Plane)(nil)
