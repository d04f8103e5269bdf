package control

import (
	"log/slog"
	"sync"
)

// Outbox is a Transport whose messages leave through one queue, drained in
// order by a goroutine of its own. Post hands a message over and returns
// without touching the transport underneath, whose Send encodes the
// message and wakes its I/O thread (over ZeroMQ, a cgo call and a system
// call): a caller on a step's path, such as the LB's per-iteration report,
// pays for neither. Send waits for the transport's Send and returns its
// error. Since both go through the one queue, messages reach the transport
// in the order Post and Send were called, whichever was used.
type Outbox struct {
	t   Transport
	log *slog.Logger

	mu     sync.Mutex
	queue  []posted
	closed bool

	wake      chan struct{} // one token: the queue may have grown, or Close
	done      chan struct{} // closed when the goroutine has drained the queue after Close
	closeOnce sync.Once
	closeErr  error
}

// posted is one queued message; result is nil for Post.
type posted struct {
	endpoint string
	m        *Message
	result   chan error
}

var _ Transport = (*Outbox)(nil)

// NewOutbox starts t's outbox. log receives the errors of posted messages
// (slog.Default() when nil). The outbox owns t from now on: its Close
// closes t.
func NewOutbox(t Transport, log *slog.Logger) *Outbox {
	if log == nil {
		log = slog.Default()
	}
	o := &Outbox{t: t, log: log, wake: make(chan struct{}, 1), done: make(chan struct{})}
	go o.run()
	return o
}

// Port implements Transport.
func (o *Outbox) Port() int { return o.t.Port() }

// Incoming implements Transport.
func (o *Outbox) Incoming() <-chan *Message { return o.t.Incoming() }

// Send implements Transport: m leaves after everything posted or sent
// before it, and Send returns once the transport underneath took it (with
// its error).
func (o *Outbox) Send(endpoint string, m *Message) error {
	r := make(chan error, 1)
	if err := o.enqueue(posted{endpoint: endpoint, m: m, result: r}); err != nil {
		return err
	}
	return <-r
}

// Post queues m for endpoint and returns at once; it fails only after
// Close (ErrClosed). m is kept until it is sent: the caller must not change
// it. An error of the transport's Send (m not encodable, endpoint
// malformed) is logged at Warn.
func (o *Outbox) Post(endpoint string, m *Message) error {
	return o.enqueue(posted{endpoint: endpoint, m: m})
}

func (o *Outbox) enqueue(p posted) error {
	o.mu.Lock()
	if o.closed {
		o.mu.Unlock()
		return ErrClosed
	}
	o.queue = append(o.queue, p)
	o.mu.Unlock()
	o.poke()
	return nil
}

func (o *Outbox) poke() {
	select {
	case o.wake <- struct{}{}:
	default: // a token is pending: the goroutine looks at the queue again anyway
	}
}

// Forsake passes on to the transport's Forsake (Plane.Forsake), if it has
// one.
func (o *Outbox) Forsake(endpoint string) {
	if f, ok := o.t.(interface{ Forsake(string) }); ok {
		f.Forsake(endpoint)
	}
}

// Close hands everything queued to the transport, then closes it, and
// returns its Close's result. Later Sends and Posts fail with ErrClosed. It
// is idempotent.
func (o *Outbox) Close() error {
	o.closeOnce.Do(func() {
		o.mu.Lock()
		o.closed = true
		o.mu.Unlock()
		o.poke()
		<-o.done
		o.closeErr = o.t.Close()
	})
	return o.closeErr
}

// run sends the queue's messages in order until Close, then what was queued
// before it.
func (o *Outbox) run() {
	defer close(o.done)
	var batch []posted
	for {
		o.mu.Lock()
		batch, o.queue = o.queue, batch[:0]
		closed := o.closed
		o.mu.Unlock()
		for i, p := range batch {
			err := o.t.Send(p.endpoint, p.m)
			switch {
			case p.result != nil:
				p.result <- err
			case err != nil:
				o.log.Warn("control: posted message not sent", "command", p.m.Command, "err", err)
			}
			batch[i] = posted{}
		}
		if closed {
			// Nothing is queued after closed is set: the batch was the last.
			return
		}
		if len(batch) == 0 {
			<-o.wake
		}
	}
}
