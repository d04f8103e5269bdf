package control

/*
#cgo pkg-config: libczmq libzmq
#include <czmq.h>
*/
import "C"

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/zeromq/goczmq"
	"golang.org/x/sys/unix"

	"github.com/fptps/fpt/auth"
	"github.com/fptps/fpt/internal/epollwait"
)

// Tuning of the sockets and the loop.
const (
	// incomingBuffer is the capacity of the Incoming channel.
	incomingBuffer = 4096
	// hwm bounds the messages libzmq queues per pipe in each direction.
	// Control messages are small and rare, so this is generous: reaching it
	// means a peer has been unreachable for a very long time.
	hwm = 100_000
	// linger is how long libzmq keeps delivering a closed DEALER's queued
	// messages, and how long Close waits for a backlog to drain.
	linger = 2 * time.Second
	// maxPending bounds the per-peer backlog kept in Go once libzmq's queue
	// for that peer is full (hwm); beyond it messages are dropped and logged.
	maxPending = 65536
	// idleWait is the poll timeout with nothing to retry. The loop is woken
	// by the inproc wake-up socket, so this only bounds how long a lost
	// wake-up (which should not happen) could delay a message.
	idleWait = time.Second
	// retryWait is the poll timeout while some peer has a backlog.
	retryWait = 10 * time.Millisecond
	// handshakeIvl bounds how long a connection may take over its ZeroMQ
	// handshake (CURVE included) before libzmq closes it, as the data
	// plane's van.DefaultHandshakeTimeout does: a member completes it in
	// milliseconds, and a stranger's half greeting holds a descriptor.
	handshakeIvl = 5 * time.Second
	// maxUnauthenticated bounds the accepted connections still in their
	// handshake; beyond it new ones are cut at once (reason "busy"), so
	// strangers cannot take every file descriptor. A member cut by a burst
	// reconnects, as ZeroMQ does.
	maxUnauthenticated = 128
	// recvBatch bounds the messages taken from the ROUTER per round, so a
	// flood of incoming messages cannot starve outgoing ones.
	recvBatch = 256
)

// ErrClosed is returned by Send after Close.
var ErrClosed = errors.New("control: plane closed")

// zsysInit serialises czmq's lazy process-wide initialisation: zsys_init is
// not thread-safe and every zsock_new calls it, so two planes starting at
// once on different threads could each create a global context. This is
// process-wide state on purpose: it guards a process-wide C singleton.
var zsysInit sync.Once

// Config says where a Plane listens.
type Config struct {
	// BindHost is the host or IP the ROUTER binds ("0.0.0.0", "127.0.0.1",
	// "::1"...); empty means "0.0.0.0".
	BindHost string
	// Port is the TCP port to bind; 0 picks a free one (see Plane.Port).
	Port int
	// Logger receives warnings about dropped messages; slog.Default() if nil.
	Logger *slog.Logger
	// Secret is the job's shared secret (config.Config.Secret). With one,
	// every socket speaks CURVE with keys derived from it (auth.DeriveCurve)
	// and the ROUTER admits only clients holding the derived client key: a
	// peer without the secret completes no handshake and delivers nothing.
	// Empty: no authentication (protected mode binds loopback instead).
	Secret string
	// OnReject, if set, is called (on a ZeroMQ thread, so briefly) with a
	// short fixed reason for every connection or message the plane refuses,
	// e.g. metrics.Node.Rejected("control", reason).
	OnReject func(reason string)
	// OnHandshake, if set, is called (on the plane's thread, so briefly)
	// with the outcome of each handshake this node's connection to a peer
	// endpoint (a Send's DEALER) goes through, until the first succeeds:
	// err nil for that success, else why the handshake failed. A node
	// whose every handshake with its scheduler fails (another secret, or
	// no fpt node on that port) learns it from here.
	OnHandshake func(endpoint string, err error)
}

// Plane is one node's control-plane endpoint: a ROUTER bound on Config's
// address whose decoded messages come out of Incoming, and one DEALER per
// peer endpoint that Send has been asked to reach.
//
// All sockets belong to a single goroutine, which creates, uses and
// destroys them, locked to its OS thread while it does (see run); other
// goroutines only append to a queue under mu and poke the loop through an
// eventfd, which costs them one system call and no ZeroMQ at all.
//
// With Config.Secret every socket speaks CURVE and a ZAP handler (zap.go)
// admits only peers holding the job's client key. Every connection has
// handshakeIvl to complete its handshake and at most maxUnauthenticated are
// in it at once (gate.go); each refusal, of whatever kind, is counted
// through Config.OnReject and logged at a bounded rate. Each DEALER carries
// a random routing id of its own, reported as Message.Origin: the sending
// plane's DEALER a message came through. It survives the DEALER's
// reconnections (the ROUTER hands the id over to the new connection), so
// a member whose connection was cut stays itself; another process, or
// the same one restarted, has another.
//
// Delivery is what ZeroMQ gives: in order per sender and peer, queued while
// the peer is not up yet, lost if a process dies with messages in flight.
//
// If the consumer of Incoming falls more than incomingBuffer messages
// behind, the loop blocks on it and stops sending and receiving until the
// consumer catches up (or Close is called). Send never blocks on that: it
// queues in memory.
type Plane struct {
	log    *slog.Logger
	port   int
	secret string
	reject *Rejecter
	// onHandshake is Config.OnHandshake.
	onHandshake func(endpoint string, err error)
	// id names the plane's rule in the ZAP handler.
	id string

	in   chan *Message
	stop chan struct{} // closed by Close; frees a loop blocked on in
	done chan struct{} // closed when the loop has released everything

	closeOnce sync.Once
	closeErr  error // set by the loop before done is closed

	mu          sync.Mutex
	queue       []outgoing
	closed      bool
	forsaken    map[string]bool // Forsake's endpoints
	wakePending bool            // the wake-up eventfd has been written
	wakeFD      int             // the loop's eventfd; written by others under mu
}

