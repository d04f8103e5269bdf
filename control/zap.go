package control

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/zeromq/goczmq"
)

// zapEndpoint is where libzmq asks a CURVE server's ZAP handler whether to
// admit a client; it is fixed by RFC 27 and global to the (czmq-shared)
// ZeroMQ context, so one handler serves every plane of the process.
const zapEndpoint = "inproc://zeromq.zap.01"

// zapRule is what one plane's ROUTER admits: clients presenting key. Its
// ROUTER's ZAP domain names the rule. A refusal is counted by the plane,
// from its ROUTER's monitor (HANDSHAKE_FAILED_AUTH).
type zapRule struct {
	key []byte // the client's 32-byte CURVE public key
}

// zapHandler answers ZAP requests on its own goroutine while some plane
// with a secret is open: started by the first, stopped when the last
// closes, so that no socket is left when the context ends. Like zsysInit it
// is process-wide on purpose: it stands for the context's single ZAP
// endpoint. A self-made REP socket rather than goczmq's Auth actor: Auth
// loads client certificates from a directory of files, whereas the keys
// here are derived in memory and differ per plane domain; and its logic is
// a dozen lines.
type zapHandler struct {
	life sync.Mutex    // serialises starting and stopping
	stop *atomic.Bool  // the running handler's stop flag; nil: none runs
	done chan struct{} // closed when the running handler has returned

	mu    sync.Mutex
	rules map[string]zapRule // by ZAP domain

	// timeouts counts receives that ended on zapPoll rather than on a
	// request or a wake-up: none while the handler works as meant.
	timeouts atomic.Int64
}

var zap = &zapHandler{rules: make(map[string]zapRule)}

// zapPoll bounds how long the handler waits for a request before looking
// at its stop flag should the wake-up (wakeZAP) be lost. It is long: each
// wake-up of the handler's locked thread takes a processor from the data
// plane, and polling every 20 ms cost the data plane 3 % of its goodput on
// a 2-core machine (fpt bench --auth-compare).
const zapPoll = time.Second

// add installs rule under domain, starting the handler if none runs.
func (z *zapHandler) add(domain string, rule zapRule, log *slog.Logger) error {
	z.life.Lock()
	defer z.life.Unlock()
	if z.stop == nil {
		stop, done, ready := new(atomic.Bool), make(chan struct{}), make(chan error, 1)
		go z.run(stop, done, ready, log)
		if err := <-ready; err != nil {
			<-done
			return err
		}
		z.stop, z.done = stop, done
	}
	z.mu.Lock()
	z.rules[domain] = rule
	z.mu.Unlock()
	return nil
}

// remove drops domain's rule, and stops the handler after the last one.
func (z *zapHandler) remove(domain string) {
	z.life.Lock()
	defer z.life.Unlock()
	z.mu.Lock()
	delete(z.rules, domain)
	last := len(z.rules) == 0
	z.mu.Unlock()
	if last {
		z.stopLocked()
	}
}

// shutdown stops the handler, if it runs (Shutdown: every plane is closed).
func (z *zapHandler) shutdown() {
	z.life.Lock()
	defer z.life.Unlock()
	z.stopLocked()
}

func (z *zapHandler) stopLocked() {
	if z.stop == nil {
		return
	}
	z.stop.Store(true)
	wakeZAP()
	<-z.done
	z.stop, z.done = nil, nil
}

func (z *zapHandler) run(stop *atomic.Bool, done chan<- struct{}, ready chan<- error, log *slog.Logger) {
	defer close(done)
	runtime.LockOSThread() // errno, and the socket's one thread
	defer runtime.UnlockOSThread()
	zsysInit.Do(zsysInitC)
	if !enterRound() {
		ready <- errors.New("control: the process is exiting")
		parkForExit()
	}
	s, err := z.open()
	leaveRound()
	if err != nil {
		ready <- err
		return
	}
	ready <- nil
	defer func() {
		if !enterRound() {
			parkForExit()
		}
		s.Destroy()
		leaveRound()
	}()
	for !stop.Load() {
		if !enterRound() {
			parkForExit()
		}
		ok := z.serveOne(s, stop, log)
		leaveRound()
		if !ok {
			return
		}
	}
}

// open makes the handler's socket, bound at the ZAP endpoint.
func (z *zapHandler) open() (*goczmq.Sock, error) {
	s, err := newSock(goczmq.Rep)
	if err != nil {
		return nil, err
	}
	s.SetLinger(0)
	s.SetRcvtimeo(int(zapPoll / time.Millisecond))
	// The previous handler's endpoint may take a moment to be released.
	var bindErr error
	for range 100 {
		if bindErr = retryEINTR(func() error { _, err := s.Bind(zapEndpoint); return err }); bindErr == nil {
			return s, nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.Destroy()
	return nil, fmt.Errorf("control: bind the ZAP handler at %s: %w", zapEndpoint, bindErr)
}

// serveOne waits up to zapPoll for one request and answers it; false when
// the handler must end (stopped, or its socket failed).
func (z *zapHandler) serveOne(s *goczmq.Sock, stop *atomic.Bool, log *slog.Logger) bool {
	req, err := s.RecvMessage()
	e := zmqErrno() // before anything else can touch errno
	if err != nil && e == syscall.EAGAIN {
		z.timeouts.Add(1)
	}
	if stop.Load() {
		return false // woken to stop (wakeZAP)
	}
	if err != nil {
		if e != syscall.EINTR && e != syscall.EAGAIN {
			log.Error("control: ZAP handler: receive failed; refusing every new connection", "err", zmqError(e))
			return false
		}
		return true
	}
	reply := z.answer(req)
	if err := retryEINTR(func() error { return s.SendMessage(reply) }); err != nil {
		log.Error("control: ZAP handler: reply failed", "err", err)
	}
	return true
}

// answer decides one ZAP request (RFC 27): version, request id, domain,
// address, identity, mechanism, credentials.
func (z *zapHandler) answer(req [][]byte) [][]byte {
	if len(req) < 6 {
		return [][]byte{[]byte("1.0"), nil, []byte("500"), []byte("malformed request"), nil, nil}
	}
	id := req[1]
	deny := func(code, reason string) [][]byte {
		return [][]byte{[]byte("1.0"), id, []byte(code), []byte(reason), nil, nil}
	}
	z.mu.Lock()
	rule, ok := z.rules[string(req[2])]
	z.mu.Unlock()
	if !ok {
		return deny("400", "unknown domain")
	}
	if string(req[5]) != "CURVE" || len(req) != 7 || !bytes.Equal(req[6], rule.key) {
		return deny("400", "not a member of this job")
	}
	return [][]byte{[]byte("1.0"), id, []byte("200"), []byte("OK"), []byte("member"), nil}
}

// wakeZAP sends the handler one frame, so that its receive returns and it
// sees its stop flag at once. The REQ socket is its own, made and
// destroyed on this locked thread; it lingers until the frame is taken.
// It is raw (raw.go): at the end of a process whose descriptors strangers
// used up, failing to make it must not abort the process.
func wakeZAP() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	s, err := newRawSock(zmqReq)
	if err != nil {
		return // the handler stops after zapPoll instead
	}
	defer s.close()
	s.setInt(zmqLinger, int(zapPoll/time.Millisecond))
	if s.connect(zapEndpoint) != nil {
		return
	}
	for !s.send([]byte("stop"), false) && zmqErrno() == syscall.EINTR {
	}
}
