package van

import (
	"github.com/fptps/fpt/node"

	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fptps/fpt/auth"
	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/van/internal/peerstat"
	"github.com/fptps/fpt/van/internal/sendq"
)

// byeTimeout bounds the write of a Bye on Close: a peer that does not take
// 72 bytes within it is not worth waiting for.
const byeTimeout = time.Second

// link is a connection as the sender sees it.
type link interface {
	// writev writes bufs in order (one frame's header and payload, or
	// several frames'), in one writev where the kernel allows, resuming
	// after partial writes, failing once no byte has moved for timeout.
	// It reports the bytes written (all of them unless err), and the
	// system calls that moved bytes. It may change bufs' slices.
	writev(bufs [][]byte, timeout time.Duration) (n, calls int, err error)
	// abort breaks the connection so that its reader sees an end soon and
	// a write in progress fails. Safe from any goroutine, repeatedly.
	abort()
}

// recvClock measures the time a connection spends receiving frames: from
// the read that starts a frame to the read that leaves no frame partly
// received. Gaps between frames are idle, not slow, and are not counted,
// so that bytes over busy time estimates what the link can carry.
type recvClock struct {
	since time.Time // zero: no frame in progress
}

// read is called after each read that moved bytes; midFrame tells whether
// a frame is still partly received afterwards.
func (r *recvClock) read(st *peerstat.Counters, midFrame bool) {
	now := time.Now()
	if r.since.IsZero() {
		r.since = now
	}
	if !midFrame {
		st.ReceivedBusy.Add(int64(now.Sub(r.since)))
		r.since = time.Time{}
	}
}

// peer is a connected node that has been introduced (dialled, or accepted
// and said Hello on every channel).
type peer struct {
	id    node.ID
	links []link // by channel (see channels.go)
	st    *peerstat.Counters
	byes  []atomic.Bool // by channel: the peer said Bye there, its EOF is not a loss
	live  atomic.Int32  // channels not ended yet

	mu      sync.Mutex
	failure error // why this side broke the connection, if it did
}

// fail records why the connection is being broken and breaks it; the
// reader then reports the loss with this reason.
func (p *peer) fail(err error) {
	p.mu.Lock()
	if p.failure == nil {
		p.failure = err
	}
	p.mu.Unlock()
	for _, l := range p.links {
		l.abort()
	}
}

// saidBye reports whether the peer said Bye on every channel: it left in
// order.
func (p *peer) saidBye() bool {
	for i := range p.byes {
		if !p.byes[i].Load() {
			return false
		}
	}
	return true
}

func (p *peer) reason(readErr error) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failure != nil {
		return p.failure
	}
	return readErr
}

// core is what both vans share: the peer table, the send queue and its
// sender goroutine, statistics, and the Close sequence up to the point
// where sockets are closed.
type core struct {
	cfg   Config
	self  atomic.Uint32 // cfg.Self until SetSelf
	log   *slog.Logger
	q     *sendq.Queue[*frame.Message]
	quiet atomic.Bool // closing: lost connections are not reported
	recv  recvShaper
	// rejects rate-limits the log lines of refused connections and failed
	// accepts.
	rejects *rateLog
	// handshakes holds a token per accepted connection in its handshake.
	handshakes chan struct{}
	// closing is closed once the van closes: accepted channels waiting
	// for the rest of their peer's (join) give up.
	closing     chan struct{}
	closingOnce sync.Once

	mu      sync.Mutex
	peers   map[node.ID]*peer
	groups  map[node.ID]*channelGroup // accepted peers with channels still to come
	stats   peerstat.Table
	changed chan struct{} // closed and replaced whenever a peer is added

	senderDone chan struct{}
}