type outgoing struct {
	endpoint string
	data     []byte
}

// Listen binds the control plane's ROUTER on tcp://BindHost:Port and starts
// the goroutine that owns its sockets.
func Listen(cfg Config) (*Plane, error) {
	host := cfg.BindHost
	if host == "" {
		host = "0.0.0.0"
	}
	// czmq expands endpoints as printf formats, so a '%' (an IPv6 zone)
	// would be misread; ZeroMQ cannot bind a zone-qualified address anyway.
	if strings.ContainsAny(host, "%/ ") {
		return nil, fmt.Errorf("control: listen: invalid bind host %q", host)
	}
	if cfg.Port < 0 || cfg.Port > maxPort {
		return nil, fmt.Errorf("control: listen: port %d out of range", cfg.Port)
	}
	host, err := bindAddress(host)
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	var idb [12]byte
	for i := range idb {
		idb[i] = byte(rand.Uint32())
	}
	p := &Plane{
		log:         log,
		secret:      cfg.Secret,
		reject:      NewRejecter(log, cfg.OnReject),
		onHandshake: cfg.OnHandshake,
		id:          "fpt-" + hex.EncodeToString(idb[:]),
		in:          make(chan *Message, incomingBuffer),
		stop:        make(chan struct{}),
		done:        make(chan struct{}),
		wakeFD:      -1,
	}
	ready := make(chan error, 1)
	go p.run(host, cfg.Port, ready)
	if err := <-ready; err != nil {
		<-p.done
		return nil, err
	}
	return p, nil
}

// bindAddress turns a host name into an address libzmq can bind. libzmq
// binds IP addresses and interface names ("lo", "eth0") but reads any other
// name as an interface, so "localhost" would fail with ENODEV.
func bindAddress(host string) (string, error) {
	if host == "*" || net.ParseIP(host) != nil {
		return host, nil
	}
	if _, err := net.InterfaceByName(host); err == nil {
		return host, nil
	}
	ips, err := net.LookupIP(host)
	if err != nil {
		return "", fmt.Errorf("control: listen: bind host %q: %w", host, err)
	}
	// Prefer IPv4, as ps-lite's tooling does.
	for _, ip := range ips {
		if ip.To4() != nil {
			return ip.String(), nil
		}
	}
	if len(ips) == 0 {
		return "", fmt.Errorf("control: listen: bind host %q has no address", host)
	}
	return ips[0].String(), nil
}

// Port is the TCP port the ROUTER is bound to.
func (p *Plane) Port() int { return p.port }

// Incoming yields every well-formed message received, in arrival order. It
// is closed once Close has stopped the plane. Malformed messages are logged
// at Warn and dropped.
func (p *Plane) Incoming() <-chan *Message { return p.in }

// Send queues m for the node whose ROUTER listens at endpoint
// ("tcp://host:port") and returns at once: encoding happens here, the
// network I/O on the plane's goroutine, which connects one DEALER per
// endpoint on first use. A peer that is not up yet is fine: ZeroMQ queues
// and connects when it appears.
//
// Send fails only after Close (ErrClosed), or when m cannot be encoded or
// endpoint is not a tcp://host:port address, since those would otherwise be
// dropped silently on the loop. It is safe for concurrent use; m is not
// retained.
func (p *Plane) Send(endpoint string, m *Message) error {
	if err := checkEndpoint(endpoint); err != nil {
		return err
	}
	b, err := m.MarshalBinary()
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	p.queue = append(p.queue, outgoing{endpoint: endpoint, data: b})
	if !p.wakePending {
		p.wakePending = true
		p.wakeLocked()
	}
	return nil
}

// Close hands every message queued by Send to libzmq, closes all sockets
// (DEALERs with a linger of about 2 s, during which libzmq's I/O thread
// keeps delivering in the background), closes Incoming and stops the
// goroutine. It is idempotent and always returns the first call's result:
// an error only if messages had to be dropped because a peer never took
// them.
func (p *Plane) Close() error {
	p.closeOnce.Do(func() {
		p.mu.Lock()
		p.closed = true
		if !p.wakePending {
			p.wakePending = true
			p.wakeLocked()
		}
		p.mu.Unlock()
		close(p.stop)
	})
	<-p.done
	return p.closeErr
}

