// Package memvan is an in-memory data plane for tests: Van implements
// van.Transport without sockets, so that a whole cluster (the real
// scheduler, servers and workers) can run in one process, fast and under
// the test's control.
//
// Vans reach each other through a shared Network, by port (the network is
// one host). They keep the real vans' contract: every frame goes through
// the same send pool (priorities, weights, shaping, back-pressure on Send,
// none on Forward) and one sender goroutine; a Message's payload is copied
// when the sender "writes" it, and Done is called then, on the sender
// goroutine; frames arrive in order per pair of nodes, their headers
// encoded and checked as on the wire, and the Handler is called from one
// receiver goroutine per van (as the epoll van does), through the handler's
// van.Sink when it has one; Dial says Hello and Close says Bye, so that a
// peer that leaves is not lost, while a connection that ends otherwise is
// reported once with PeerLost on each side. Stats count what the real vans
// count (Hello and Bye included); busy times are the time spent copying.
//
// A test can hold the frames from one node to another and release them
// later (Hold, Release), or drop a node (Drop): its connections break and
// both sides see PeerLost, as when a host vanishes or a link is cut. A
// held direction is unbounded (the sender does not stall on it).
package memvan

import (
	"context"
	"crypto/hmac"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/van"
	"github.com/fptps/fpt/van/internal/peerstat"
	"github.com/fptps/fpt/van/internal/sendq"
)

// firstPort is where the ports of "host:0" addresses begin.
const firstPort = 40000

// Errors a connection ends with.
var (
	// ErrDropped is why the connections of a node that Drop cut off ended.
	ErrDropped = errors.New("memvan: connection reset: node dropped by the test")
	// ErrProtocol marks a frame that broke the wire protocol; its
	// connection is closed.
	ErrProtocol = errors.New("memvan: protocol error")
	errClosed   = errors.New("connection closed")
)

// Network is a set of vans that reach each other by port.
type Network struct {
	mu       sync.Mutex
	vans     map[int]*Van
	held     map[pair][]arrival
	nextPort int
}

// pair is one direction between two nodes.
type pair struct{ from, to node.ID }

// NewNetwork returns an empty network.
func NewNetwork() *Network {
	return &Network{vans: make(map[int]*Van), held: make(map[pair][]arrival), nextPort: firstPort}
}