func newCore(cfg Config) *core {
	c := &core{
		cfg:        cfg,
		log:        cfg.Logger,
		q:          sendq.New[*frame.Message](cfg.PoolBytes),
		peers:      make(map[node.ID]*peer),
		groups:     make(map[node.ID]*channelGroup),
		closing:    make(chan struct{}),
		stats:      make(peerstat.Table),
		changed:    make(chan struct{}),
		senderDone: make(chan struct{}),
		recv:       recvShaper{weights: make(map[node.ID]float64)},
		rejects:    newRateLog(cfg.Logger, rejectLogEvery),
		handshakes: make(chan struct{}, maxHandshakes),
	}
	c.self.Store(uint32(cfg.Self))
	return c
}

// newCutter starts the receive state of a connection, with the handler's
// sink when it has one.
func (c *core) newCutter(peer node.ID, known bool) cutter {
	var sink func(*frame.Header) []byte
	if s, ok := c.cfg.Handler.(Sink); ok {
		sink = s.PayloadBuffer
	}
	cut := newCutter(c.selfID(), peer, known, c.cfg.MaxPayload, sink)
	cut.partBytes = c.cfg.PartitionBytes
	return cut
}

// SetSelf implements Transport.
func (c *core) SetSelf(id node.ID) { c.self.Store(uint32(id)) }

func (c *core) selfID() node.ID { return node.ID(c.self.Load()) }

// addPeer makes the channels of a peer that has been introduced usable.
func (c *core) addPeer(id node.ID, links []link) (*peer, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.addPeerLocked(id, links)
}

func (c *core) addPeerLocked(id node.ID, links []link) (*peer, error) {
	if c.quiet.Load() {
		return nil, ErrClosed
	}
	if _, ok := c.peers[id]; ok {
		return nil, fmt.Errorf("van: node %d already has a connection to node %d", c.selfID(), id)
	}
	st := c.stats.Of(id)
	p := &peer{id: id, links: links, st: st, byes: make([]atomic.Bool, len(links))}
	p.live.Store(int32(len(links)))
	st.Channels.Store(int32(len(links)))
	c.peers[id] = p
	close(c.changed)
	c.changed = make(chan struct{})
	c.log.Debug("van: peer connected", "peer", id)
	return p, nil
}

// dropPeer is called exactly once per peer, by endChannel, after every
// channel has ended; err is why (from the reader's side). It reports the
// loss unless the peer said Bye on every channel or we are closing.
func (c *core) dropPeer(p *peer, err error) {
	c.mu.Lock()
	if c.peers[p.id] == p {
		delete(c.peers, p.id)
	}
	c.mu.Unlock()
	c.q.PurgeFlow(p.id)
	switch {
	case p.saidBye():
		c.log.Debug("van: peer left", "peer", p.id)
	case c.quiet.Load():
		c.log.Debug("van: connection closed while closing", "peer", p.id, "err", err)
	default:
		err = fmt.Errorf("van: connection to node %d lost: %w", p.id, p.reason(err))
		c.log.Warn("van: peer lost", "peer", p.id, "err", err)
		c.cfg.Handler.PeerLost(p.id, err)
	}
}

func (c *core) lookup(id node.ID) *peer {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.peers[id]
}

// onFrame handles a complete frame from channel ch of an introduced peer;
// inPlace tells whether its payload was read into the handler's Sink
// buffer.
func (c *core) onFrame(p *peer, ch int, h *frame.Header, payload []byte, inPlace bool) {
	p.st.ReceivedFrames.Add(1)
	if inPlace {
		p.st.ReceivedInPlace.Add(uint64(len(payload)))
	} else {
		p.st.ReceivedCopied.Add(uint64(len(payload)))
	}
	if h.Type == frame.Bye {
		p.byes[ch].Store(true)
		c.log.Debug("van: peer said bye", "peer", p.id, "channel", ch)
		return
	}
	c.cfg.Handler.HandleFrame(h, payload, inPlace)
}