// Forsake gives up on the peer at endpoint, known dead: Close keeps
// nothing queued for it, and lingers neither in Close nor at the
// process's end (Shutdown) to deliver it. Later Sends to it still queue,
// for as long as the plane is open.
func (p *Plane) Forsake(endpoint string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.forsaken == nil {
		p.forsaken = make(map[string]bool)
	}
	p.forsaken[endpoint] = true
}

// wakeLocked pokes the loop. It runs under mu, on the caller's goroutine.
func (p *Plane) wakeLocked() {
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	for {
		_, err := unix.Write(p.wakeFD, one[:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			// Cannot fill up (the loop reads it before clearing
			// wakePending); should it fail anyway, the loop's idle poll
			// timeout still picks the queue up.
			p.log.Error("control: waking the control loop failed", "err", err)
		}
		return
	}
}

func checkEndpoint(ep string) error {
	rest, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return fmt.Errorf("control: send: endpoint %q: want tcp://host:port", ep)
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil {
		return fmt.Errorf("control: send: endpoint %q: %w", ep, err)
	}
	if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > maxPort {
		return fmt.Errorf("control: send: endpoint %q: bad port %q", ep, port)
	}
	// See Listen about '%'.
	if host == "" || strings.ContainsAny(host, "%/ ") {
		return fmt.Errorf("control: send: endpoint %q: bad host %q", ep, host)
	}
	return nil
}

// zmqErrno reads errno as libzmq left it on this thread. goczmq reports
// failures as bare sentinel errors, so this is the only way to tell EINTR
// (retry) from EAGAIN (come back later) or a real failure. The caller must
// be locked to its OS thread, and nothing but free() (which preserves errno
// in glibc ≥ 2.33) runs between the failing call and this one.
func zmqErrno() syscall.Errno { return syscall.Errno(C.zmq_errno()) }

// zmqError turns an errno into an error that prints like the C library's
// message and still matches syscall errnos with errors.Is.
func zmqError(e syscall.Errno) error {
	if uintptr(e) >= C.ZMQ_HAUSNUMERO {
		return errors.New(C.GoString(C.zmq_strerror(C.int(e))))
	}
	return e
}

// sockOK reports whether goczmq managed to create s. NewSock wraps a NULL
// zsock_t when zsock_new fails (e.g. ZMQ_MAX_SOCKETS reached) and gives no
// other sign; every later call on it would abort the process inside czmq.
func sockOK(s *goczmq.Sock) bool {
	f := reflect.ValueOf(s).Elem().FieldByName("zsockT")
	return !f.IsValid() || f.Kind() != reflect.Pointer || !f.IsNil()
}

// newSock makes a czmq socket, which asserts (aborting the process) where
// libzmq cannot make one; a raw socket made and closed just before finds
// that out first, as an error. Only Listen uses it, before any stranger can
// hold a connection; later sockets are raw (raw.go).
func newSock(kind int) (*goczmq.Sock, error) {
	probe, err := newRawSock(kind)
	if err != nil {
		return nil, err
	}
	probe.close()
	s := goczmq.NewSock(kind)
	if !sockOK(s) {
		return nil, fmt.Errorf("control: creating a ZeroMQ socket failed: %w", zmqError(zmqErrno()))
	}
	return s, nil
}

// loop is the state of the plane's goroutine; nothing else touches it.
type loop struct {
	p         *Plane
	keys      *auth.CurveKeys // nil without a secret
	zapDomain string          // "" without a secret
	router    *goczmq.Sock
	wakeFD    int      // eventfd written by Send and Close; -1 before open
	mon       *rawSock // the ROUTER's monitor: connections and handshakes
	gate      gate
	// items are what a round polls: itemRouter's, itemWake's and itemMon's
	// descriptors, then each watched DEALER's monitor's.
	items []unix.PollFd
	// epfd holds items' descriptors in an epoll set, which ep waits for
	// on Go's netpoller: the loop waits parked, holding no P and no thread.
	epfd     int // -1 before open
	ep       *epollwait.Waiter
	epEvents []unix.EpollEvent
	dealers  map[string]*dealer
	waiting  int // dealers with a backlog
	// sweep makes the next round service every socket, readable or not:
	// a socket is only known to be drained once it has been read until
	// EAGAIN, after which its descriptor signals anything new.
	sweep bool
	// stats counts what the loop does, for tests.
	stats loopStats

	spare []outgoing // recycled queue buffer

	monitoring bool // the ROUTER's monitor is on

	routerRx   *frameReader
	partial    [][]byte // first frames of a ROUTER message not fully read yet
	partialN   int      // frames of that message read so far
	partialEnd int      // where in routerRx's buffer the next frame goes
}

type dealer struct {
	endpoint string
	sock     *rawSock
	pending  [][]byte // encoded messages libzmq could not take yet
	dropped  int      // messages dropped in the current backlog episode
	// mon follows the DEALER's handshakes until the first succeeds, so
	// that a peer refusing this node's credentials is reported here, by
	// the node refused; nil after that (or if it could not be made).
	mon    *rawSock
	monFD  int      // mon's ZMQ_FD
	shakes shakeLog // what its handshakes' outcomes log
}

// Indices of the loop's fixed poll items.
const (
	itemRouter = iota
	itemWake
	itemMon
	fixedItems
)

// loopStats counts the loop's socket reads, which are each a few cgo and
// system calls: a round reads only the sockets its poll found readable.
type loopStats struct {
	rounds      int
	routerReads int // ROUTER receive attempts, the final EAGAIN included
	monReads    int // monitor receive attempts (ROUTER's and DEALERs')
	wakeReads   int // eventfd reads
}

func (p *Plane) run(host string, port int, ready chan<- error) {
	defer close(p.done)
	defer close(p.in)

	// Every socket is used by this goroutine only, locked to its thread
	// while it makes libzmq calls (errno is per thread). Between rounds it
	// may move to another thread: libzmq allows a socket to change threads
	// after a full memory barrier, which Go's scheduler has when it moves
	// a goroutine. Unlocked, the consumer a round wakes runs on this
	// thread at the round's end instead of on another woken for it.
	runtime.LockOSThread()
	if !enterRound() {
		ready <- errors.New("control: the process is exiting")
		parkForExit()
	}
	l, err := p.open(host, port)
	leaveRound()
	runtime.UnlockOSThread()
	if err != nil {
		ready <- err
		return
	}
	ready <- nil
	l.serve()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if !enterRound() {
		parkForExit()
	}
	p.closeErr = l.shutdown()
	leaveRound()
}

// open creates the ROUTER, its monitor and the wake-up eventfd.
func (p *Plane) open(host string, port int) (_ *loop, err error) {
	zsysInit.Do(zsysInitC)
	l := &loop{p: p, dealers: make(map[string]*dealer), wakeFD: -1, epfd: -1, sweep: true}
	defer func() {
		if err != nil {
			l.destroy()
		}
	}()

	if l.router, err = newSock(goczmq.Router); err != nil {
		return nil, err
	}
	l.routerRx = newFrameReader(handle(l.router))
	l.router.SetLinger(0) // the ROUTER never sends
	l.router.SetRcvhwm(hwm)
	l.router.SetRcvtimeo(0) // reads never block: the poller says when to read
	l.router.SetMaxmsgsize(MaxMessageLen)
	// A reconnected DEALER brings its routing id (dealer) to a new
	// connection while the old one may not have been seen to end.
	l.router.SetRouterHandover(1)
	setKeepalive(l.router)
	if err := setHandleInt(handle(l.router), zmqHandshakeIvl, int(handshakeIvl/time.Millisecond)); err != nil {
		return nil, fmt.Errorf("control: handshake interval: %w", err)
	}
	if strings.Contains(host, ":") {
		l.router.SetIpv6(1)
	}
	if p.secret != "" {
		keys, err := auth.DeriveCurve(p.secret)
		if err != nil {
			return nil, fmt.Errorf("control: %w", err)
		}
		// The ZAP domain names this plane's rule in the process-wide
		// handler; set before bind, as libzmq reads it per connection.
		l.zapDomain = "fpt-" + p.id
		if err := zap.add(l.zapDomain, zapRule{key: keys.Client.PublicRaw}, p.log); err != nil {
			l.zapDomain = ""
			return nil, err
		}
		l.router.SetZapDomain(l.zapDomain)
		l.router.SetCurveServer(1)
		l.router.SetCurveSecretkey(keys.Server.Secret)
		l.keys = &keys
	}
	endpoint := "tcp://" + net.JoinHostPort(host, strconv.Itoa(port))
	if err := retryEINTR(func() error { _, err := l.router.Bind(endpoint); return err }); err != nil {
		return nil, fmt.Errorf("control: bind %s: %w", endpoint, err)
	}
	// Port 0 asks libzmq for an ephemeral port (czmq's own "*" syntax would
	// scan a fixed range instead); the bound address says which.
	last := l.router.LastEndpoint()
	i := strings.LastIndexByte(last, ':')
	if p.port, err = strconv.Atoi(last[i+1:]); err != nil || i < 0 {
		return nil, fmt.Errorf("control: bind %s: cannot read the bound port from %q", endpoint, last)
	}

	if l.wakeFD, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		return nil, fmt.Errorf("control: wake-up eventfd: %w", err)
	}
	// The monitor reports every accepted connection and its handshake's
	// outcome, which bounds and counts the ones never authenticated. Its
	// queue is unbounded: a lost event would skew the count.
	mon := fmt.Sprintf("inproc://fpt-control-monitor-%016x", rand.Uint64())
	if err := monitor(handle(l.router), mon, monitorEvents); err != nil {
		return nil, err
	}
	l.monitoring = true
	if l.mon, err = newRawSock(zmqPair); err != nil {
		return nil, err
	}
	l.mon.setInt(zmqRcvhwm, 0)
	if err := l.mon.connect(mon); err != nil {
		return nil, fmt.Errorf("control: connect %s: %w", mon, err)
	}
	l.gate = newGate(maxUnauthenticated, handshakeIvl)
	routerFD, err := handleFD(handle(l.router))
	if err != nil {
		return nil, err
	}
	monFD, err := l.mon.fd()
	if err != nil {
		return nil, err
	}
	if l.epfd, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return nil, fmt.Errorf("control: epoll: %w", err)
	}
	if l.ep, err = epollwait.New(l.epfd); err != nil {
		return nil, fmt.Errorf("control: %w", err)
	}
	l.epEvents = make([]unix.EpollEvent, 16)
	for _, fd := range []int{routerFD, l.wakeFD, monFD} {
		if err := l.addItem(fd); err != nil {
			return nil, err
		}
	}
	// Published under mu: Send reaches wakeFD only through the lock.
	p.mu.Lock()
	p.wakeFD = l.wakeFD
	p.mu.Unlock()
	return l, nil
}