// Listen starts a van listening on cfg.ListenAddr ("host:port"; port 0
// picks a free one), with the defaults of van.New.
func (n *Network) Listen(cfg van.Config) (*Van, error) {
	if cfg.Handler == nil {
		return nil, errors.New("memvan: Config.Handler is nil")
	}
	if cfg.MaxPayload == 0 {
		cfg.MaxPayload = van.DefaultMaxPayload
	}
	if cfg.PoolBytes == 0 {
		cfg.PoolBytes = van.DefaultPoolBytes
	}
	if cfg.IOTimeout == 0 {
		cfg.IOTimeout = van.DefaultIOTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	host, portText, err := net.SplitHostPort(cfg.ListenAddr)
	if err != nil {
		return nil, fmt.Errorf("memvan: listen on %q: %w", cfg.ListenAddr, err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil || port < 0 || port > 65535 {
		return nil, fmt.Errorf("memvan: listen on %q: bad port", cfg.ListenAddr)
	}
	n.mu.Lock()
	if port == 0 {
		for n.vans[n.nextPort] != nil {
			n.nextPort++
		}
		port = n.nextPort
		n.nextPort++
	}
	if n.vans[port] != nil {
		n.mu.Unlock()
		return nil, fmt.Errorf("memvan: listen on %s: address already in use", cfg.ListenAddr)
	}
	v := &Van{
		net:          n,
		cfg:          cfg,
		addr:         net.JoinHostPort(host, strconv.Itoa(port)),
		port:         port,
		log:          cfg.Logger,
		q:            sendq.New[*frame.Message](cfg.PoolBytes),
		peers:        make(map[node.ID]*peer),
		stats:        make(peerstat.Table),
		recvWeights:  make(map[node.ID]float64),
		changed:      make(chan struct{}),
		senderDone:   make(chan struct{}),
		receiverDone: make(chan struct{}),
	}
	v.self.Store(uint32(cfg.Self))
	v.inbox.cond.L = &v.inbox.mu
	if s, ok := cfg.Handler.(van.Sink); ok {
		v.sink = s
	}
	n.vans[port] = v
	n.mu.Unlock()
	go v.runSender()
	go v.runReceiver()
	return v, nil
}

// Hold keeps the frames from node from to node to (and the end of their
// connection, when it is closed in order) until Release.
func (n *Network) Hold(from, to node.ID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.held[pair{from, to}]; !ok {
		n.held[pair{from, to}] = nil
	}
}

// Release delivers, in order, what was held from node from to node to,
// and lets later frames through.
func (n *Network) Release(from, to node.ID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	p := pair{from, to}
	held := n.held[p]
	delete(n.held, p)
	for _, a := range held {
		a.to.inbox.push(a)
	}
}

// Drop cuts node id off: every connection it has breaks (frames held on
// them are lost), both ends see PeerLost, and nobody can dial it any more.
// Its Van stays open, as the process behind a vanished host would not know.
func (n *Network) Drop(id node.ID) {
	n.mu.Lock()
	var victim *Van
	for port, v := range n.vans {
		if v.selfID() == id {
			victim = v
			delete(n.vans, port)
		}
	}
	n.mu.Unlock()
	if victim == nil {
		return
	}
	victim.mu.Lock()
	victim.dropped = true
	conns := make([]*conn, 0, len(victim.peers))
	for _, p := range victim.peers {
		conns = append(conns, p.conn)
	}
	victim.mu.Unlock()
	for _, c := range conns {
		c.reset(ErrDropped)
	}
}

// transmit carries a from one van to another, unless the direction is held.
func (n *Network) transmit(a arrival) {
	n.mu.Lock()
	defer n.mu.Unlock()
	p := pair{a.conn.idOf(a.from), a.conn.idOf(a.to)}
	if held, ok := n.held[p]; ok {
		n.held[p] = append(held, a)
		return
	}
	a.to.inbox.push(a)
}

// forget discards what is held on connection c, which has been reset.
func (n *Network) forget(c *conn) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for p, held := range n.held {
		n.held[p] = slices.DeleteFunc(held, func(a arrival) bool { return a.conn == c })
	}
}

func (n *Network) lookup(port int) *Van {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.vans[port]
}

func (n *Network) leave(v *Van) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.vans[v.port] == v {
		delete(n.vans, v.port)
	}
}

// conn is a connection between two vans: the dialer and the acceptor.
type conn struct {
	net                *Network
	dialer, acceptor   *Van
	dialerID, acceptID node.ID

	mu    sync.Mutex
	ended bool
}

// idOf names a van's end of the connection.
func (c *conn) idOf(v *Van) node.ID {
	if v == c.dialer {
		return c.dialerID
	}
	return c.acceptID
}

func (c *conn) other(v *Van) *Van {
	if v == c.dialer {
		return c.acceptor
	}
	return c.dialer
}

// end closes the connection in order from v's side: the other end sees the
// end after every frame v sent.
func (c *conn) end(v *Van) {
	c.mu.Lock()
	ended := c.ended
	c.ended = true
	c.mu.Unlock()
	if !ended {
		c.net.transmit(arrival{conn: c, from: v, to: c.other(v), end: true, err: errClosed})
	}
}

// reset breaks the connection at once: what is held on it is lost, and
// both ends see its end with err.
func (c *conn) reset(err error) {
	c.mu.Lock()
	ended := c.ended
	c.ended = true
	c.mu.Unlock()
	if ended {
		return
	}
	c.net.forget(c)
	c.dialer.inbox.push(arrival{conn: c, from: c.acceptor, to: c.dialer, end: true, err: err})
	c.acceptor.inbox.push(arrival{conn: c, from: c.dialer, to: c.acceptor, end: true, err: err})
}

func (c *conn) isEnded() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ended
}