// enqueue is Send (block) and Forward (!block).
func (c *core) enqueue(m *frame.Message, block bool) error {
	id := node.ID(m.Header.Recipient)
	n := m.Len()
	if uint64(n) > c.cfg.MaxPayload {
		return fmt.Errorf("van: send to node %d: payload of %d bytes exceeds the maximum of %d", id, n, c.cfg.MaxPayload)
	}
	if c.lookup(id) == nil {
		if c.quiet.Load() {
			return ErrClosed
		}
		return fmt.Errorf("van: send to node %d: %w", id, ErrNoPeer)
	}
	if !c.q.Put(m, &m.Header, n, block) {
		return ErrClosed
	}
	return nil
}

// Send implements Transport.
func (c *core) Send(m *frame.Message) error { return c.enqueue(m, true) }

// Forward implements Transport.
func (c *core) Forward(m *frame.Message) error { return c.enqueue(m, false) }

// SetWeight implements Transport.
func (c *core) SetWeight(peer node.ID, weight float64) { c.q.SetWeight(peer, weight) }

// SetReceiveWeight implements Transport.
func (c *core) SetReceiveWeight(peer node.ID, weight float64) { c.recv.setWeight(peer, weight) }

// SetShaping implements Transport.
func (c *core) SetShaping(on bool) {
	c.q.SetShaping(on)
	c.recv.setShaping(on)
}

// QueuedBytes implements Transport.
func (c *core) QueuedBytes() int64 { return c.q.Queued() }

// Stats implements Transport; peers are listed in id order.
func (c *core) Stats() []PeerStats {
	c.mu.Lock()
	snaps := c.stats.Snapshots()
	c.mu.Unlock()
	out := make([]PeerStats, len(snaps))
	for i, st := range snaps {
		out[i] = PeerStats(st)
	}
	return out
}

// AwaitPeers implements Transport.
func (c *core) AwaitPeers(ctx context.Context, peers []node.ID) error {
	for {
		c.mu.Lock()
		var missing []node.ID
		for _, id := range peers {
			if _, ok := c.peers[id]; !ok {
				missing = append(missing, id)
			}
		}
		changed := c.changed
		c.mu.Unlock()
		if len(missing) == 0 {
			return nil
		}
		if c.quiet.Load() {
			return ErrClosed
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("van: waiting for nodes %v: %w", missing, ctx.Err())
		}
	}
}

// A job of the sender gathers the frames that follow one another in the
// pool's order to one connection, within these bounds, and writes them
// with one writev: small frames cost a system call each otherwise. The
// bytes bound how long a frame queued meanwhile, however urgent, waits
// behind the job (the pool decides what leaves next only between jobs),
// so a frame as large as it goes alone.
const (
	batchBytes  = 256 << 10
	batchFrames = 64
	// iovMax is Linux's IOV_MAX: the buffers one writev takes.
	iovMax = 1024
)

// sender is the sender goroutine's state: the job being gathered and the
// scratch its writes reuse.
type sender struct {
	channels int                        // the peers' channels (Config.Channels)
	frames   int                        // gathered in the job so far
	bytes    int64                      // ... their bytes
	iovs     int                        // ... and buffers
	msgs     []*frame.Message           // the job
	hdrs     [][frame.HeaderSize]byte   // its frames' headers, encoded
	bufs     [][]byte                   // what one writev writes
	lens     []int                      // each frame's bytes, header included
	join     sendq.Join[*frame.Message] // s.gather
}

func newSender(channels int) *sender {
	s := &sender{channels: channels, hdrs: make([][frame.HeaderSize]byte, batchFrames)}
	s.join = s.gather
	return s
}

// parts is the buffers m takes in a writev at most: its header, Payload
// and More.
func parts(m *frame.Message) int { return 2 + len(m.More) }

// start begins gathering a job (before Next).
func (s *sender) start() { s.frames = 0 }

// gather is the job's sendq.Join: next joins first's job if it goes to the
// same peer and channel and the job stays within the bounds.
func (s *sender) gather(first, next *sendq.Entry[*frame.Message]) bool {
	if s.frames == 0 { // the first call of a job
		s.frames, s.bytes, s.iovs = 1, first.Bytes, parts(first.Value)
	}
	if next.Flow != first.Flow ||
		channelOf(&next.Value.Header, s.channels) != channelOf(&first.Value.Header, s.channels) ||
		s.frames >= batchFrames || s.bytes+next.Bytes > batchBytes || s.iovs+parts(next.Value) > iovMax {
		return false
	}
	s.frames++
	s.bytes += next.Bytes
	s.iovs += parts(next.Value)
	return true
}