// retryEINTR runs a goczmq call until it fails with something else than
// EINTR, and turns a failure into the C library's errno.
func retryEINTR(call func() error) error {
	for {
		if call() == nil {
			return nil
		}
		if e := zmqErrno(); e != syscall.EINTR {
			return zmqError(e)
		}
	}
}

func setKeepalive(s *goczmq.Sock) {
	// Notices a peer that vanished without closing (power loss, cable) on
	// an otherwise idle connection; heartbeats do the same at a higher level.
	s.SetTcpKeepalive(1)
	s.SetTcpKeepaliveIdle(30)
	s.SetTcpKeepaliveIntvl(10)
	s.SetTcpKeepaliveCnt(3)
}

// serve runs until Close, each round through the exit gate.
func (l *loop) serve() {
	wait := idleWait
	for {
		if !enterRound() {
			parkForExit()
		}
		delivered, done := l.round(wait)
		leaveRound()
		if done {
			return
		}
		if delivered {
			// Let the consumer just woken run now, on this thread,
			// rather than after the next round should that find more.
			runtime.Gosched()
		}
		wait = idleWait
		if l.waiting > 0 {
			wait = retryWait
		}
	}
}

// round polls up to wait and services the sockets once. It reports
// whether it delivered any message, and closed once Close has been
// called.
func (l *loop) round(wait time.Duration) (delivered, closed bool) {
	// One wait on an epoll set of the sockets' ZMQ_FDs and the eventfd,
	// parked in Go's netpoller, rather than zmq_poll, which polls twice
	// per wait and asks every socket for its events before and after
	// (each a getpid and a poll of its own), and which holds the P in a
	// system call for sysmon to retake.
	sweep := l.sweep
	l.sweep = false
	if sweep {
		wait = 0
	}
	l.wait(wait)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	l.stats.rounds++
	if sweep || l.readable(itemMon) {
		l.watch()
	}
	l.watchDealers(sweep)
	// Every round services both directions, so a busy ROUTER cannot
	// starve Send.
	ok := true
	if sweep || l.readable(itemRouter) {
		delivered, ok = l.receive()
	}
	if !ok {
		return delivered, true
	}
	if l.sendQueued(sweep || l.readable(itemWake)) {
		return delivered, true
	}
	l.retryBacklogs()
	return delivered, false
}