// arrival is what a connection brings a van: a frame (header as on the
// wire, payload the sender's copy) or the connection's end.
type arrival struct {
	conn     *conn
	from, to *Van
	hdr      [frame.HeaderSize]byte
	payload  []byte
	end      bool
	err      error // the end's reason
}

// inbox is a van's arrivals in order, for its receiver goroutine.
type inbox struct {
	mu     sync.Mutex
	cond   sync.Cond
	q      []arrival
	closed bool
}

func (b *inbox) push(a arrival) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	b.q = append(b.q, a)
	b.cond.Signal()
}

func (b *inbox) pop() (arrival, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for len(b.q) == 0 && !b.closed {
		b.cond.Wait()
	}
	if b.closed {
		return arrival{}, false
	}
	a := b.q[0]
	b.q[0] = arrival{}
	b.q = b.q[1:]
	return a, true
}

func (b *inbox) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	b.q = nil
	b.cond.Broadcast()
}

// peer is a node this van has an introduced connection with.
type peer struct {
	id     node.ID
	remote *Van
	conn   *conn
	st     *peerstat.Counters
	bye    atomic.Bool // the peer said Bye: the end of its connection is no loss
}

// Van is one node's end of a Network; it implements van.Transport.
type Van struct {
	net  *Network
	cfg  van.Config
	addr string
	port int
	log  *slog.Logger
	self atomic.Uint32
	sink van.Sink // nil: the handler has none
	q    *sendq.Queue[*frame.Message]

	quiet atomic.Bool // closing: lost connections are not reported

	mu          sync.Mutex
	peers       map[node.ID]*peer
	stats       peerstat.Table
	recvWeights map[node.ID]float64 // recorded, without effect
	changed     chan struct{}       // closed and replaced when a peer is added
	closed      bool
	dropped     bool

	inbox        inbox
	closeOnce    sync.Once
	senderDone   chan struct{}
	receiverDone chan struct{}
}

var _ van.Transport = (*Van)(nil)

func (v *Van) selfID() node.ID { return node.ID(v.self.Load()) }

// Addr implements van.Transport.
func (v *Van) Addr() string { return v.addr }

// SetSelf implements van.Transport.
func (v *Van) SetSelf(id node.ID) { v.self.Store(uint32(id)) }

// Dial implements van.Transport: it connects to the van listening on
// addr's port and says Hello.
func (v *Van) Dial(ctx context.Context, id node.ID, addr string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memvan: dial node %d at %s: %w", id, addr, err)
	}
	v.mu.Lock()
	closed, dropped := v.closed, v.dropped
	_, connected := v.peers[id]
	v.mu.Unlock()
	switch {
	case closed:
		return van.ErrClosed
	case connected:
		return fmt.Errorf("memvan: dial node %d at %s: already connected", id, addr)
	case dropped:
		return fmt.Errorf("memvan: dial node %d at %s: %w", id, addr, ErrDropped)
	}
	_, portText, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("memvan: dial node %d at %s: %w", id, addr, err)
	}
	port, _ := strconv.Atoi(portText)
	remote := v.net.lookup(port)
	if remote == nil {
		return fmt.Errorf("memvan: dial node %d at %s: connection refused", id, addr)
	}
	c := &conn{net: v.net, dialer: v, acceptor: remote, dialerID: v.selfID(), acceptID: id}
	p, err := v.addPeer(id, remote, c)
	if err != nil {
		return err
	}
	hello := frame.Header{Type: frame.Hello, Sender: uint32(v.selfID()), Recipient: uint32(id)}
	a := arrival{conn: c, from: v, to: remote}
	hello.Encode(a.hdr[:])
	v.net.transmit(a)
	p.st.SentBytes.Add(frame.HeaderSize)
	p.st.SentFrames.Add(1)
	return nil
}

// addPeer makes an introduced connection usable.
func (v *Van) addPeer(id node.ID, remote *Van, c *conn) (*peer, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed {
		return nil, van.ErrClosed
	}
	if v.dropped {
		return nil, ErrDropped // a Hello that was on its way when Drop cut it off
	}
	if _, ok := v.peers[id]; ok {
		return nil, fmt.Errorf("memvan: node %d already has a connection to node %d", v.selfID(), id)
	}
	st := v.stats.Of(id)
	p := &peer{id: id, remote: remote, conn: c, st: st}
	v.peers[id] = p
	close(v.changed)
	v.changed = make(chan struct{})
	return p, nil
}

