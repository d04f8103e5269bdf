package van

import (
	"github.com/fptps/fpt/node"

	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/internal/epollwait"
)

// readBudget bounds the bytes read from one connection per readiness event,
// so that a peer streaming a huge frame cannot starve the others: the epoll
// set is level-triggered, so what is left is reported again.
const readBudget = 4 << 20

// frameBudget bounds the frames handled per connection and readiness event:
// tiny frames would otherwise cost up to readBudget/HeaderSize handler calls
// before the next peer's turn.
const frameBudget = 16

// acceptBatch bounds the connections accepted per readiness event of the
// listening socket, for the same reason.
const acceptBatch = 16

// epollVan is the default Transport. Its goroutines are exactly two
// whatever the number of peers: the receiver (an epoll loop locked to its
// OS thread, which also accepts) and the sender (core.runSender).
type epollVan struct {
	*core
	addr string
	lfd  int // listening socket
	epfd int
	evfd int // eventfd waking the receiver

	// Requests to the receiver, which alone touches conns and closes fds.
	reqMu       sync.Mutex
	adds        []*epConn
	stopping    bool
	inHandshake map[net.Conn]struct{}
	hsWG        sync.WaitGroup // handshake goroutines

	acceptAt time.Time // receiver's: when to watch the listener again (zero: watched)

	// Owned by the receiver goroutine.
	conns   map[int]*epConn // by fd
	pending map[*epConn]struct{}
	gen     int32

	recvDone chan struct{}
	once     sync.Once
}

// epConn is one connection of the epoll van.
type epConn struct {
	fd     int          // the receiver's copy; -1 once closed
	gen    atomic.Int32 // tells a reused fd number from this connection in events
	epfd   int          // the van's epoll set, where a blocked writer asks for EPOLLOUT
	remote string
	cut    cutter
	clock  recvClock
	peer   *peer     // set before the receiver sees the connection
	ch     int       // which of the peer's channels
	expiry time.Time // mid-frame: closed if no byte arrives by then

	// fdMu keeps wfd from being closed (and its number reused) under a
	// writer or an abort: they hold it shared; close holds it exclusively,
	// after a shutdown has made any writer return.
	fdMu sync.RWMutex
	wfd  int

	// A writer that finds the socket full arms EPOLLOUT on the van's epoll
	// set and parks on writable; the receiver loop disarms it and signals.
	// Parking a goroutine is cheap, while a thread blocked in poll makes the
	// Go runtime hand its P to another thread and back, which cost about a
	// fifth of the sender's throughput on loopback.
	writable  chan struct{}
	aborted   chan struct{}
	abortOnce sync.Once

	iov [][]byte // the sender's: what one writev call writes
	// kiov is the sender's iovec array for that call.
	kiov []unix.Iovec
}

func newEpConn(fd, epfd int, remote string, cut cutter) *epConn {
	return &epConn{fd: fd, wfd: fd, epfd: epfd, remote: remote, cut: cut,
		writable: make(chan struct{}, 1), aborted: make(chan struct{})}
}

func newEpoll(cfg Config) (Transport, error) {
	l, err := listen(cfg.ListenAddr)
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	lfd, err := ownFD(l)
	l.Close() // the dup keeps the socket listening
	if err != nil {
		return nil, fmt.Errorf("van: listen %s: %w", addr, err)
	}
	v := &epollVan{
		core:     newCore(cfg),
		addr:     addr,
		lfd:      lfd,
		epfd:     -1,
		evfd:     -1,
		conns:    make(map[int]*epConn),
		pending:  make(map[*epConn]struct{}),
		recvDone: make(chan struct{}),

		inHandshake: make(map[net.Conn]struct{}),
	}
	if err := v.setup(); err != nil {
		for _, fd := range []int{v.lfd, v.epfd, v.evfd} {
			if fd >= 0 {
				unix.Close(fd)
			}
		}
		return nil, fmt.Errorf("van: epoll on %s: %w", addr, err)
	}
	go v.runSender()
	go v.receive()
	return v, nil
}

func (v *epollVan) setup() error {
	var err error
	if v.epfd, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		v.epfd = -1
		return fmt.Errorf("epoll_create1: %w", err)
	}
	if v.evfd, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		v.evfd = -1
		return fmt.Errorf("eventfd: %w", err)
	}
	for _, fd := range []int{v.lfd, v.evfd} {
		ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
		if err := unix.EpollCtl(v.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
			return fmt.Errorf("epoll_ctl: %w", err)
		}
	}
	return nil
}