func (l *loop) readable(item int) bool { return l.items[item].Revents != 0 }

// addItem polls fd from the next round on.
func (l *loop) addItem(fd int) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
	if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return fmt.Errorf("control: epoll: %w", err)
	}
	l.items = append(l.items, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
	return nil
}

// removeItem stops polling fd.
func (l *loop) removeItem(fd int) {
	_ = unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, fd, nil)
	l.items = slices.DeleteFunc(l.items, func(it unix.PollFd) bool { return int(it.Fd) == fd })
}

// wait waits up to d for any item to turn readable and sets the items'
// Revents. An interrupted or failed wait leaves them at zero: the next
// round simply waits again.
func (l *loop) wait(d time.Duration) {
	for i := range l.items {
		l.items[i].Revents = 0
	}
	n, _ := l.ep.Wait(l.epEvents, int((d+time.Millisecond-1)/time.Millisecond))
	for _, ev := range l.epEvents[:n] {
		for i := range l.items {
			if l.items[i].Fd == ev.Fd {
				l.items[i].Revents = int16(ev.Events)
			}
		}
	}
}

// receive reads up to recvBatch messages from the ROUTER and delivers them.
// It reports whether it delivered any, and ok false once Close has been
// called while it waited on Incoming. A batch that ends before EAGAIN
// leaves the ROUTER to the next round's sweep.
func (l *loop) receive() (delivered, ok bool) {
	for range recvBatch {
		frames, count, ok := l.recvMessage()
		if !ok {
			return delivered, true
		}
		if m := l.decode(frames, count); m != nil {
			select {
			case l.p.in <- m:
				delivered = true
			case <-l.p.stop:
				return delivered, false
			}
		}
	}
	l.sweep = true
	return delivered, true
}

