package van

import (
	"github.com/fptps/fpt/node"

	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/fptps/fpt/frame"
)

// netChunk bounds the payload written under one write deadline, so that
// IOTimeout means "no progress for that long" on slow links too, rather
// than "the whole frame within that long".
const netChunk = 64 << 20

// netConnVan is the standard-library Transport: an accept goroutine, a
// reader goroutine per connection, and the shared sender.
type netConnVan struct {
	*core
	l    *net.TCPListener
	addr string

	mu      sync.Mutex
	conns   map[*ncConn]struct{}
	closing bool
	wg      sync.WaitGroup // the accept loop and the readers
	once    sync.Once
}

// ncConn is one connection of the netconn van. Only its reader touches cut
// and peer (peer is set before the reader starts, or by it).
type ncConn struct {
	tc     *net.TCPConn
	remote string
	cut    cutter
	clock  recvClock
	peer   *peer
	ch     int      // which of the peer's channels
	iov    [][]byte // the sender's: what one write writes
}

func newNetConn(cfg Config) (Transport, error) {
	l, err := listen(cfg.ListenAddr)
	if err != nil {
		return nil, err
	}
	v := &netConnVan{
		core:  newCore(cfg),
		l:     l,
		addr:  l.Addr().String(),
		conns: make(map[*ncConn]struct{}),
	}
	v.wg.Add(1)
	go v.acceptLoop()
	go v.runSender()
	return v, nil
}

func (v *netConnVan) Addr() string { return v.addr }

func (v *netConnVan) Dial(ctx context.Context, id node.ID, addr string) error {
	tcs, err := v.dial(ctx, id, addr)
	if err != nil {
		return err
	}
	closeAll := func() {
		for _, tc := range tcs {
			tc.Close()
		}
	}
	conns := make([]*ncConn, len(tcs))
	links := make([]link, len(tcs))
	for i, tc := range tcs {
		if err := limitUnsentConn(tc, v.cfg.UnsentBytes); err != nil {
			closeAll()
			return fmt.Errorf("van: dial node %d at %s: %w", id, addr, err)
		}
		conns[i] = &ncConn{tc: tc, remote: addr, cut: v.newCutter(id, true), ch: i}
		links[i] = conns[i]
	}
	p, err := v.addPeer(id, links)
	if err != nil {
		closeAll()
		return err
	}
	p.st.SentBytes.Add(uint64(len(conns)) * frame.HeaderSize)
	p.st.SentFrames.Add(uint64(len(conns)))
	closed := false
	for _, c := range conns {
		c.peer = p
		if !v.start(c) {
			v.endChannel(p, c.ch, ErrClosed)
			closed = true
		}
	}
	if closed {
		return ErrClosed
	}
	return nil
}

// start tracks c and runs its reader, unless the van is closing (then c is
// closed and start reports false).
func (v *netConnVan) start(c *ncConn) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closing {
		c.tc.Close()
		return false
	}
	v.conns[c] = struct{}{}
	v.wg.Add(1)
	go v.read(c)
	return true
}

func (v *netConnVan) acceptLoop() {
	defer v.wg.Done()
	for {
		tc, err := v.l.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// EMFILE and the like: back off instead of spinning.
			v.rejects.warn("accept", "van: accept failed; pausing accepts", "err", err, "pause", acceptPause)
			time.Sleep(acceptPause)
			continue
		}
		if err := limitUnsentConn(tc, v.cfg.UnsentBytes); err != nil {
			v.log.Warn("van: accepted connection", "err", err)
		}
		remote := tc.RemoteAddr().String()
		select {
		case v.handshakes <- struct{}{}:
		default:
			tc.Close()
			v.refused(remote, reject("busy", "%d connections already in their handshake", maxHandshakes))
			continue
		}
		// The reader runs the handshake (acceptHello) before any frame.
		if !v.start(&ncConn{tc: tc, remote: remote}) {
			<-v.handshakes
		}
	}
}

