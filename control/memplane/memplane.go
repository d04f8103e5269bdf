// Package memplane is an in-memory control plane for tests: Plane
// implements control.Transport without sockets or ZeroMQ, so that a whole
// cluster (the real scheduler, servers and workers) can run in one process.
//
// Planes reach each other through a shared Network, by port: the network
// is one host, and an endpoint's host part is checked for form only. As
// over ZeroMQ, Send never blocks (unless a test Stalls it), messages are
// encoded and decoded as on the wire (the receiver never shares the
// sender's Message), delivery is in order per sender and recipient, and a message to a port nobody listens on
// yet waits for its listener.
//
// A test can hold the messages from one port to another and release them
// later (Hold, Release), or cut a node off (Drop): what it sends and what is
// sent to it is lost from then on, as if its host had vanished.
package memplane

import (
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/fptps/fpt/control"
)

// firstPort is where the ports Listen(0) picks begin. They go up in steps
// of two, leaving each node's data port (control port + 1) to its van.
const firstPort = 30000

// Network is a set of planes that reach each other by port.
type Network struct {
	mu       sync.Mutex
	planes   map[int]*Plane
	waiting  map[int][]parcel // sent to a port before anyone listened on it
	held     map[route][]parcel
	dropped  map[int]bool
	stalls   map[int]chan struct{} // Stall's ports: closed by Unstall
	nextPort int
}

// route is the direction from one port to another.
type route struct{ from, to int }

// parcel is one encoded message and the connection it came over: the
// sender's port, which stands for the authenticated peer of the real plane.
type parcel struct {
	origin string
	b      []byte
}

// Origin is the control.Message.Origin of messages sent from port.
func Origin(port int) string { return "mem:" + strconv.Itoa(port) }

// NewNetwork returns an empty network.
func NewNetwork() *Network {
	return &Network{
		planes:   make(map[int]*Plane),
		waiting:  make(map[int][]parcel),
		held:     make(map[route][]parcel),
		dropped:  make(map[int]bool),
		stalls:   make(map[int]chan struct{}),
		nextPort: firstPort,
	}
}

// Listen opens a plane on port (0: a free one). log receives warnings
// about malformed messages (slog.Default() when nil).
func (n *Network) Listen(port int, log *slog.Logger) (*Plane, error) {
	if log == nil {
		log = slog.Default()
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if port == 0 {
		for n.planes[n.nextPort] != nil || n.dropped[n.nextPort] {
			n.nextPort += 2
		}
		port = n.nextPort
		n.nextPort += 2
	}
	if port < 0 || port > 65535 {
		return nil, fmt.Errorf("memplane: listen: port %d out of range", port)
	}
	if n.planes[port] != nil || n.dropped[port] {
		return nil, fmt.Errorf("memplane: listen on port %d: address already in use", port)
	}
	p := &Plane{
		net:  n,
		port: port,
		log:  log,
		in:   make(chan *control.Message, 64),
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
	p.cond.L = &p.mu
	p.queue = n.waiting[port]
	delete(n.waiting, port)
	n.planes[port] = p
	go p.pump()
	return p, nil
}

// Stall makes every Send from port block until Unstall, as a transport
// whose send waits (on a lock, on its I/O thread) would: a test of what a
// node does while it cannot hand a control message over. Unstall before
// closing the network's planes.
func (n *Network) Stall(port int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stalls[port] == nil {
		n.stalls[port] = make(chan struct{})
	}
}

// Unstall lets port's blocked and later Sends go on.
func (n *Network) Unstall(port int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if ch := n.stalls[port]; ch != nil {
		close(ch)
		delete(n.stalls, port)
	}
}

func (n *Network) stalled(port int) <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.stalls[port]
}

// Hold keeps the messages from port from to port to until Release.
func (n *Network) Hold(from, to int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	r := route{from, to}
	if _, ok := n.held[r]; !ok {
		n.held[r] = nil
	}
}

// Held decodes what Hold is keeping from port from to port to, in the
// order sent (nil when the route is not held).
func (n *Network) Held(from, to int) ([]*control.Message, error) {
	n.mu.Lock()
	parcels := slices.Clone(n.held[route{from, to}])
	n.mu.Unlock()
	var out []*control.Message
	for _, b := range parcels {
		m, err := control.Unmarshal(b.b)
		if err != nil {
			return nil, fmt.Errorf("memplane: held message: %w", err)
		}
		out = append(out, m)
	}
	return out, nil
}

// Release delivers, in order, the messages held from port from to port
// to, and lets later ones through.
func (n *Network) Release(from, to int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	r := route{from, to}
	msgs := n.held[r]
	delete(n.held, r)
	for _, b := range msgs {
		n.deliverLocked(to, b)
	}
}

// Drop cuts the node on port off: messages it sends, messages sent to it,
// and messages held for it are lost from now on. Its Plane stays open, as
// the process behind a vanished host would not know.
func (n *Network) Drop(port int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.dropped[port] = true
	for r := range n.held {
		if r.from == port || r.to == port {
			delete(n.held, r)
		}
	}
	delete(n.waiting, port)
}

// route passes one encoded message from port from to port to.
func (n *Network) route(from, to int, b []byte) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.dropped[from] || n.dropped[to] {
		return
	}
	if msgs, ok := n.held[route{from, to}]; ok {
		n.held[route{from, to}] = append(msgs, parcel{Origin(from), b})
		return
	}
	n.deliverLocked(to, parcel{Origin(from), b})
}