// recvMessage reads one complete message from the ROUTER without blocking
// and returns its first two frames (valid until the next call) and its
// frame count. A message interrupted part-way (EINTR) is kept and resumed
// next time.
func (l *loop) recvMessage() (frames [][]byte, count int, ok bool) {
	for {
		l.stats.routerReads++
		f, more, errno := l.routerRx.recv(l.partialEnd)
		if errno == syscall.EINTR {
			continue
		}
		if errno != 0 {
			return nil, 0, false // EAGAIN: nothing (more) to read now
		}
		// A well-formed message is [identity, payload]; keep no more than
		// that of a longer one, which is dropped anyway.
		if len(l.partial) < 2 {
			l.partial = append(l.partial, f)
			l.partialEnd += len(f)
		}
		l.partialN++
		if !more {
			// The frames stay valid until the next call, by which time
			// the caller has decoded (copied) them.
			frames, count = l.partial, l.partialN
			l.partial, l.partialN, l.partialEnd = l.partial[:0], 0, 0
			return frames, count, true
		}
	}
}

func (l *loop) decode(frames [][]byte, count int) *Message {
	if count != 2 {
		l.p.log.Warn("control: dropping a message with the wrong number of frames",
			"frames", count, "want", 2)
		return nil
	}
	m, err := Unmarshal(frames[1])
	if err != nil {
		l.p.reject.Count("malformed")
		l.p.log.Warn("control: dropping a malformed message",
			"err", err, "bytes", len(frames[1]), "peer", fmt.Sprintf("%x", frames[0]))
		return nil
	}
	// The routing id the ROUTER gave the connection, never payload.
	m.Origin = string(frames[0])
	return m
}

// sendQueued takes everything Send queued and hands it to the DEALERs,
// after clearing the wake-up eventfd if woken says it was written. It
// reports whether Close has been called.
func (l *loop) sendQueued(woken bool) (closed bool) {
	if woken {
		// Read before wakePending is cleared below: a Send after that
		// writes it again, and the next poll sees it.
		var b [8]byte
		for {
			l.stats.wakeReads++
			if _, err := unix.Read(l.wakeFD, b[:]); err != unix.EINTR {
				break
			}
		}
	}
	p := l.p
	p.mu.Lock()
	q := p.queue
	p.queue = l.spare[:0]
	p.wakePending = false
	closed = p.closed
	p.mu.Unlock()

	for _, o := range q {
		l.send(o)
	}
	clear(q)
	l.spare = q
	return closed
}

func (l *loop) send(o outgoing) {
	d := l.dealer(o.endpoint)
	if d == nil {
		return
	}
	if len(d.pending) == 0 && l.trySend(d, o.data) {
		return
	}
	if len(d.pending) >= maxPending {
		if d.dropped == 0 {
			l.p.log.Warn("control: peer backlog full, dropping messages",
				"peer", d.endpoint, "queued", len(d.pending)+hwm)
		}
		d.dropped++
		return
	}
	if len(d.pending) == 0 {
		l.waiting++
	}
	d.pending = append(d.pending, o.data)
}

// trySend hands data to libzmq without blocking. It reports false when the
// peer's queue is full (try again later); a message it cannot send for any
// other reason is logged and counts as consumed.
func (l *loop) trySend(d *dealer, data []byte) bool {
	for {
		if d.sock.send(data, false) {
			return true
		}
		switch e := zmqErrno(); e {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		default:
			l.p.log.Error("control: send failed, message dropped", "peer", d.endpoint, "err", zmqError(e))
			return true
		}
	}
}

func (l *loop) retryBacklogs() {
	if l.waiting == 0 {
		return
	}
	for _, d := range l.dealers {
		if len(d.pending) == 0 {
			continue
		}
		n := 0
		for n < len(d.pending) && l.trySend(d, d.pending[n]) {
			n++
		}
		clear(d.pending[:n])
		d.pending = d.pending[n:]
		if len(d.pending) == 0 {
			d.pending = nil
			l.waiting--
			if d.dropped > 0 {
				l.p.log.Warn("control: peer backlog drained", "peer", d.endpoint, "dropped", d.dropped)
				d.dropped = 0
			}
		}
	}
}

// newRoutingID is a DEALER's routing id: 16 random bytes, the first not
// zero (ids starting with zero are libzmq's own).
func newRoutingID() string {
	b := make([]byte, 16)
	crand.Read(b)
	b[0] |= 0x80
	return string(b)
}

