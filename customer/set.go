// Package customer holds a server's or worker's customers: the handlers
// that ps-lite's Customer class stands for, on which the C++ API of
// include/ps (KVWorker, KVServer, SimpleApp) is built over fpt.h's
// fpt_customer_add / fpt_msg_send.
//
// A customer is a Handler registered under a Key (app id, customer id). A
// message (package appmsg) travels in a frame.App data-plane frame and is
// delivered to a customer of its recipient by ps-lite's rule (Target): on
// a server to (app, app), on a worker to (app, customer).
//
// Delivery never blocks the van's receive goroutine: HandleFrame copies
// the payload onto the customer's queue, in memory and unbounded, and
// each customer has a goroutine of its own that runs its handler one
// message at a time, in arrival order (per sender, the order sent, among
// messages of equal priority: the send pool lets a more urgent message
// overtake). A handler may block, and may send.
//
// A message for a customer that is not registered yet waits for it, up to
// FPT_START_TIMEOUT from the first such message; then the node fails,
// naming the app and customer (a program that never creates the KVServer
// it is sent to would otherwise hang). A wait that lasts is logged, after
// 10 s and then every 30 s, so that it is not silent until then. A
// message for a customer that was removed is dropped with a warning. When
// the node fails, every customer's queue is dropped and its handler is
// called once more with the failure (appmsg.Failed in the flags, no
// segments); nothing is delivered after.
//
// A message to the node itself is delivered locally, without the van,
// through the same decoding and queues as any other (ps-lite programs
// send a SimpleApp request to a whole group, which may include the
// sender).
//
// The logic lives in core (core.go), which holds no lock and starts
// nothing; Set is its shell.
package customer

import (
	"bytes"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/fptps/fpt/appmsg"
	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/van"
)

// Handler receives a customer's messages, one at a time, in order, on the
// customer's goroutine. m and its segments are the handler's to keep.
// When err is not nil the node failed: m carries the customer's key and
// appmsg.Failed and no segments, and this call is the last.
type Handler func(m *appmsg.Message, err error)

// Node is what a Set needs of the node it belongs to (a *cluster.Member).
type Node interface {
	Self() node.Info
	Info(id node.ID) (node.Info, bool)
	Config() config.Config
	Logger() *slog.Logger
	Van() van.Transport
	Done() <-chan struct{}
	Closed() <-chan struct{}
	Err() error
	Fail(err error)
}

// ControlApps is what a Node offers for messages to or from the
// scheduler's customers, which travel over the control plane (the
// scheduler has no data plane): SendApp sends an encoded message to node
// to, and OnApp installs the function that takes one that arrived.
// A Node without it neither sends to nor receives from the scheduler.
type ControlApps interface {
	SendApp(to node.ID, priority int32, payload []byte) error
	OnApp(deliver func(from node.ID, priority int32, payload []byte))
}

// Allocator makes the buffers App payloads are read into, and frees them:
// libfpt's reads them into C memory that its C++ customers keep without a
// copy (fpt_customer_add_keep). Alloc returns exactly n bytes; Free takes
// back what Alloc made.
type Allocator interface {
	Alloc(n int) []byte
	Free(b []byte)
}

// Set is a node's customers.
type Set struct {
	n Node

	// alloc is the Allocator (nil: Go memory); allocated holds the
	// buffers it made that the van is reading into, by address, so that
	// HandleFrame knows a payload as one of them.
	alloc     atomic.Pointer[Allocator]
	allocMu   sync.Mutex
	allocated map[*byte]struct{}

	mu     sync.Mutex
	c      *core
	timers map[Key]*heldWait
	// warnAfter and warnEvery space the warnings of a wait (heldNext).
	warnAfter, warnEvery time.Duration

	quit    chan struct{}
	watched chan struct{}
	once    sync.Once
}

// The warnings of a wait for a customer not registered yet: messages
// held for a moment while a program starts are usual, held for seconds
// they are a program that may never register it.
const (
	heldWarnAfter = 10 * time.Second
	heldWarnEvery = 30 * time.Second
)