// runSender is the one sender goroutine.
func (c *core) runSender() {
	defer close(c.senderDone)
	s := newSender(c.cfg.Channels)
	for {
		s.start()
		j := c.q.Next(s.msgs, s.join)
		if j.Stop {
			if j.SayBye {
				c.sayBye(s)
			}
			failAll(j.Failed, ErrClosed)
			return
		}
		if len(j.Msgs) > 0 {
			c.write(s, j.Msgs)
			s.msgs = j.Msgs
			clear(s.msgs) // the messages are their callers' again
		} else {
			failAll(j.Failed, ErrNoPeer)
		}
		c.q.Done()
	}
}

// failAll calls the Done callbacks of entries that will not be sent.
func failAll(es []sendq.Entry[*frame.Message], err error) {
	for _, e := range es {
		if e.Value.Done != nil {
			e.Value.Done(fmt.Errorf("van: frame for node %d not sent: %w", e.Flow, err))
		}
	}
}

// write writes a job: frames to one peer, in order, the consecutive
// frames of one channel with one writev.
func (c *core) write(s *sender, msgs []*frame.Message) {
	id := node.ID(msgs[0].Header.Recipient)
	p := c.lookup(id)
	if p == nil {
		for _, m := range msgs {
			if m.Done != nil {
				m.Done(fmt.Errorf("van: frame for node %d not sent: %w", id, ErrNoPeer))
			}
		}
		return
	}
	for len(msgs) > 0 {
		ch := channelOf(&msgs[0].Header, len(p.links))
		run := 1
		for run < len(msgs) && run < len(s.hdrs) && channelOf(&msgs[run].Header, len(p.links)) == ch {
			run++
		}
		c.writeRun(s, p, ch, msgs[:run])
		msgs = msgs[run:]
	}
}

// writeRun writes frames to channel ch of p with one writev (more where
// the socket takes part of them), then calls their Done callbacks: nil for
// each frame written whole, the error for the rest.
func (c *core) writeRun(s *sender, p *peer, ch int, msgs []*frame.Message) {
	s.bufs, s.lens = s.bufs[:0], s.lens[:0]
	for i, m := range msgs {
		h := m.Header // m stays the caller's to read: the van writes none of it
		n0 := len(s.bufs)
		s.bufs = m.Parts(append(s.bufs, s.hdrs[i][:]))
		n := size(s.bufs[n0+1:])
		h.Sender, h.Length = uint32(c.selfID()), uint64(n)
		h.Encode(s.hdrs[i][:])
		s.lens = append(s.lens, frame.HeaderSize+n)
	}
	start := time.Now()
	written, calls, err := p.links[ch].writev(s.bufs, c.cfg.IOTimeout)
	clear(s.bufs) // the payloads are their callers' again
	p.st.SentBusy.Add(int64(time.Since(start)))
	p.st.WriteCalls.Add(uint64(calls))
	if err != nil {
		if p.byes[ch].Load() {
			// The peer said Bye on this channel and it is closed: the
			// peer is leaving in order (its other channels end soon),
			// not lost.
			err = fmt.Errorf("van: frame for node %d not sent: %w", p.id, ErrNoPeer)
		} else {
			err = fmt.Errorf("van: write to node %d: %w", p.id, err)
			p.fail(err)
		}
	}
	for i, m := range msgs {
		ferr := err
		if written >= s.lens[i] {
			written -= s.lens[i]
			ferr = nil
			p.st.SentBytes.Add(uint64(s.lens[i]))
			p.st.SentFrames.Add(1)
		} else {
			written = 0
		}
		if m.Done != nil {
			m.Done(ferr)
		}
	}
}