func (v *Van) lookup(id node.ID) *peer {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.peers[id]
}

// AwaitPeers implements van.Transport.
func (v *Van) AwaitPeers(ctx context.Context, ids []node.ID) error {
	for {
		v.mu.Lock()
		var missing []node.ID
		for _, id := range ids {
			if _, ok := v.peers[id]; !ok {
				missing = append(missing, id)
			}
		}
		changed, closed := v.changed, v.closed
		v.mu.Unlock()
		if len(missing) == 0 {
			return nil
		}
		if closed {
			return van.ErrClosed
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("memvan: waiting for nodes %v: %w", missing, ctx.Err())
		}
	}
}

func (v *Van) enqueue(m *frame.Message, block bool) error {
	id := node.ID(m.Header.Recipient)
	n := m.Len()
	if uint64(n) > v.cfg.MaxPayload {
		return fmt.Errorf("memvan: send to node %d: payload of %d bytes exceeds the maximum of %d", id, n, v.cfg.MaxPayload)
	}
	if v.lookup(id) == nil {
		if v.quiet.Load() {
			return van.ErrClosed
		}
		return fmt.Errorf("memvan: send to node %d: %w", id, van.ErrNoPeer)
	}
	if !v.q.Put(m, &m.Header, n, block) {
		return van.ErrClosed
	}
	return nil
}

// Send implements van.Transport.
func (v *Van) Send(m *frame.Message) error { return v.enqueue(m, true) }

// Forward implements van.Transport.
func (v *Van) Forward(m *frame.Message) error { return v.enqueue(m, false) }

// SetWeight implements van.Transport.
func (v *Van) SetWeight(id node.ID, w float64) { v.q.SetWeight(id, w) }

// SetReceiveWeight implements van.Transport; it is recorded without effect,
// as in the netconn van: every arrival is handled in order.
func (v *Van) SetReceiveWeight(id node.ID, w float64) {
	v.mu.Lock()
	v.recvWeights[id] = w
	v.mu.Unlock()
}

// SetShaping implements van.Transport.
func (v *Van) SetShaping(on bool) { v.q.SetShaping(on) }

// QueuedBytes implements van.Transport.
func (v *Van) QueuedBytes() int64 { return v.q.Queued() }

// Stats implements van.Transport; peers are listed in id order.
func (v *Van) Stats() []van.PeerStats {
	v.mu.Lock()
	snaps := v.stats.Snapshots()
	v.mu.Unlock()
	out := make([]van.PeerStats, len(snaps))
	for i, st := range snaps {
		out[i] = van.PeerStats(st)
	}
	return out
}

// Close implements van.Transport: it drains the pool (up to IOTimeout),
// says Bye to every peer, ends every connection in order, and stops both
// goroutines. Frames that arrived but were not handled yet are dropped.
func (v *Van) Close() error { return v.close(true) }

// Abort implements van.Transport: what is queued fails at once; Bye is
// said and every connection ends in order, as on Close.
func (v *Van) Abort() error { return v.close(false) }

func (v *Van) close(drain bool) error {
	v.closeOnce.Do(func() {
		drained := drain && v.q.CloseAndDrain(v.cfg.IOTimeout)
		v.quiet.Store(true)
		v.mu.Lock()
		v.closed = true
		v.mu.Unlock()
		if drain && !drained {
			v.log.Warn("memvan: closing with frames still queued", "timeout", v.cfg.IOTimeout)
		}
		v.q.Stop(drained || !drain)
		<-v.senderDone
		v.mu.Lock()
		peers := v.peers
		v.peers = make(map[node.ID]*peer)
		v.mu.Unlock()
		for _, p := range peers {
			p.conn.end(v)
		}
		v.net.leave(v)
		v.inbox.close()
		<-v.receiverDone
	})
	return nil
}