func (n *Network) deliverLocked(to int, b parcel) {
	if p := n.planes[to]; p != nil {
		p.enqueue(b)
		return
	}
	n.waiting[to] = append(n.waiting[to], b)
}

func (n *Network) leave(p *Plane) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.planes[p.port] == p {
		delete(n.planes, p.port)
	}
}

// Plane is one node's end of a Network; it implements control.Transport.
type Plane struct {
	net  *Network
	port int
	log  *slog.Logger

	in   chan *control.Message
	stop chan struct{} // closed by Close
	done chan struct{} // closed when pump has returned

	closeOnce sync.Once

	mu     sync.Mutex
	cond   sync.Cond // pump waiting for the queue or Close
	queue  []parcel  // arrived, not yet decoded and handed to in
	closed bool
}

var _ control.Transport = (*Plane)(nil)

// Port implements control.Transport.
func (p *Plane) Port() int { return p.port }

// Incoming implements control.Transport.
func (p *Plane) Incoming() <-chan *control.Message { return p.in }

// Send implements control.Transport: it encodes m, and the network delivers
// it before Send returns (to the recipient's queue; Incoming yields it in
// turn).
func (p *Plane) Send(endpoint string, m *control.Message) error {
	port, err := endpointPort(endpoint)
	if err != nil {
		return err
	}
	if ch := p.net.stalled(p.port); ch != nil {
		<-ch
	}
	b, err := m.MarshalBinary()
	if err != nil {
		return err
	}
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return control.ErrClosed
	}
	p.net.route(p.port, port, b)
	return nil
}

// Close implements control.Transport: it leaves the network, drops what
// has arrived but not been taken from Incoming, and closes Incoming.
func (p *Plane) Close() error {
	p.closeOnce.Do(func() {
		p.net.leave(p)
		p.mu.Lock()
		p.closed = true
		p.queue = nil
		p.cond.Broadcast()
		p.mu.Unlock()
		close(p.stop)
	})
	<-p.done
	return nil
}

func (p *Plane) enqueue(b parcel) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.queue = append(p.queue, b)
	p.cond.Signal()
}

// pump decodes arrivals in order and hands them to Incoming, so that Send
// never waits for the recipient's reader.
func (p *Plane) pump() {
	defer close(p.done)
	defer close(p.in)
	for {
		p.mu.Lock()
		for len(p.queue) == 0 && !p.closed {
			p.cond.Wait()
		}
		if p.closed {
			p.mu.Unlock()
			return
		}
		b := p.queue[0]
		p.queue = p.queue[1:]
		p.mu.Unlock()
		m, err := control.Unmarshal(b.b)
		if err != nil {
			p.log.Warn("memplane: dropping a malformed message", "err", err)
			continue
		}
		m.Origin = b.origin
		select {
		case p.in <- m:
		case <-p.stop:
			return
		}
	}
}

// endpointPort checks that endpoint reads tcp://host:port, as the real
// plane requires, and returns its port.
func endpointPort(endpoint string) (int, error) {
	rest, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok {
		return 0, fmt.Errorf("memplane: send: endpoint %q: want tcp://host:port", endpoint)
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil {
		return 0, fmt.Errorf("memplane: send: endpoint %q: %w", endpoint, err)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n <= 0 || n > 65535 {
		return 0, fmt.Errorf("memplane: send: endpoint %q: bad port %q", endpoint, port)
	}
	if host == "" {
		return 0, fmt.Errorf("memplane: send: endpoint %q: no host", endpoint)
	}
	return n, nil
}