// dealer returns the DEALER connected to endpoint, creating it on first use.
func (l *loop) dealer(endpoint string) *dealer {
	if d := l.dealers[endpoint]; d != nil {
		return d
	}
	s, err := newRawSock(zmqDealer)
	if err != nil {
		l.p.log.Error("control: message dropped", "peer", endpoint, "err", err)
		return nil
	}
	s.setInt(zmqLinger, int(linger/time.Millisecond))
	s.setInt(zmqSndhwm, hwm)
	s.setInt(zmqImmediate, 0) // queue while the peer is not up yet
	s.setInt(zmqHandshakeIvl, int(handshakeIvl/time.Millisecond))
	s.setString(zmqRoutingID, newRoutingID())
	if l.keys != nil {
		s.setString(zmqCurveServerkey, l.keys.Server.Public)
		s.setString(zmqCurvePublickey, l.keys.Client.Public)
		s.setString(zmqCurveSecretkey, l.keys.Client.Secret)
	}
	s.setInt(zmqTcpKeepalive, 1)
	s.setInt(zmqTcpKeepaliveIdle, 30)
	s.setInt(zmqTcpKeepaliveIntvl, 10)
	s.setInt(zmqTcpKeepaliveCnt, 3)
	if strings.Contains(endpoint, "[") {
		s.setInt(zmqIpv6, 1)
	}
	// Watched before it connects, so that the monitor sees the first
	// connection's every event.
	d := &dealer{endpoint: endpoint, sock: s}
	l.watchDealer(d)
	if err := s.connect(endpoint); err != nil {
		l.unwatchDealer(d)
		s.close()
		l.p.log.Error("control: message dropped", "peer", endpoint,
			"err", fmt.Errorf("control: connect %s: %w", endpoint, err))
		return nil
	}
	l.dealers[endpoint] = d
	return d
}

// shutdown flushes and releases everything; it returns Close's result.
func (l *loop) shutdown() error {
	// Messages queued before Close but not taken yet (the loop may have
	// stopped while blocked on Incoming).
	l.sendQueued(true)
	// A forsaken peer's backlog is waited for by nobody.
	l.p.mu.Lock()
	forsaken := l.p.forsaken
	l.p.mu.Unlock()
	for _, d := range l.dealers {
		if forsaken[d.endpoint] && len(d.pending) > 0 {
			d.pending = nil
			l.waiting--
		}
	}
	// A backlog only exists for peers that have not taken hwm messages; give
	// them the linger time to show up, then give up.
	for end := time.Now().Add(linger); l.waiting > 0 && time.Now().Before(end); {
		time.Sleep(retryWait)
		l.retryBacklogs()
	}
	dropped := 0
	for _, d := range l.dealers {
		dropped += len(d.pending) + d.dropped
	}
	l.destroy()
	if dropped > 0 {
		return fmt.Errorf("control: close: %d messages dropped: their peers took nothing", dropped)
	}
	return nil
}

// destroy releases every socket. Send cannot be using wakeTx: the loop
// stops only after seeing closed under mu, and open fails before
// publishing it.
func (l *loop) destroy() {
	// The rule goes after the ROUTER, which may still be handshaking.
	defer func() {
		if l.zapDomain != "" {
			zap.remove(l.zapDomain)
		}
	}()
	if l.monitoring {
		_ = monitor(handle(l.router), "", 0)
	}
	l.mon.close()
	l.p.mu.Lock()
	forsaken := l.p.forsaken
	l.p.mu.Unlock()
	for _, d := range l.dealers {
		l.unwatchDealer(d)
		if forsaken[d.endpoint] {
			d.sock.setInt(zmqLinger, 0)
		}
		d.sock.close()
	}
	clear(l.dealers)
	if l.router != nil {
		l.router.Destroy()
	}
	l.routerRx.free()
	if l.wakeFD >= 0 {
		unix.Close(l.wakeFD)
	}
	if l.ep != nil {
		l.ep.Close()
	}
	if l.epfd >= 0 {
		unix.Close(l.epfd)
	}
}

// Compile-time check that the codec satisfies the standard interfaces.
var _ interface {
	MarshalBinary() ([]byte, error)
	AppendBinary([]byte) ([]byte, error)
	UnmarshalBinary([]byte) error
} = (*Message)(nil)

// watch takes every event the ROUTER's monitor has queued: cuts what the
// gate says to cut, and counts and logs (at a bounded rate) the refusals.
func (l *loop) watch() {
	for {
		l.stats.monReads++
		head, more, ok := l.mon.recv()
		if !ok {
			return
		}
		var addr []byte
		if more {
			addr, _, _ = l.mon.recv()
		}
		if len(head) != 6 {
			continue
		}
		ev := int(binary.LittleEndian.Uint16(head))
		value := binary.LittleEndian.Uint32(head[2:])
		l.p.log.Debug("control: monitor event", "event", ev, "value", value, "endpoint", string(addr))
		cut, reason := l.gate.event(ev, value, time.Now())
		if cut && cutConnection(int(value), l.p.port) {
			l.gate.Cut()
		}
		if reason != "" {
			l.p.reject.Reject(reason, "plane", "control", "detail", rejectDetail(reason))
		}
	}
}

