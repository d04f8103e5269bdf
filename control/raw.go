package control

/*
#cgo pkg-config: libczmq libzmq
#include <czmq.h>
#include <sys/socket.h>

static int fpt_set_int(void *s, int opt, int v) { return zmq_setsockopt(s, opt, &v, sizeof v); }
static int fpt_get_int(void *s, int opt, int *v) { size_t n = sizeof *v; return zmq_getsockopt(s, opt, v, &n); }
// czmq's own socket calls below zsock: they return NULL rather than
// assert, and track the socket, so that czmq's exit handler closes one
// left open before it ends the context (an untracked socket would block
// zmq_ctx_term, and so the process's exit, for ever).
static void *fpt_socket(int type) { return zsys_socket(type, "control/raw.go", 0); }
static void fpt_close(void *h) { zsys_close(h, "control/raw.go", 0); }

// fpt_recv_frame receives one frame without blocking, in one cgo call:
// its size, or -1 with *err set to errno. A frame of at most n bytes is
// copied to buf and m closed; a longer one is left in m for the caller.
#include <string.h>
static int fpt_recv_frame(void *s, zmq_msg_t *m, void *buf, size_t n, int *more, int *err) {
	zmq_msg_init(m);
	if (zmq_msg_recv(m, s, ZMQ_DONTWAIT) < 0) {
		*err = zmq_errno();
		zmq_msg_close(m);
		return -1;
	}
	size_t size = zmq_msg_size(m);
	*more = zmq_msg_more(m);
	if (size <= n) {
		memcpy(buf, zmq_msg_data(m), size);
		zmq_msg_close(m);
	}
	return (int)size;
}
#cgo noescape fpt_recv_frame
#cgo nocallback fpt_recv_frame
*/
import "C"

import (
	"fmt"
	"reflect"
	"syscall"
	"unsafe"

	"github.com/zeromq/goczmq"
	"golang.org/x/sys/unix"
)

// rawSock is a libzmq socket used without czmq's zsock, on the process's
// (czmq) context. zsock asserts, aborting the process, when it cannot
// create a socket (no file descriptor left, ZMQ_MAX_SOCKETS reached);
// zsys_socket, beneath it, returns NULL. Every socket made after Listen, while strangers may be
// holding connections open, is therefore raw: a failure to create one is
// an error, never an abort. Like every socket it belongs to one goroutine.
type rawSock struct{ h unsafe.Pointer }

func newRawSock(kind int) (*rawSock, error) {
	zsysInit.Do(zsysInitC)
	h := C.fpt_socket(C.int(kind))
	if h == nil {
		return nil, fmt.Errorf("control: creating a ZeroMQ socket failed: %w", zmqError(zmqErrno()))
	}
	s := &rawSock{h: h}
	// libzmq's default linger is forever, which would block the context's
	// end (Shutdown) on an unreachable peer.
	s.setInt(C.ZMQ_LINGER, 0)
	return s, nil
}

func (s *rawSock) setInt(opt C.int, v int) {
	C.fpt_set_int(s.h, opt, C.int(v))
}

func (s *rawSock) setString(opt C.int, v string) {
	b := []byte(v)
	if len(b) == 0 {
		return
	}
	C.zmq_setsockopt(s.h, opt, unsafe.Pointer(&b[0]), C.size_t(len(b)))
}

func (s *rawSock) connect(endpoint string) error {
	ep := C.CString(endpoint)
	defer C.free(unsafe.Pointer(ep))
	for C.zmq_connect(s.h, ep) != 0 {
		if e := zmqErrno(); e != syscall.EINTR {
			return zmqError(e)
		}
	}
	return nil
}

// send sends one frame without blocking; the caller reads errno on failure.
func (s *rawSock) send(data []byte, more bool) bool {
	flags := C.int(C.ZMQ_DONTWAIT)
	if more {
		flags |= C.ZMQ_SNDMORE
	}
	var p unsafe.Pointer
	if len(data) > 0 {
		p = unsafe.Pointer(&data[0])
	}
	return C.zmq_send(s.h, p, C.size_t(len(data)), flags) >= 0
}