func (c *core) sayBye(s *sender) {
	c.mu.Lock()
	peers := make([]*peer, 0, len(c.peers))
	for _, p := range c.peers {
		peers = append(peers, p)
	}
	c.mu.Unlock()
	hdr := s.hdrs[0][:]
	for _, p := range peers {
		h := frame.Header{Type: frame.Bye, Sender: uint32(c.selfID()), Recipient: uint32(p.id)}
		h.Encode(hdr)
		// Each channel's Bye follows its last frame.
		for ch, l := range p.links {
			_, calls, err := l.writev(append(s.bufs[:0], hdr), min(byeTimeout, c.cfg.IOTimeout))
			p.st.WriteCalls.Add(uint64(calls))
			if err != nil {
				c.log.Debug("van: bye not sent", "peer", p.id, "channel", ch, "err", err)
				continue
			}
			p.st.SentBytes.Add(frame.HeaderSize)
			p.st.SentFrames.Add(1)
		}
	}
}

// closeSend is the first half of Close and Abort, common to both vans:
// refuse new frames; on a Close, let the pool drain (up to IOTimeout); on
// an Abort, fail what is queued at once; say Bye; stop the sender.
// Afterwards lost connections are no longer reported; the caller closes
// the sockets.
func (c *core) closeSend(drain bool) {
	defer c.closingOnce.Do(func() { close(c.closing) })
	if !drain {
		// Bye still tells peers that the connection's end is not the
		// failure (the scheduler's verdict says what it is), but a write
		// stuck on a peer that does not read is given byeTimeout only.
		c.quiet.Store(true)
		c.q.Stop(true)
		select {
		case <-c.senderDone:
		case <-time.After(byeTimeout):
			c.abortLinks()
			<-c.senderDone
		}
		return
	}
	drained := c.q.CloseAndDrain(c.cfg.IOTimeout)
	c.quiet.Store(true)
	if !drained {
		c.log.Warn("van: closing with frames still queued", "timeout", c.cfg.IOTimeout)
		// Break every connection so that a write stuck on a peer that
		// does not read fails now rather than after another IOTimeout.
		c.abortLinks()
	}
	c.q.Stop(drained)
	<-c.senderDone
}

func (c *core) abortLinks() {
	c.mu.Lock()
	for _, p := range c.peers {
		for _, l := range p.links {
			l.abort()
		}
	}
	c.mu.Unlock()
}

// limitUnsent bounds the bytes a connection's socket holds that TCP has
// not sent yet (TCP_NOTSENT_LOWAT): a write stops, and the socket is not
// reported writable, while more than n are waiting. Without the bound the
// kernel buffers megabytes per connection in the order they were written,
// and the pool's priorities and weights would only apply to what is left
// over: a high-priority frame would wait behind the socket's backlog, and
// two backlogged sockets would share a slow link equally, whatever their
// weights. n <= 0 leaves the kernel's default.
func limitUnsent(fd, n int) error {
	if n <= 0 {
		return nil
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NOTSENT_LOWAT, n); err != nil {
		return fmt.Errorf("van: TCP_NOTSENT_LOWAT: %w", err)
	}
	return nil
}

// limitUnsentConn is limitUnsent for a connection the standard library owns.
func limitUnsentConn(tc *net.TCPConn, n int) error {
	rc, err := tc.SyscallConn()
	if err != nil {
		return fmt.Errorf("van: TCP_NOTSENT_LOWAT: %w", err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = limitUnsent(int(fd), n) }); err != nil {
		return fmt.Errorf("van: TCP_NOTSENT_LOWAT: %w", err)
	}
	return serr
}

