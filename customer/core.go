package customer

import (
	"errors"
	"fmt"
	"time"

	"github.com/fptps/fpt/appmsg"
	"github.com/fptps/fpt/node"
)

// Key names a customer: ps-lite's (app_id, customer_id).
type Key struct{ App, Customer int32 }

func (k Key) String() string { return fmt.Sprintf("app %d, customer %d", k.App, k.Customer) }

// Target is the customer of a node of role r that a message goes to, by
// ps-lite's rule: on a server (app, app) (a KVServer is one customer per
// app, whichever worker customer asked), on a worker (app, customer) (the
// response goes back to the customer that asked).
func Target(r node.Role, m *appmsg.Meta) Key {
	if r != node.Worker { // a server or the scheduler, as in ps-lite
		return Key{m.App, m.App}
	}
	return Key{m.App, m.Customer}
}

// Errors of the set's calls, wrapped with detail; test with errors.Is.
var (
	ErrExists    = errors.New("customer: already registered")
	ErrUnknown   = errors.New("customer: not registered")
	ErrRecipient = errors.New("customer: bad recipient")
	ErrFailed    = errors.New("customer: the node failed")
	ErrClosed    = errors.New("customer: closed")
)

// item is one entry of a customer's queue: a message, or (msg nil) the
// node's failure, which is always last. owner made the message's Buffer
// (nil: Go memory, or none): a message dropped before its handler ran
// gives its Buffer back to it.
type item struct {
	msg   *appmsg.Message
	err   error
	owner Allocator
}

// inbox is one registered customer's queue.
type inbox struct {
	h    Handler
	q    []item
	stop bool // removed or closed: the goroutine ends without running more
	done bool // the failure was queued: nothing more is

	// Set's: a nudge for the goroutine (one pending is enough) and its end.
	wake chan struct{}
	end  chan struct{}
}

// waiting holds the messages for a customer not registered yet, in
// arrival order; gen tells its expiry timer whether it is still the same
// wait.
type waiting struct {
	msgs  []item
	first node.ID // the first message's sender, for the failure's text
	gen   uint64
}

// core is a node's customers and what waits for them, without locks,
// goroutines or timers: Set holds its lock around every call and does
// what the results say.
type core struct {
	boxes   map[Key]*inbox
	pending map[Key]*waiting
	removed map[Key]bool
	gen     uint64
	err     error // the node's failure, once known
	closed  bool
}

func newCore() *core {
	return &core{boxes: map[Key]*inbox{}, pending: map[Key]*waiting{}, removed: map[Key]bool{}}
}

// add registers k; the messages that waited for it are its queue's start.
func (c *core) add(k Key, h Handler) (*inbox, error) {
	switch {
	case c.closed:
		return nil, ErrClosed
	case c.err != nil:
		return nil, fmt.Errorf("%w: %w", ErrFailed, c.err)
	case c.boxes[k] != nil:
		return nil, fmt.Errorf("%w: %s", ErrExists, k)
	}
	in := &inbox{h: h, wake: make(chan struct{}, 1), end: make(chan struct{})}
	if w := c.pending[k]; w != nil {
		in.q = append(in.q, w.msgs...)
		delete(c.pending, k)
	}
	delete(c.removed, k)
	c.boxes[k] = in
	return in, nil
}

// remove unregisters k; its goroutine stops after the message it is
// running, if any. It returns the messages dropped from k's queue.
func (c *core) remove(k Key) (*inbox, []item, error) {
	in := c.boxes[k]
	if in == nil {
		return nil, nil, fmt.Errorf("%w: %s", ErrUnknown, k)
	}
	delete(c.boxes, k)
	c.removed[k] = true
	dropped := in.q
	in.stop, in.q = true, nil
	return in, dropped, nil
}

// route is what became of a delivered message.
type route int

const (
	routeQueued  route = iota // on a customer's queue: wake it
	routeWaiting              // held for a customer not registered yet
	routeFirst                // held, the first for its customer: start its timer
	routeRemoved              // for a customer removed: dropped
	routeDropped              // the node failed or closed: dropped
)