// read is a connection's reader goroutine, driving the shared cutter; for
// an accepted connection it first runs the handshake.
func (v *netConnVan) read(c *ncConn) {
	defer v.wg.Done()
	if c.peer == nil {
		err := v.introduce(c)
		<-v.handshakes
		if err != nil {
			c.tc.Close()
			v.mu.Lock()
			delete(v.conns, c)
			v.mu.Unlock()
			if !v.quiet.Load() && !errors.Is(err, ErrClosed) {
				v.refused(c.remote, err)
			}
			return
		}
	}
	err := v.readLoop(c)
	c.tc.Close()
	v.mu.Lock()
	delete(v.conns, c)
	v.mu.Unlock()
	v.endChannel(c.peer, c.ch, err)
}

// introduce runs an accepted connection's handshake and makes it a peer.
func (v *netConnVan) introduce(c *ncConn) error {
	id, ch, err := v.acceptHello(c.tc)
	if err != nil {
		return err
	}
	c.cut = v.newCutter(id, true)
	p, err := v.join(id, ch, c)
	if err != nil {
		var r *rejection
		if errors.Is(err, ErrClosed) || errors.As(err, &r) {
			return err
		}
		return reject("duplicate", "%w", err)
	}
	c.peer, c.ch = p, ch
	p.st.ReceivedBytes.Add(frame.HeaderSize)
	p.st.ReceivedFrames.Add(1)
	return nil
}

func (v *netConnVan) readLoop(c *ncConn) error {
	armed := false
	for {
		// Mid-frame, a peer must make progress within IOTimeout.
		if mid := c.cut.midFrame(); mid || armed {
			var d time.Time
			if mid {
				d = time.Now().Add(v.cfg.IOTimeout)
			}
			if err := c.tc.SetReadDeadline(d); err != nil {
				return fmt.Errorf("read deadline: %w", err)
			}
			armed = mid
		}
		n, err := c.tc.Read(c.cut.next())
		if n > 0 {
			h, payload, perr := c.cut.advance(n)
			if perr != nil {
				return perr
			}
			c.peer.st.ReceivedBytes.Add(uint64(n))
			c.peer.st.ReadCalls.Add(1)
			c.clock.read(c.peer.st, c.cut.midFrame())
			if h != nil {
				v.onFrame(c.peer, c.ch, h, payload, c.cut.inPlace())
			}
		}
		switch {
		case err == nil:
		case errors.Is(err, io.EOF):
			return io.ErrUnexpectedEOF
		case errors.Is(err, os.ErrDeadlineExceeded):
			return fmt.Errorf("%w: no byte for %v in the middle of a frame", errReadStalled, v.cfg.IOTimeout)
		default:
			return fmt.Errorf("read: %w", err)
		}
	}
}

func (v *netConnVan) Close() error { return v.close(true) }

func (v *netConnVan) Abort() error { return v.close(false) }

func (v *netConnVan) close(drain bool) error {
	v.once.Do(func() {
		v.closeSend(drain)
		v.mu.Lock()
		v.closing = true
		for c := range v.conns {
			c.tc.Close()
		}
		v.mu.Unlock()
		v.l.Close()
		v.wg.Wait()
	})
	return nil
}

// abort shuts the connection down both ways, as the epoll van does: a
// write in progress fails, and the reader still reads what has arrived
// (a Bye behind the frames the handler holds) before its end. The reader
// closes the socket.
func (c *ncConn) abort() {
	c.tc.CloseRead()
	c.tc.CloseWrite()
}

// writev implements link through net.Buffers (one writev per chunk; the
// standard library resumes partial writes), each chunk of at most netChunk
// bytes under a write deadline of its own.
func (c *ncConn) writev(bufs [][]byte, timeout time.Duration) (n, calls int, err error) {
	for len(bufs) > 0 {
		chunk := net.Buffers(window(c.iov[:0], bufs, netChunk))
		c.iov = chunk
		bufs = advance(bufs, size(chunk))
		if err := c.tc.SetWriteDeadline(time.Now().Add(timeout)); err != nil {
			return n, calls, err
		}
		m, err := chunk.WriteTo(c.tc)
		n += int(m)
		if m > 0 {
			calls++ // at least one; the standard library does not say more
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return n, calls, fmt.Errorf("%w: no progress for %v", errStalled, timeout)
			}
			return n, calls, err
		}
	}
	clear(c.iov)
	return n, calls, nil
}