// dial opens every channel to a peer that has no connection yet, saying
// Hello on each; it closes them all if one fails.
func (c *core) dial(ctx context.Context, id node.ID, addr string) ([]*net.TCPConn, error) {
	if c.quiet.Load() {
		return nil, ErrClosed
	}
	if c.lookup(id) != nil {
		return nil, fmt.Errorf("van: dial node %d at %s: already connected", id, addr)
	}
	n := c.cfg.Channels
	tcs := make([]*net.TCPConn, 0, n)
	for ch := range n {
		tc, err := dialHello(ctx, &c.cfg, c.selfID(), id, addr, ch)
		if err != nil {
			for _, tc := range tcs {
				tc.Close()
			}
			if n > 1 {
				err = fmt.Errorf("%w (channel %d of %d)", err, ch, n)
			}
			return nil, err
		}
		tcs = append(tcs, tc)
	}
	return tcs, nil
}

// dialHello connects to addr and introduces self to peer with a Hello,
// and with a key proves membership (see acceptHello and auth/hello.go),
// using a blocking net.Conn: nothing else knows of the connection yet.
func dialHello(ctx context.Context, cfg *Config, self, peer node.ID, addr string, ch int) (*net.TCPConn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("van: dial node %d at %s: %w", peer, addr, err)
	}
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		nc.Close()
		return nil, fmt.Errorf("van: dial node %d at %s: not a TCP connection", peer, addr)
	}
	deadline := time.Now().Add(cfg.IOTimeout)
	if len(cfg.HelloKey) > 0 {
		deadline = time.Now().Add(cfg.HandshakeTimeout)
	}
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := tc.SetDeadline(deadline); err != nil {
		tc.Close()
		return nil, fmt.Errorf("van: hello to node %d at %s: %w", peer, addr, err)
	}
	if err := sayHello(tc, cfg.HelloKey, self, peer, ch, cfg.Channels); err != nil {
		tc.Close()
		return nil, fmt.Errorf("van: hello to node %d at %s: %w", peer, addr, err)
	}
	if err := tc.SetDeadline(time.Time{}); err != nil {
		tc.Close()
		return nil, fmt.Errorf("van: hello to node %d at %s: %w", peer, addr, err)
	}
	return tc, nil
}

// sayHello is the dialer's side of the handshake, for channel ch of n.
func sayHello(tc *net.TCPConn, key []byte, self, peer node.ID, ch, n int) error {
	h := frame.Header{Type: frame.Hello, Sender: uint32(self), Recipient: uint32(peer), Partition: uint32(ch), Aux: uint32(n)}
	if len(key) == 0 {
		var hdr [frame.HeaderSize]byte
		h.Encode(hdr[:])
		_, err := tc.Write(hdr[:])
		return err
	}
	t := auth.Transcript{DialerID: uint32(self), AcceptorID: uint32(peer)}
	if _, err := rand.Read(t.DialerNonce[:]); err != nil {
		return fmt.Errorf("nonce: %w", err)
	}
	h.Length = auth.NonceSize
	var msg [frame.HeaderSize + auth.NonceSize]byte
	h.Encode(msg[:frame.HeaderSize])
	copy(msg[frame.HeaderSize:], t.DialerNonce[:])
	if _, err := tc.Write(msg[:]); err != nil {
		return err
	}
	var chal [auth.ChallengeSize]byte
	if _, err := io.ReadFull(tc, chal[:]); err != nil {
		return fmt.Errorf("refused, or no answer to the authenticated hello (does node %d have the same cluster secret, and may this node dial it?): %w", peer, err)
	}
	nonce, mac, err := auth.DecodeChallenge(chal[:])
	if err != nil {
		return err
	}
	t.AcceptorNonce = nonce
	if err := t.Verify(key, auth.Acceptor, mac[:]); err != nil {
		return fmt.Errorf("node %d did not prove membership: %w", peer, err)
	}
	answer := t.MAC(key, auth.Dialer)
	_, err = tc.Write(answer[:])
	return err
}

// listen opens the listening socket with the standard library, for its
// clear errors ("address already in use").
func listen(addr string) (*net.TCPListener, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("van: %w", err)
	}
	return l.(*net.TCPListener), nil
}

// Reasons for closing a connection.
var (
	errReadStalled = errors.New("read stalled")
	errConnClosed  = errors.New("connection closed")
	errStalled     = errors.New("write stalled")
)