// recv reads one frame without blocking into a new slice; ok false when
// none is waiting (or on any error).
func (s *rawSock) recv() (frame []byte, more, ok bool) {
	var msg C.zmq_msg_t
	C.zmq_msg_init(&msg)
	defer C.zmq_msg_close(&msg)
	for C.zmq_msg_recv(&msg, s.h, C.ZMQ_DONTWAIT) < 0 {
		if zmqErrno() != syscall.EINTR {
			return nil, false, false
		}
	}
	frame = C.GoBytes(C.zmq_msg_data(&msg), C.int(C.zmq_msg_size(&msg)))
	return frame, C.zmq_msg_more(&msg) != 0, true
}

// frameReader receives frames from one socket into a reused buffer, one
// cgo call each (goczmq's RecvFrame makes five, and a sixth for errno).
type frameReader struct {
	h   unsafe.Pointer
	msg *C.zmq_msg_t // C memory: libzmq may point into it between calls
	buf []byte
}

// frameBuffer holds any ordinary control message's frames; a larger frame
// gets a slice of its own.
const frameBuffer = 64 << 10

func newFrameReader(h unsafe.Pointer) *frameReader {
	return &frameReader{
		h:   h,
		msg: (*C.zmq_msg_t)(C.malloc(C.sizeof_zmq_msg_t)),
		buf: make([]byte, frameBuffer),
	}
}

// recv receives one frame without blocking, into the buffer from offset
// off when it fits there: the frame is then valid until a later recv
// writes over it. errno is non-zero when there was none (EAGAIN) or the
// call failed.
func (r *frameReader) recv(off int) (frame []byte, more bool, errno syscall.Errno) {
	var m, e C.int
	room := r.buf[off:]
	var p unsafe.Pointer
	if len(room) > 0 {
		p = unsafe.Pointer(&room[0])
	}
	n := C.fpt_recv_frame(r.h, r.msg, p, C.size_t(len(room)), &m, &e)
	if n < 0 {
		return nil, false, syscall.Errno(e)
	}
	if int(n) <= len(room) {
		return room[:n:n], m != 0, 0
	}
	frame = C.GoBytes(C.zmq_msg_data(r.msg), n)
	C.zmq_msg_close(r.msg)
	return frame, m != 0, 0
}

func (r *frameReader) free() {
	if r != nil && r.msg != nil {
		C.free(unsafe.Pointer(r.msg))
		r.msg = nil
	}
}

func (s *rawSock) close() {
	if s != nil && s.h != nil {
		C.fpt_close(s.h)
		s.h = nil
	}
}

// monitor makes libzmq report events on sock to endpoint (inproc), or
// stops reporting with endpoint "".
func monitor(sock unsafe.Pointer, endpoint string, events int) error {
	var ep *C.char
	if endpoint != "" {
		ep = C.CString(endpoint)
		defer C.free(unsafe.Pointer(ep))
	}
	if C.zmq_socket_monitor(sock, ep, C.int(events)) != 0 {
		return fmt.Errorf("control: monitor: %w", zmqError(zmqErrno()))
	}
	return nil
}

// setHandleInt sets an integer option on a libzmq socket.
func setHandleInt(h unsafe.Pointer, opt C.int, v int) error {
	if C.fpt_set_int(h, opt, C.int(v)) != 0 {
		return zmqError(zmqErrno())
	}
	return nil
}

// handle is the libzmq socket inside a goczmq socket.
func handle(s *goczmq.Sock) unsafe.Pointer {
	f := reflect.ValueOf(s).Elem().FieldByName("zsockT")
	z := *(*unsafe.Pointer)(unsafe.Pointer(f.UnsafeAddr()))
	return C.zsock_resolve(z)
}