// runSender is the one sender goroutine.
func (v *Van) runSender() {
	defer close(v.senderDone)
	var msgs []*frame.Message
	for {
		j := v.q.Next(msgs, nil)
		if j.Stop {
			if j.SayBye {
				v.sayBye()
			}
			failAll(j.Failed, van.ErrClosed)
			return
		}
		if len(j.Msgs) > 0 {
			for _, m := range j.Msgs {
				v.write(m)
			}
			msgs = j.Msgs
			clear(msgs)
		} else {
			failAll(j.Failed, van.ErrNoPeer)
		}
		v.q.Done()
	}
}

func failAll(es []sendq.Entry[*frame.Message], err error) {
	for _, e := range es {
		if e.Value.Done != nil {
			e.Value.Done(fmt.Errorf("memvan: frame for node %d not sent: %w", e.Flow, err))
		}
	}
}

// write is the in-memory socket write: the header is encoded and the
// payload copied, after which the sender's buffer is free (Done).
func (v *Van) write(m *frame.Message) {
	id := node.ID(m.Header.Recipient)
	p := v.lookup(id)
	if p == nil || p.conn.isEnded() {
		if m.Done != nil {
			m.Done(fmt.Errorf("memvan: frame for node %d not sent: %w", id, van.ErrNoPeer))
		}
		return
	}
	start := time.Now()
	h := m.Header // m stays the caller's to read: the van writes none of it
	n := m.Len()
	h.Sender, h.Length = uint32(v.selfID()), uint64(n)
	var parts [8][]byte
	a := arrival{conn: p.conn, from: v, to: p.remote, payload: slices.Concat(m.Parts(parts[:0])...)}
	h.Encode(a.hdr[:])
	v.net.transmit(a)
	p.st.SentBusy.Add(int64(time.Since(start)))
	p.st.SentBytes.Add(uint64(frame.HeaderSize + n))
	p.st.SentFrames.Add(1)
	if m.Done != nil {
		m.Done(nil)
	}
}

func (v *Van) sayBye() {
	v.mu.Lock()
	peers := make([]*peer, 0, len(v.peers))
	for _, p := range v.peers {
		peers = append(peers, p)
	}
	v.mu.Unlock()
	for _, p := range peers {
		if p.conn.isEnded() {
			continue
		}
		h := frame.Header{Type: frame.Bye, Sender: uint32(v.selfID()), Recipient: uint32(p.id)}
		a := arrival{conn: p.conn, from: v, to: p.remote}
		h.Encode(a.hdr[:])
		v.net.transmit(a)
		p.st.SentBytes.Add(frame.HeaderSize)
		p.st.SentFrames.Add(1)
	}
}

// runReceiver is the one receiver goroutine: it handles arrivals in order.
func (v *Van) runReceiver() {
	defer close(v.receiverDone)
	for {
		a, ok := v.inbox.pop()
		if !ok {
			return
		}
		v.receive(a)
	}
}