// ownFD takes a socket out of the standard library: it duplicates the fd
// (close-on-exec, non-blocking) so that the net object can be closed and
// the van owns the socket alone. No *os.File is kept, whose finalizer would
// close the fd behind the van's back.
func ownFD(sc syscall.Conn) (int, error) {
	rc, err := sc.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	var derr error
	if err := rc.Control(func(s uintptr) {
		fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		return -1, err
	}
	if derr != nil {
		return -1, fmt.Errorf("dup: %w", derr)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("set non-blocking: %w", err)
	}
	return fd, nil
}

func (v *epollVan) Addr() string { return v.addr }

func (v *epollVan) Dial(ctx context.Context, id node.ID, addr string) error {
	tcs, err := v.dial(ctx, id, addr)
	if err != nil {
		return err
	}
	conns := make([]*epConn, 0, len(tcs))
	closeAll := func() {
		for _, c := range conns {
			unix.Close(c.fd)
		}
	}
	for _, tc := range tcs {
		fd, err := ownFD(tc)
		tc.Close()
		if err == nil {
			if err = limitUnsent(fd, v.cfg.UnsentBytes); err != nil {
				unix.Close(fd)
			}
		}
		if err != nil {
			closeAll()
			for _, tc := range tcs[len(conns)+1:] {
				tc.Close()
			}
			return fmt.Errorf("van: dial node %d at %s: %w", id, addr, err)
		}
		conns = append(conns, newEpConn(fd, v.epfd, addr, v.newCutter(id, true)))
	}
	links := make([]link, len(conns))
	for i, c := range conns {
		links[i] = c
	}
	p, err := v.addPeer(id, links)
	if err != nil {
		closeAll()
		return err
	}
	for i, c := range conns {
		c.peer, c.ch = p, i
	}
	p.st.SentBytes.Add(uint64(len(conns)) * frame.HeaderSize)
	p.st.SentFrames.Add(uint64(len(conns)))
	// Hand the connections to the receiver, which registers them.
	v.reqMu.Lock()
	if v.stopping {
		v.reqMu.Unlock()
		for _, c := range conns {
			c.close()
			v.endChannel(p, c.ch, ErrClosed)
		}
		return ErrClosed
	}
	v.adds = append(v.adds, conns...)
	v.reqMu.Unlock()
	v.wake()
	return nil
}

// wake interrupts the receiver's epoll_wait.
func (v *epollVan) wake() {
	one := [8]byte{1}
	if _, err := unix.Write(v.evfd, one[:]); err != nil && !errors.Is(err, unix.EAGAIN) {
		v.log.Error("van: eventfd write", "err", err)
	}
}

func (v *epollVan) Close() error { return v.close(true) }

func (v *epollVan) Abort() error { return v.close(false) }

func (v *epollVan) close(drain bool) error {
	v.once.Do(func() {
		v.closeSend(drain)
		v.reqMu.Lock()
		v.stopping = true
		for nc := range v.inHandshake {
			nc.Close()
		}
		v.reqMu.Unlock()
		v.wake()
		<-v.recvDone
		v.hsWG.Wait()
		unix.Close(v.evfd)
		unix.Close(v.epfd)
	})
	return nil
}

// receive is the receiver goroutine: one epoll loop over the listening
// socket, the eventfd and every connection, waiting for the set on the
// runtime's poller (package epollwait).
func (v *epollVan) receive() {
	defer close(v.recvDone)
	w, err := epollwait.New(v.epfd)
	if err != nil {
		v.log.Error("van: receiver cannot wait for its epoll set, it stops", "err", err)
		v.shutdown()
		return
	}
	defer w.Close()
	events := make([]unix.EpollEvent, 128)
	for {
		n, err := w.Wait(events, v.waitMillis())
		if err != nil && !errors.Is(err, unix.EINTR) {
			// Cannot happen with valid arguments; stop serving rather
			// than spin.
			v.log.Error("van: epoll_wait failed, receiver stops", "err", err)
			v.shutdown()
			return
		}
		for _, ev := range events[:max(n, 0)] {
			switch int(ev.Fd) {
			case v.evfd:
				var buf [8]byte
				unix.Read(v.evfd, buf[:])
			case v.lfd:
				v.accept()
			default:
				c := v.conns[int(ev.Fd)]
				if c == nil || c.gen.Load() != ev.Pad {
					break
				}
				if ev.Events&unix.EPOLLOUT != 0 {
					v.writable(c)
				}
				if ev.Events&^unix.EPOLLOUT != 0 {
					v.serve(c)
					v.watchStall(c)
				}
			}
		}
		v.reqMu.Lock()
		adds, stopping := v.adds, v.stopping
		v.adds = nil
		v.reqMu.Unlock()
		for _, c := range adds {
			if err := v.register(c); err != nil {
				v.drop(c, err)
			}
		}
		if stopping {
			v.shutdown()
			return
		}
		v.expire()
	}
}

// waitMillis is epoll_wait's timeout: until the nearest deadline of a
// connection mid-frame, or the end of an accept pause.
func (v *epollVan) waitMillis() int {
	first := v.acceptAt
	for c := range v.pending {
		if first.IsZero() || c.expiry.Before(first) {
			first = c.expiry
		}
	}
	if first.IsZero() {
		return -1
	}
	d := time.Until(first)
	if d <= 0 {
		return 0
	}
	return int(min(d.Milliseconds()+1, math.MaxInt32))
}

// watchStall arms (mid-frame) or disarms the read deadline of a connection
// after it was served: a peer that stops in the middle of a frame for
// IOTimeout is closed, as a write making no progress is.
func (v *epollVan) watchStall(c *epConn) {
	if c.fd < 0 {
		return
	}
	if c.cut.midFrame() {
		c.expiry = time.Now().Add(v.cfg.IOTimeout)
		v.pending[c] = struct{}{}
	} else {
		delete(v.pending, c)
	}
}

// expire closes connections stalled mid-frame, and resumes accepting after
// a pause.
func (v *epollVan) expire() {
	now := time.Now()
	for c := range v.pending {
		if now.After(c.expiry) {
			v.drop(c, fmt.Errorf("%w: no byte for %v in the middle of a frame", errReadStalled, v.cfg.IOTimeout))
		}
	}
	v.resumeAccept(now)
}

// readEvents is what the loop always watches a connection for; a blocked
// writer adds EPOLLOUT until the loop sees it.
const readEvents = unix.EPOLLIN | unix.EPOLLRDHUP

func (v *epollVan) register(c *epConn) error {
	v.gen++
	c.gen.Store(v.gen)
	ev := unix.EpollEvent{Events: readEvents, Fd: int32(c.fd), Pad: v.gen}
	if err := unix.EpollCtl(v.epfd, unix.EPOLL_CTL_ADD, c.fd, &ev); err != nil {
		return fmt.Errorf("epoll_ctl add: %w", err)
	}
	v.conns[c.fd] = c
	return nil
}

// acceptPause is how long the listener is left alone after accept failed
// for want of descriptors (EMFILE, ENFILE): the pending connection stays
// queued and the level-triggered set would report it again at once.
const acceptPause = 100 * time.Millisecond

// accept takes pending connections and runs each one's handshake on a
// short-lived goroutine with a blocking net.Conn (acceptHello), so that a
// slow or silent peer never holds up the loop; a connection that proves
// itself comes back to the loop as a peer, like a dialled one.
func (v *epollVan) accept() {
	for range acceptBatch {
		fd, sa, err := unix.Accept4(v.lfd, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		switch {
		case errors.Is(err, unix.EAGAIN):
			return
		case errors.Is(err, unix.EINTR), errors.Is(err, unix.ECONNABORTED):
			continue
		case err != nil:
			v.rejects.warn("accept", "van: accept failed; pausing accepts", "err", err, "pause", acceptPause)
			v.pauseAccept()
			return
		}
		remote := sockaddrString(sa)
		select {
		case v.handshakes <- struct{}{}:
		default:
			unix.Close(fd)
			v.refused(remote, reject("busy", "%d connections already in their handshake", maxHandshakes))
			continue
		}
		v.hsWG.Add(1)
		go v.handshake(fd, remote)
	}
}

// pauseAccept stops watching the listener until acceptPause has passed.
func (v *epollVan) pauseAccept() {
	if err := unix.EpollCtl(v.epfd, unix.EPOLL_CTL_DEL, v.lfd, nil); err != nil {
		v.log.Debug("van: epoll_ctl del listener", "err", err)
		return
	}
	v.acceptAt = time.Now().Add(acceptPause)
}

// resumeAccept watches the listener again once its pause is over.
func (v *epollVan) resumeAccept(now time.Time) {
	if v.acceptAt.IsZero() || now.Before(v.acceptAt) {
		return
	}
	v.acceptAt = time.Time{}
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(v.lfd)}
	if err := unix.EpollCtl(v.epfd, unix.EPOLL_CTL_ADD, v.lfd, &ev); err != nil {
		v.log.Error("van: listener not watched again", "err", err)
	}
}

// handshake runs on its own goroutine for one accepted fd.
func (v *epollVan) handshake(fd int, remote string) {
	defer v.hsWG.Done()
	defer func() { <-v.handshakes }()
	f := os.NewFile(uintptr(fd), "van-accepted")
	nc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		v.rejects.warn("fileconn", "van: accepted connection unusable", "remote", remote, "err", err)
		return
	}
	if !v.trackHandshake(nc, true) {
		nc.Close()
		return
	}
	peer, ch, err := v.acceptHello(nc)
	v.trackHandshake(nc, false)
	if err != nil {
		nc.Close()
		if !v.quiet.Load() {
			v.refused(remote, err)
		}
		return
	}
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		nc.Close()
		return
	}
	nfd, err := ownFD(tc)
	tc.Close()
	if err != nil {
		v.log.Warn("van: accepted connection", "remote", remote, "err", err)
		return
	}
	if err := unix.SetsockoptInt(nfd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
		v.log.Debug("van: TCP_NODELAY", "err", err)
	}
	if err := limitUnsent(nfd, v.cfg.UnsentBytes); err != nil {
		v.log.Warn("van: accepted connection", "err", err)
	}
	c := newEpConn(nfd, v.epfd, remote, v.newCutter(peer, true))
	p, err := v.join(peer, ch, c)
	if err != nil {
		unix.Close(nfd)
		if !errors.Is(err, ErrClosed) {
			var r *rejection
			if !errors.As(err, &r) {
				err = reject("duplicate", "%w", err)
			}
			v.refused(remote, err)
		}
		return
	}
	c.peer, c.ch = p, ch
	p.st.ReceivedBytes.Add(frame.HeaderSize)
	p.st.ReceivedFrames.Add(1)
	v.reqMu.Lock()
	if v.stopping {
		v.reqMu.Unlock()
		c.close()
		v.endChannel(p, ch, ErrClosed)
		return
	}
	v.adds = append(v.adds, c)
	v.reqMu.Unlock()
	v.wake()
}