// fd is the descriptor libzmq signals when the socket has commands to
// process (ZMQ_FD). It is edge-like: it turns readable when something
// arrives for a socket that has been read until EAGAIN, so a loop that
// drains a socket whenever it polls readable never misses input.
func (s *rawSock) fd() (int, error) { return handleFD(s.h) }

// handleFD is ZMQ_FD of a libzmq socket.
func handleFD(h unsafe.Pointer) (int, error) {
	var v C.int
	if C.fpt_get_int(h, C.ZMQ_FD, &v) != 0 {
		return -1, fmt.Errorf("control: ZMQ_FD: %w", zmqError(zmqErrno()))
	}
	return int(v), nil
}

// cutConnection ends an accepted TCP connection libzmq owns, by shutting
// it down (never closing it: the descriptor stays libzmq's), after making
// sure the descriptor still is a new connection to localPort: an event
// names a descriptor that may have been closed and reused since, perhaps
// by a member's connection accepted after it.
func cutConnection(fd, localPort int) bool {
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		return false
	}
	var port int
	switch a := sa.(type) {
	case *syscall.SockaddrInet4:
		port = a.Port
	case *syscall.SockaddrInet6:
		port = a.Port
	default:
		return false
	}
	if port != localPort {
		return false
	}
	if _, err := syscall.Getpeername(fd); err != nil {
		return false // the listener itself, or not connected
	}
	if pastGreeting(fd) {
		return false
	}
	return syscall.Shutdown(fd, syscall.SHUT_RDWR) == nil
}

// greetingLen is the size of the ZMTP 3 greeting each side sends first.
const greetingLen = 64

// pastGreeting reports whether the peer on fd has had more than the
// ROUTER's greeting from it: the ROUTER sends its next command (READY, or
// CURVE's WELCOME, which needs the job's server key) only after a valid
// greeting and mechanism step from the peer, so such a connection is a
// member's (or a peer with the secret's) and never one to cut as new.
func pastGreeting(fd int) bool {
	info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
	return err == nil && info.Bytes_acked > greetingLen
}

// Constants of raw.go's callers, in Go's types.
const (
	zmqPair                   = C.ZMQ_PAIR
	zmqDealer                 = C.ZMQ_DEALER
	zmqReq                    = C.ZMQ_REQ
	zmqLinger                 = C.ZMQ_LINGER
	zmqSndhwm                 = C.ZMQ_SNDHWM
	zmqRcvhwm                 = C.ZMQ_RCVHWM
	zmqImmediate              = C.ZMQ_IMMEDIATE
	zmqHandshakeIvl           = C.ZMQ_HANDSHAKE_IVL
	zmqRoutingID              = C.ZMQ_ROUTING_ID
	zmqIpv6                   = C.ZMQ_IPV6
	zmqTcpKeepalive           = C.ZMQ_TCP_KEEPALIVE
	zmqTcpKeepaliveIdle       = C.ZMQ_TCP_KEEPALIVE_IDLE
	zmqTcpKeepaliveIntvl      = C.ZMQ_TCP_KEEPALIVE_INTVL
	zmqTcpKeepaliveCnt        = C.ZMQ_TCP_KEEPALIVE_CNT
	zmqCurveServerkey         = C.ZMQ_CURVE_SERVERKEY
	zmqCurvePublickey         = C.ZMQ_CURVE_PUBLICKEY
	zmqCurveSecretkey         = C.ZMQ_CURVE_SECRETKEY
	evAccepted                = C.ZMQ_EVENT_ACCEPTED
	evDisconnected            = C.ZMQ_EVENT_DISCONNECTED
	evHandshakeSucceeded      = C.ZMQ_EVENT_HANDSHAKE_SUCCEEDED
	evHandshakeFailedNoDetail = C.ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL
	evHandshakeFailedProtocol = C.ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL
	evHandshakeFailedAuth     = C.ZMQ_EVENT_HANDSHAKE_FAILED_AUTH
	protoCryptographic        = C.ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC
)