func (v *Van) receive(a arrival) {
	peerID := a.conn.idOf(a.from)
	p := v.lookup(peerID)
	if p != nil && p.conn != a.conn {
		p = nil // an arrival from an earlier connection
	}
	if a.end {
		if p != nil {
			v.dropPeer(p, a.err)
		}
		return
	}
	if p == nil && a.conn.isEnded() {
		return
	}
	h, err := frame.Decode(a.hdr[:], v.cfg.MaxPayload)
	if p == nil {
		// An accepted connection: its first frame must be a Hello to us.
		reason, err := v.admit(&h, err, a.from)
		if reason != "" {
			v.log.Debug("memvan: refusing a connection", "from", h.Sender, "reason", reason, "err", err)
			if v.cfg.OnReject != nil {
				v.cfg.OnReject(reason)
			}
			a.conn.reset(err)
			return
		}
		np, err := v.addPeer(node.ID(h.Sender), a.from, a.conn)
		if err != nil {
			v.log.Debug("memvan: refusing a connection", "from", h.Sender, "err", err)
			if v.cfg.OnReject != nil && !errors.Is(err, van.ErrClosed) && !errors.Is(err, ErrDropped) {
				v.cfg.OnReject("duplicate")
			}
			a.conn.reset(err)
			return
		}
		np.st.ReceivedBytes.Add(frame.HeaderSize)
		np.st.ReceivedFrames.Add(1)
		return
	}
	switch {
	case err != nil:
	case h.Type == frame.Hello:
		err = fmt.Errorf("%w: a second hello", ErrProtocol)
	case node.ID(h.Sender) != p.id || node.ID(h.Recipient) != v.selfID():
		err = fmt.Errorf("%w: frame from %d to %d on the connection from %d to %d", ErrProtocol, h.Sender, h.Recipient, p.id, v.selfID())
	case h.Length != uint64(len(a.payload)):
		err = fmt.Errorf("%w: header says %d payload bytes, %d came", ErrProtocol, h.Length, len(a.payload))
	}
	if err != nil {
		a.conn.reset(err)
		return
	}
	start := time.Now()
	p.st.ReceivedBytes.Add(uint64(frame.HeaderSize + len(a.payload)))
	p.st.ReceivedFrames.Add(1)
	if h.Type == frame.Bye {
		p.bye.Store(true)
		return
	}
	// As on TCP, a payload lands in the sink's buffer ("in place") or in
	// the van's own, from which the handler copies it.
	payload, inPlace := a.payload, false
	if v.sink != nil {
		if buf := v.sink.PayloadBuffer(&h); buf != nil {
			if uint64(len(buf)) != h.Length {
				a.conn.reset(fmt.Errorf("memvan: the sink gave %d bytes for a payload of %d", len(buf), h.Length))
				return
			}
			copy(buf, payload)
			payload, inPlace = buf, true
		}
	}
	if inPlace {
		p.st.ReceivedInPlace.Add(h.Length)
	} else {
		p.st.ReceivedCopied.Add(h.Length)
	}
	p.st.ReceivedBusy.Add(int64(time.Since(start)))
	v.cfg.Handler.HandleFrame(&h, payload, inPlace)
}

// admit applies the TCP vans' handshake rules to a Hello from the van
// dialer: this node has an id, both sides hold the same HelloKey (the
// challenge–response of auth/hello.go would fail otherwise), and Admit lets
// the sender dial. It returns the reason for the rejected connections
// counter, "" when admitted.
func (v *Van) admit(h *frame.Header, decodeErr error, dialer *Van) (string, error) {
	switch {
	case v.selfID() == 0:
		return "early", fmt.Errorf("%w: a connection before this node has an id", ErrProtocol)
	case decodeErr != nil || h.Type != frame.Hello || node.ID(h.Recipient) != v.selfID() || h.Length != 0:
		return "protocol", fmt.Errorf("%w: no valid hello: %v", ErrProtocol, decodeErr)
	case !hmac.Equal(v.cfg.HelloKey, dialer.cfg.HelloKey):
		return "auth", fmt.Errorf("%w: node %d does not hold this node's cluster secret", ErrProtocol, h.Sender)
	}
	if v.cfg.Admit != nil {
		if reason := v.cfg.Admit(node.ID(h.Sender)); reason != "" {
			return reason, fmt.Errorf("%w: node %d may not dial this node (%s)", ErrProtocol, h.Sender, reason)
		}
	}
	return "", nil
}

// dropPeer forgets a peer whose connection ended, and reports the loss
// unless the peer said Bye or this van is closing.
func (v *Van) dropPeer(p *peer, err error) {
	v.mu.Lock()
	if v.peers[p.id] == p {
		delete(v.peers, p.id)
	}
	v.mu.Unlock()
	v.q.PurgeFlow(p.id)
	switch {
	case p.bye.Load():
		v.log.Debug("memvan: peer left", "peer", p.id)
	case v.quiet.Load():
	default:
		err = fmt.Errorf("memvan: connection to node %d lost: %w", p.id, err)
		v.log.Warn("memvan: peer lost", "peer", p.id, "err", err)
		v.cfg.Handler.PeerLost(p.id, err)
	}
}