// trackHandshake records (add) or forgets a connection in its handshake,
// so that Close can break it; it refuses to add once the van is stopping.
func (v *epollVan) trackHandshake(nc net.Conn, add bool) bool {
	v.reqMu.Lock()
	defer v.reqMu.Unlock()
	if !add {
		delete(v.inHandshake, nc)
		return true
	}
	if v.stopping {
		return false
	}
	v.inHandshake[nc] = struct{}{}
	return true
}

func sockaddrString(sa unix.Sockaddr) string {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return fmt.Sprintf("%d.%d.%d.%d:%d", a.Addr[0], a.Addr[1], a.Addr[2], a.Addr[3], a.Port)
	case *unix.SockaddrInet6:
		return fmt.Sprintf("[%x]:%d", a.Addr, a.Port)
	}
	return "?"
}

// serve reads from a ready connection until it would block, or readBudget
// bytes or frameBudget frames have been read, so that every ready peer gets
// its turn: the set is
// level-triggered, so a connection with more to read is reported again.
// (Stopping after one frame instead costs an epoll_wait per small frame.)
//
// The byte budget is the peer's share under receive shaping (recvShaper).
func (v *epollVan) serve(c *epConn) {
	budget, frames := v.recv.budget(c.peer.id), frameBudget
	var iov [2][]byte
	var kiov [2]unix.Iovec
	for {
		// A header that the read ending the frame before it brought in
		// full is decoded without a read.
		n := 0
		if !c.cut.ready() {
			var err error
			n, _, err = ioReadv(c.fd, c.cut.nextv(iov[:0], budget), kiov[:0])
			switch {
			case errors.Is(err, unix.EINTR):
				continue
			case errors.Is(err, unix.EAGAIN):
				return
			case err != nil:
				v.drop(c, fmt.Errorf("read: %w", err))
				return
			case n == 0:
				v.drop(c, io.ErrUnexpectedEOF)
				return
			}
			c.peer.st.ReadCalls.Add(1)
		}
		h, payload, err := c.cut.advance(n)
		if err != nil {
			v.drop(c, err)
			return
		}
		c.peer.st.ReceivedBytes.Add(uint64(n))
		c.clock.read(c.peer.st, c.cut.midFrame())
		if h != nil {
			v.onFrame(c.peer, c.ch, h, payload, c.cut.inPlace())
			frames--
		}
		budget -= n
		// A complete header read ahead is decoded even past the budgets:
		// its bytes are out of the socket, which may never be reported
		// readable again (a frame with no payload, the last one sent).
		if (frames <= 0 || budget <= 0) && !c.cut.ready() {
			return
		}
	}
}

