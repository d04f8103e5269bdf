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
	tc, err := v.dial(ctx, id, addr)
	if err != nil {
		return err
	}
	if err := limitUnsentConn(tc, v.cfg.UnsentBytes); err != nil {
		tc.Close()
		return fmt.Errorf("van: dial node %d at %s: %w", id, addr, err)
	}
	c := &ncConn{tc: tc, remote: addr, cut: v.newCutter(id, true)}
	p, err := v.addPeer(id, c)
	if err != nil {
		tc.Close()
		return err
	}
	c.peer = p
	p.st.SentBytes.Add(frame.HeaderSize)
	p.st.SentFrames.Add(1)
	if !v.start(c) {
		v.dropPeer(p, ErrClosed)
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
			v.log.Warn("van: accept", "err", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if err := limitUnsentConn(tc, v.cfg.UnsentBytes); err != nil {
			v.log.Warn("van: accepted connection", "err", err)
		}
		c := &ncConn{tc: tc, remote: tc.RemoteAddr().String(), cut: v.newCutter(0, false)}
		if err := tc.SetReadDeadline(time.Now().Add(v.cfg.IOTimeout)); err != nil {
			tc.Close()
			continue
		}
		v.start(c)
	}
}

// read is a connection's reader goroutine, driving the shared cutter.
func (v *netConnVan) read(c *ncConn) {
	defer v.wg.Done()
	err := v.readLoop(c)
	c.tc.Close()
	v.mu.Lock()
	delete(v.conns, c)
	v.mu.Unlock()
	if c.peer == nil {
		if !v.quiet.Load() {
			v.log.Warn("van: closed a connection before its hello", "remote", c.remote, "err", err)
		}
		return
	}
	v.dropPeer(c.peer, err)
}

func (v *netConnVan) readLoop(c *ncConn) error {
	for {
		n, err := c.tc.Read(c.cut.next())
		if n > 0 {
			h, payload, perr := c.cut.advance(n)
			if perr != nil {
				return perr
			}
			if c.peer != nil {
				c.peer.st.ReceivedBytes.Add(uint64(n))
				c.clock.read(c.peer.st, c.cut.midFrame())
			}
			if h != nil {
				if c.peer != nil {
					v.onFrame(c.peer, h, payload, c.cut.inPlace())
				} else if perr := v.hello(c); perr != nil {
					return perr
				}
			}
		}
		switch {
		case err == nil:
		case errors.Is(err, io.EOF):
			return io.ErrUnexpectedEOF
		case c.peer == nil && errors.Is(err, os.ErrDeadlineExceeded):
			return errNoHello
		default:
			return fmt.Errorf("read: %w", err)
		}
	}
}

func (v *netConnVan) hello(c *ncConn) error {
	p, err := v.addPeer(c.cut.peer, c)
	if err != nil {
		return err
	}
	c.peer = p
	p.st.ReceivedBytes.Add(frame.HeaderSize)
	p.st.ReceivedFrames.Add(1)
	return c.tc.SetReadDeadline(time.Time{})
}

func (v *netConnVan) Close() error {
	v.once.Do(func() {
		v.closeSend()
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

// abort closes the connection; the standard library makes that safe
// against the reader and a writer.
func (c *ncConn) abort() { c.tc.Close() }

// writeFrame writes header and payload through net.Buffers (one writev per
// chunk; the standard library resumes partial writes).
func (c *ncConn) writeFrame(hdr, payload []byte, timeout time.Duration) error {
	var iov [2][]byte
	bufs := net.Buffers(append(iov[:0], hdr))
	for {
		chunk := payload[:min(len(payload), netChunk)]
		payload = payload[len(chunk):]
		if len(chunk) > 0 {
			bufs = append(bufs, chunk)
		}
		if err := c.tc.SetWriteDeadline(time.Now().Add(timeout)); err != nil {
			return err
		}
		if _, err := bufs.WriteTo(c.tc); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return fmt.Errorf("%w: no progress for %v", errStalled, timeout)
			}
			return err
		}
		if len(payload) == 0 {
			return nil
		}
		bufs = net.Buffers(iov[:0])
	}
}