// heldWait is the timer of a wait for a customer not registered yet.
type heldWait struct {
	t      *time.Timer
	since  time.Time
	warned bool // a warning was logged: its end is logged too
}

// New makes the customer set of n, which it watches for failure until
// Close or n's close.
func New(n Node) *Set {
	s := &Set{n: n, c: newCore(), timers: map[Key]*heldWait{}, warnAfter: heldWarnAfter, warnEvery: heldWarnEvery,
		quit: make(chan struct{}), watched: make(chan struct{})}
	if a, ok := n.(ControlApps); ok {
		a.OnApp(func(from node.ID, priority int32, payload []byte) {
			if err := s.deliver(from, priority, payload); err != nil {
				n.Logger().Warn("malformed app message over the control plane dropped", "from", from, "err", err)
			}
		})
	}
	go s.watch()
	return s
}

func (s *Set) watch() {
	defer close(s.watched)
	select {
	case <-s.n.Done():
	case <-s.n.Closed():
		// A member closed without a failure (finalized, or a failed
		// start) sends nothing more; a failure it recorded first counts.
		if s.n.Err() == nil {
			return
		}
	case <-s.quit:
		return
	}
	err := s.n.Err()
	s.mu.Lock()
	wake, dropped := s.c.fail(err)
	s.stopTimers()
	s.mu.Unlock()
	s.wake(wake)
	freeDropped(dropped)
}

// freeDropped gives the Buffers of messages that reach no handler back
// to the allocators that made them.
func freeDropped(dropped []item) {
	for _, it := range dropped {
		if it.owner != nil && it.msg != nil && it.msg.Buffer != nil {
			it.owner.Free(it.msg.Buffer)
		}
	}
}

// Add registers h as customer k and starts its goroutine; messages that
// waited for k come first.
func (s *Set) Add(k Key, h Handler) error {
	s.mu.Lock()
	in, err := s.c.add(k, h)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	w := s.timers[k]
	if w != nil {
		w.t.Stop()
		delete(s.timers, k)
	}
	held := len(in.q)
	go s.run(k, in)
	if held > 0 {
		in.wake <- struct{}{}
	}
	s.mu.Unlock()
	if w != nil && w.warned {
		s.n.Logger().Info("customer registered: the messages that waited for it go to it", "customer", k, "messages", held,
			"waited", time.Since(w.since).Round(time.Millisecond))
	}
	return nil
}

// Info describes node id of the set's cluster (its node's table); ok is
// false for an id that is no node of it.
func (s *Set) Info(id node.ID) (node.Info, bool) { return s.n.Info(id) }

// Used reports whether a customer was ever registered: ps-lite's
// KVWorker and KVServer talk to particular servers, and cannot go on
// without one that left.
func (s *Set) Used() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.c.boxes) > 0 || len(s.c.removed) > 0
}

// Remove unregisters customer k. When it returns, k's handler is not
// running and will not run again. Not from k's own handler (it would wait
// for itself).
func (s *Set) Remove(k Key) error {
	s.mu.Lock()
	in, dropped, err := s.c.remove(k)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	s.mu.Unlock()
	s.wake([]*inbox{in})
	freeDropped(dropped)
	<-in.end
	return nil
}

// run is customer k's goroutine.
func (s *Set) run(k Key, in *inbox) {
	defer close(in.end)
	for {
		s.mu.Lock()
		it, wait, ok := s.c.next(in)
		s.mu.Unlock()
		switch {
		case !ok:
			return
		case wait:
			<-in.wake
			continue
		}
		if it.msg == nil {
			in.h(&appmsg.Message{Meta: appmsg.Meta{App: k.App, Customer: k.Customer, Flags: appmsg.Failed,
				Recipient: uint32(s.n.Self().ID)}}, it.err)
			continue
		}
		in.h(it.msg, nil)
	}
}

// wake nudges the goroutines of ins (without blocking: one pending
// nudge is enough, the goroutine rereads its queue).
func (s *Set) wake(ins []*inbox) {
	for _, in := range ins {
		select {
		case in.wake <- struct{}{}:
		default:
		}
	}
}