// rejectDetail explains a reason in the log.
func rejectDetail(reason string) string {
	switch reason {
	case "busy":
		return fmt.Sprintf("more than %d connections in their handshake: cut a new one", maxUnauthenticated)
	case "auth":
		return "a peer without this job's secret (FPT_CLUSTER_SECRET)"
	case "protocol":
		return "a peer that does not speak the job's ZeroMQ protocol and security"
	}
	return fmt.Sprintf("a connection that did not complete its handshake within %s", handshakeIvl)
}

// dealerEvents are the DEALER events watchDealers follows.
// Handshake outcomes only: a monitor also following connections and their
// ends keeps ZeroMQ's context end (czmq's exit handler, for a process that
// exits with its planes open) from returning (TestExitWithOpenPlanes). So
// a program that hangs up on a CURVE greeting without a word goes
// unreported: the node then waits out FPT_START_TIMEOUT.
const dealerEvents = evHandshakeSucceeded | evHandshakeFailedNoDetail | evHandshakeFailedProtocol | evHandshakeFailedAuth

// watchDealer starts following d's handshakes: with a secret, a peer may
// refuse this node's key; with or without one, what listens on the peer's
// port may not speak ZMTP at all. A monitor that cannot be made only costs
// the report.
func (l *loop) watchDealer(d *dealer) {
	ep := fmt.Sprintf("inproc://fpt-control-dealer-%016x", rand.Uint64())
	if monitor(d.sock.h, ep, dealerEvents) != nil {
		return
	}
	mon, err := newRawSock(zmqPair)
	fd := -1
	if err == nil {
		mon.setInt(zmqRcvhwm, 0)
		if err = mon.connect(ep); err == nil {
			fd, err = mon.fd()
		}
		if err != nil {
			mon.close()
		}
	}
	if err != nil {
		_ = monitor(d.sock.h, "", 0)
		return
	}
	if err := l.addItem(fd); err != nil {
		mon.close()
		_ = monitor(d.sock.h, "", 0)
		return
	}
	d.mon, d.monFD = mon, fd
	// Its events may have been queued before its descriptor is polled.
	l.sweep = true
}

// unwatchDealer stops following d's handshakes.
func (l *loop) unwatchDealer(d *dealer) {
	if d.mon == nil {
		return
	}
	_ = monitor(d.sock.h, "", 0)
	l.removeItem(d.monFD)
	d.mon.close()
	d.mon = nil
}

// watchDealers reads the DEALERs' handshake events, from the monitors the
// round's poll found readable (every one with sweep): the failures are
// logged as each DEALER's shakeLog says, the first success ends the watch.
func (l *loop) watchDealers(sweep bool) {
	if len(l.items) == fixedItems {
		return // no DEALER is watched
	}
	for _, d := range l.dealers {
		if d.mon == nil || !sweep && !l.readableFD(d.monFD) {
			continue
		}
		for d.mon != nil {
			l.stats.monReads++
			head, more, ok := d.mon.recv()
			if !ok {
				break
			}
			if more {
				d.mon.recv()
			}
			if len(head) != 6 {
				continue
			}
			ev := int(binary.LittleEndian.Uint16(head))
			value := binary.LittleEndian.Uint32(head[2:])
			now := time.Now()
			if ev == evHandshakeSucceeded {
				l.unwatchDealer(d)
				if l.p.onHandshake != nil {
					l.p.onHandshake(d.endpoint, nil)
				}
				l.logShake(d.shakes.succeeded(d.endpoint, now))
				continue // the watch is over: d.mon is nil
			}
			why := handshakeFailure(ev, value, l.keys != nil)
			if l.p.onHandshake != nil {
				l.p.onHandshake(d.endpoint, errors.New(why))
			}
			l.logShake(d.shakes.failed(d.endpoint, ev, value, why, l.keys != nil, now))
		}
	}
}

// readableFD reports whether the round's poll found the watched DEALER
// monitor descriptor fd readable.
func (l *loop) readableFD(fd int) bool {
	for _, it := range l.items[fixedItems:] {
		if int(it.Fd) == fd {
			return it.Revents != 0
		}
	}
	return false
}

// logShake writes line, if any.
func (l *loop) logShake(line shakeLine) {
	if line.msg != "" {
		l.p.log.Log(context.Background(), line.level, line.msg, line.args...)
	}
}

// handshakeFailure says why a DEALER's handshake failed, from its monitor
// event ev and value; curve: the node speaks CURVE (it has a secret).
func handshakeFailure(ev int, value uint32, curve bool) string {
	switch {
	case ev == evHandshakeFailedAuth:
		return fmt.Sprintf("authentication refused: the peer does not accept this node's key (ZAP status %d)", value)
	case ev == evHandshakeFailedProtocol && value == protoCryptographic:
		return "authentication failed: the peer's key does not match this node's secret"
	case ev == evHandshakeFailedProtocol:
		return fmt.Sprintf("protocol error %#x: what listens there does not speak ZeroMQ's protocol as an fpt node does", value)
	case curve:
		// A peer with another secret cannot read this node's first
		// CURVE message and hangs up: that is the common case.
		return "the peer closed the connection during the authentication handshake"
	}
	return "the peer closed the connection during the ZeroMQ handshake"
}