// writable disarms EPOLLOUT (the set is level-triggered: it would fire
// for as long as the socket has room) and wakes the parked writer.
func (v *epollVan) writable(c *epConn) {
	ev := unix.EpollEvent{Events: readEvents, Fd: int32(c.fd), Pad: c.gen.Load()}
	if err := unix.EpollCtl(v.epfd, unix.EPOLL_CTL_MOD, c.fd, &ev); err != nil {
		v.log.Debug("van: epoll_ctl mod", "err", err)
	}
	select {
	case c.writable <- struct{}{}:
	default:
	}
}

// drop closes a connection on the receiver goroutine and reports why.
func (v *epollVan) drop(c *epConn, err error) {
	if c.fd < 0 {
		return
	}
	if err := unix.EpollCtl(v.epfd, unix.EPOLL_CTL_DEL, c.fd, nil); err != nil && !errors.Is(err, unix.ENOENT) {
		v.log.Debug("van: epoll_ctl del", "err", err)
	}
	if v.conns[c.fd] == c {
		delete(v.conns, c.fd)
	}
	delete(v.pending, c)
	c.close()
	v.endChannel(c.peer, c.ch, err)
}

// shutdown closes everything the receiver owns; it runs as it exits.
func (v *epollVan) shutdown() {
	v.reqMu.Lock()
	v.stopping = true
	adds := v.adds
	v.adds = nil
	v.reqMu.Unlock()
	for _, c := range adds {
		v.drop(c, ErrClosed)
	}
	for _, c := range v.conns {
		v.drop(c, ErrClosed)
	}
	unix.Close(v.lfd)
}

