package control

import (
	"bytes"
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
// ROUTER's ZAP domain names the rule.
type zapRule struct {
	key    []byte // the client's 32-byte CURVE public key
	reject func(reason string)
}

// zapHandler answers ZAP requests on its own goroutine, for the life of the
// process. Like zsysInit it is process-wide on purpose: it stands for the
// context's single ZAP endpoint. A self-made REP socket rather than
// goczmq's Auth actor: Auth loads client certificates from a directory of
// files, whereas the keys here are derived in memory and differ per plane
// domain; and its logic is a dozen lines.
type zapHandler struct {
	once    sync.Once
	openErr error
	started atomic.Bool
	stop    atomic.Bool   // set by Shutdown: release the socket and return
	done    chan struct{} // closed when run has returned

	mu    sync.Mutex
	rules map[string]zapRule // by ZAP domain
}

var zap = &zapHandler{rules: make(map[string]zapRule), done: make(chan struct{})}

// zapPoll bounds how long the handler waits for a request before looking
// at stop: Shutdown must destroy its socket before the context ends.
const zapPoll = 100 * time.Millisecond

// shutdown stops the handler, if it runs, and waits until its socket is
// destroyed.
func (z *zapHandler) shutdown() {
	if !z.started.Load() {
		return
	}
	z.stop.Store(true)
	<-z.done
}

// add installs rule under domain, starting the handler on first use.
func (z *zapHandler) add(domain string, rule zapRule, log *slog.Logger) error {
	z.once.Do(func() {
		ready := make(chan error, 1)
		z.started.Store(true)
		go z.run(ready, log)
		z.openErr = <-ready
	})
	if z.openErr != nil {
		return z.openErr
	}
	z.mu.Lock()
	z.rules[domain] = rule
	z.mu.Unlock()
	return nil
}

func (z *zapHandler) remove(domain string) {
	z.mu.Lock()
	delete(z.rules, domain)
	z.mu.Unlock()
}

func (z *zapHandler) run(ready chan<- error, log *slog.Logger) {
	defer close(z.done)
	runtime.LockOSThread() // errno, and the socket's one thread
	zsysInit.Do(zsysInitC)
	s, err := newSock(goczmq.Rep)
	if err != nil {
		ready <- err
		return
	}
	defer s.Destroy()
	s.SetLinger(0)
	s.SetRcvtimeo(int(zapPoll / time.Millisecond))
	if err := retryEINTR(func() error { _, err := s.Bind(zapEndpoint); return err }); err != nil {
		ready <- fmt.Errorf("control: bind the ZAP handler at %s: %w", zapEndpoint, err)
		return
	}
	ready <- nil
	for !z.stop.Load() {
		req, err := s.RecvMessage()
		if err != nil {
			if e := zmqErrno(); e != syscall.EINTR && e != syscall.EAGAIN {
				log.Error("control: ZAP handler: receive failed; refusing every new connection", "err", zmqError(e))
				return
			}
			continue
		}
		reply := z.answer(req)
		for retryEINTR(func() error { return s.SendMessage(reply) }) != nil {
			log.Error("control: ZAP handler: reply failed", "err", zmqError(zmqErrno()))
			break
		}
	}
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
		if rule.reject != nil {
			rule.reject("handshake")
		}
		return deny("400", "not a member of this job")
	}
	return [][]byte{[]byte("1.0"), id, []byte("200"), []byte("OK"), []byte("member"), nil}
}