// deliver routes m (its Buffer owner's), from sender, to customer k.
func (c *core) deliver(k Key, m *appmsg.Message, owner Allocator, sender node.ID) (route, *inbox, uint64) {
	if c.closed || c.err != nil {
		return routeDropped, nil, 0
	}
	it := item{msg: m, owner: owner}
	if in := c.boxes[k]; in != nil {
		in.q = append(in.q, it)
		return routeQueued, in, 0
	}
	if c.removed[k] {
		return routeRemoved, nil, 0
	}
	if w := c.pending[k]; w != nil {
		w.msgs = append(w.msgs, it)
		return routeWaiting, nil, 0
	}
	c.gen++
	c.pending[k] = &waiting{msgs: []item{it}, first: sender, gen: c.gen}
	return routeFirst, nil, c.gen
}

// expired reports whether k's wait gen is still on (its timer fired
// before the customer came): then the node fails. It drops the messages.
func (c *core) expired(k Key, gen uint64) (w *waiting, ok bool) {
	w = c.pending[k]
	if w == nil || w.gen != gen || c.closed || c.err != nil {
		return nil, false
	}
	delete(c.pending, k)
	return w, true
}

// heldNext is the schedule of a wait for a customer not registered yet,
// elapsed into it (as it starts, or at a look): expired when it has lasted
// timeout, and the node fails; otherwise the time to the next look. The
// looks are at warnAfter, then warnEvery apart, and the last at the
// timeout itself; each before the timeout logs a warning, so that a
// program that never registers the customer does not wait silently.
func heldNext(elapsed, timeout, warnAfter, warnEvery time.Duration) (next time.Duration, expired bool) {
	if elapsed >= timeout {
		return 0, true
	}
	next = warnEvery
	if elapsed < warnAfter {
		next = warnAfter - elapsed
	}
	return min(next, timeout-elapsed), false
}

// held is what waits for customer k: how many messages, the first's
// sender.
func (c *core) held(k Key) (n int, first node.ID) {
	if w := c.pending[k]; w != nil {
		return len(w.msgs), w.first
	}
	return 0, 0
}

// fail records the node's failure: every customer's queue is replaced by
// the failure alone, and whatever waits for a customer is dropped. It
// returns the inboxes to wake and the messages dropped.
func (c *core) fail(err error) (wake []*inbox, dropped []item) {
	if c.err != nil || c.closed {
		return nil, nil
	}
	c.err = err
	dropped = c.dropPending()
	for _, in := range c.boxes {
		dropped = append(dropped, in.q...)
		in.q, in.done = []item{{err: err}}, true
		wake = append(wake, in)
	}
	return wake, dropped
}

// dropPending drops what waits for customers not registered; it returns
// the messages dropped.
func (c *core) dropPending() []item {
	var dropped []item
	for _, w := range c.pending {
		dropped = append(dropped, w.msgs...)
	}
	clear(c.pending)
	return dropped
}

// close stops every customer; it returns the inboxes to wake and the
// messages dropped. A customer whose failure is queued still gets it
// (then stops): a program waiting on it must learn of the failure.
func (c *core) close() (wake []*inbox, dropped []item) {
	if c.closed {
		return nil, nil
	}
	c.closed = true
	dropped = c.dropPending()
	for k, in := range c.boxes {
		if !in.done {
			dropped = append(dropped, in.q...)
			in.stop, in.q = true, nil
		}
		delete(c.boxes, k)
		wake = append(wake, in)
	}
	return wake, dropped
}

// next takes in's next item; ok is false when its goroutine should end
// (stopped, or its failure was run), and wait true when it should wait
// for more.
func (c *core) next(in *inbox) (it item, wait, ok bool) {
	if in.stop {
		return item{}, false, false
	}
	if len(in.q) == 0 {
		if in.done {
			return item{}, false, false
		}
		return item{}, true, true
	}
	it = in.q[0]
	in.q[0] = item{}
	in.q = in.q[1:]
	if len(in.q) == 0 {
		in.q = nil // let the backing array go
	}
	return it, false, true
}