// close releases the socket; safe against a concurrent writer or abort.
func (c *epConn) close() {
	c.abort() // makes a writer blocked in poll or writev return
	c.fdMu.Lock()
	if c.wfd >= 0 {
		unix.Close(c.wfd)
		c.wfd = -1
	}
	c.fdMu.Unlock()
	c.fd = -1
}

func (c *epConn) abort() {
	c.abortOnce.Do(func() { close(c.aborted) })
	c.fdMu.RLock()
	if c.wfd >= 0 {
		unix.Shutdown(c.wfd, unix.SHUT_RDWR)
	}
	c.fdMu.RUnlock()
}

// writev implements link: unix.Writev of up to iovMax buffers and
// maxChunk bytes per call, waiting for room (awaitWritable) while the
// socket is full.
func (c *epConn) writev(bufs [][]byte, timeout time.Duration) (n, calls int, err error) {
	c.fdMu.RLock()
	defer c.fdMu.RUnlock()
	if c.wfd < 0 {
		return 0, 0, errConnClosed
	}
	for len(bufs) > 0 {
		c.iov = window(c.iov[:0], bufs[:min(len(bufs), iovMax)], maxChunk)
		var m int
		m, c.kiov, err = ioWritev(c.wfd, c.iov, c.kiov)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN):
			if err := c.awaitWritable(timeout); err != nil {
				return n, calls, err
			}
			continue
		case err != nil:
			return n, calls, fmt.Errorf("writev: %w", err)
		}
		n += m
		calls++
		bufs = advance(bufs, m)
	}
	clear(c.iov)
	clear(c.kiov)
	return n, calls, nil
}

// awaitWritable parks the writer until the receiver loop sees the socket
// writable, the connection is aborted, or timeout passes. Before the loop
// has registered the connection (just dialled), it polls instead.
func (c *epConn) awaitWritable(timeout time.Duration) error {
	// The loop stores gen before adding the fd to the set: 0 means not
	// registered (an event tagged 0 would be ignored), and a MOD before the
	// ADD fails with ENOENT.
	gen := c.gen.Load()
	if gen == 0 {
		return waitWritable(c.wfd, timeout)
	}
	ev := unix.EpollEvent{Events: readEvents | unix.EPOLLOUT, Fd: int32(c.wfd), Pad: gen}
	if err := unix.EpollCtl(c.epfd, unix.EPOLL_CTL_MOD, c.wfd, &ev); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return waitWritable(c.wfd, timeout)
		}
		return fmt.Errorf("epoll_ctl mod: %w", err)
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-c.writable:
		return nil
	case <-c.aborted:
		return errConnClosed
	case <-t.C:
		return fmt.Errorf("%w: no progress for %v", errStalled, timeout)
	}
}

// waitWritable polls fd for POLLOUT, failing after timeout without it.
func waitWritable(fd int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		ms := time.Until(deadline).Milliseconds()
		if ms <= 0 {
			return fmt.Errorf("%w: no progress for %v", errStalled, timeout)
		}
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		n, err := unix.Poll(pfd, int(min(ms, math.MaxInt32)))
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return fmt.Errorf("poll: %w", err)
		case n > 0:
			return nil // writable, or an error the next writev reports
		}
	}
}