func (s *Set) stopTimers() {
	for k, w := range s.timers {
		w.t.Stop()
		delete(s.timers, k)
	}
}

// UseAllocator makes a the allocator of the payloads read from now on (a
// message of them carries its buffer in appmsg.Message.Buffer, and its
// handler frees it). Setting it again replaces it; buffers already made
// are freed by the allocator that made them.
func (s *Set) UseAllocator(a Allocator) { s.alloc.Store(&a) }

// PayloadBuffer is the buffer an App frame's payload is read into (the
// role's van.Sink passes it on): the message's own, which HandleFrame then
// keeps without a copy; the Allocator's when there is one.
func (s *Set) PayloadBuffer(h *frame.Header) []byte {
	a := s.alloc.Load()
	if a == nil || h.Length == 0 {
		return make([]byte, h.Length)
	}
	b := (*a).Alloc(int(h.Length))
	s.allocMu.Lock()
	if s.allocated == nil {
		s.allocated = map[*byte]struct{}{}
	}
	s.allocated[unsafe.SliceData(b)] = struct{}{}
	s.allocMu.Unlock()
	return b
}

// HandleFrame takes an App frame from the van: payload is the Set's to
// keep when inPlace (read into PayloadBuffer's buffer), else valid during
// the call only, and copied. An error is a malformed payload from a
// member, which the role treats as it does any other malformed frame.
func (s *Set) HandleFrame(h *frame.Header, payload []byte, inPlace bool) error {
	if !inPlace {
		return s.deliver(node.ID(h.Sender), h.Priority, bytes.Clone(payload))
	}
	var owner Allocator
	if a := s.alloc.Load(); a != nil && len(payload) > 0 {
		s.allocMu.Lock()
		if _, ok := s.allocated[unsafe.SliceData(payload)]; ok {
			delete(s.allocated, unsafe.SliceData(payload))
			owner = *a
		}
		s.allocMu.Unlock()
	}
	return s.deliverOwned(node.ID(h.Sender), h.Priority, payload, owner)
}

// deliver decodes payload (the Set's to keep) and routes it.
func (s *Set) deliver(from node.ID, priority int32, payload []byte) error {
	return s.deliverOwned(from, priority, payload, nil)
}

// deliverOwned is deliver of a payload that owner made (nil: Go memory):
// the message carries it as its Buffer, or it is freed here when the
// message goes nowhere.
func (s *Set) deliverOwned(from node.ID, priority int32, payload []byte, owner Allocator) error {
	m, err := appmsg.Decode(payload)
	if err != nil {
		if owner != nil {
			owner.Free(payload)
		}
		return err
	}
	if owner != nil {
		m.Buffer = payload
	}
	self := s.n.Self()
	m.Meta.Sender, m.Meta.Recipient, m.Meta.Priority = uint32(from), uint32(self.ID), priority
	k := Target(self.Role, &m.Meta)
	s.mu.Lock()
	r, in, gen := s.c.deliver(k, &m, owner, from)
	if r == routeFirst {
		w := &heldWait{since: time.Now()}
		next, _ := heldNext(0, s.n.Config().StartTimeout, s.warnAfter, s.warnEvery)
		w.t = time.AfterFunc(next, func() { s.look(k, gen, w) })
		s.timers[k] = w
	}
	s.mu.Unlock()
	switch r {
	case routeQueued:
		s.wake([]*inbox{in})
	case routeDropped:
		if owner != nil {
			owner.Free(payload)
		}
	case routeRemoved:
		if owner != nil {
			owner.Free(payload)
		}
		s.n.Logger().Warn("message for a removed customer dropped", "customer", k, "from", from, "head", m.Meta.Head, "timestamp", m.Meta.Timestamp)
	}
	return nil
}

// look is the timer of wait hw for customer k (its gen): while the
// customer is not registered it warns, until FPT_START_TIMEOUT, when the
// node fails.
func (s *Set) look(k Key, gen uint64, hw *heldWait) {
	timeout := s.n.Config().StartTimeout
	s.mu.Lock()
	if s.timers[k] != hw { // registered, or the node failed or closed
		s.mu.Unlock()
		return
	}
	waited := time.Since(hw.since)
	next, expired := heldNext(waited, timeout, s.warnAfter, s.warnEvery)
	if !expired {
		held, first := s.c.held(k)
		hw.warned = true
		hw.t.Reset(next)
		s.mu.Unlock()
		s.n.Logger().Warn("messages wait for a customer that this node has not registered; the node fails if it is not registered within FPT_START_TIMEOUT (a ps-lite KVServer registers at set_request_handle)",
			"customer", k, "messages", held, "first_from", first, "waited", waited.Round(time.Second), "timeout", timeout)
		return
	}
	w, ok := s.c.expired(k, gen)
	delete(s.timers, k)
	s.mu.Unlock()
	if !ok {
		return
	}
	freeDropped(w.msgs)
	s.n.Fail(fmt.Errorf("customer: %d message(s) for %s (the first from %s) waited %s for that customer to be registered on %s (FPT_START_TIMEOUT): does the program create it (a ps-lite KVServer registers at set_request_handle)?",
		len(w.msgs), k, w.first, timeout, s.n.Self().ID))
}

// Send sends a message to m.Recipient (a server or worker of the cluster;
// this node too). The segments are free again when it returns: to another
// server or worker they go from where they lie, gathered behind the
// encoded meta by the van's write, and Send waits until that write is
// done; to this node or over the control plane they are copied first. It
// blocks while the van's send pool is full.
func (s *Set) Send(m *appmsg.Meta, segs [][]byte) error {
	if err := s.n.Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrFailed, err)
	}
	to := node.ID(m.Recipient)
	self := s.n.Self()
	apps, viaControl := s.n.(ControlApps)
	viaControl = viaControl && (to == node.SchedulerID || self.Role == node.Scheduler)
	info, ok := s.n.Info(to)
	if !ok || (info.Role != node.Server && info.Role != node.Worker && !(viaControl && info.Role == node.Scheduler)) {
		return fmt.Errorf("%w: %d is no node of this cluster that has customers", ErrRecipient, m.Recipient)
	}
	if err := appmsg.Check(m, segs, s.n.Config().MaxFrameBytes); err != nil {
		return err
	}
	if to == self.ID {
		s.mu.Lock()
		closed := s.c.closed
		s.mu.Unlock()
		if closed {
			return ErrClosed
		}
		return s.deliver(self.ID, m.Priority, appmsg.Encode(make([]byte, 0, appmsg.Size(segs)), m, segs))
	}
	if viaControl {
		if err := apps.SendApp(to, m.Priority, appmsg.Encode(make([]byte, 0, appmsg.Size(segs)), m, segs)); err != nil {
			return s.sendErr(to, err)
		}
		return nil
	}
	// The van holds segs until Done: the caller's memory must not be
	// reused before the frame is written (or can no longer be).
	written := make(chan error, 1)
	err := s.n.Van().Send(&frame.Message{
		Header:  frame.Header{Type: frame.App, Recipient: uint32(to), Priority: m.Priority},
		Payload: appmsg.EncodeHead(make([]byte, 0, appmsg.Overhead), m, segs),
		More:    segs,
		Done:    func(err error) { written <- err },
	})
	if err == nil {
		err = <-written
	}
	if err != nil {
		return s.sendErr(to, err)
	}
	return nil
}

// sendErr is Send's error for a send to to that failed with err: the
// node's failure when there is one (which is why the send failed).
func (s *Set) sendErr(to node.ID, err error) error {
	if ferr := s.n.Err(); ferr != nil {
		return fmt.Errorf("%w: %w", ErrFailed, ferr)
	}
	return fmt.Errorf("customer: send to %s: %w", to, err)
}

// Close stops every customer and waits for their goroutines (a handler
// running finishes first). Later messages are dropped; Add fails. It is
// idempotent.
func (s *Set) Close() {
	s.once.Do(func() {
		close(s.quit)
		<-s.watched
		s.mu.Lock()
		wake, dropped := s.c.close()
		s.stopTimers()
		s.mu.Unlock()
		s.wake(wake)
		freeDropped(dropped)
		for _, in := range wake {
			<-in.end
		}
	})
}
