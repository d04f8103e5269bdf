package customer_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fptps/fpt/appmsg"
	"github.com/fptps/fpt/customer"
	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/internal/memcluster"
	"github.com/fptps/fpt/node"
)

// The tests in this file run whole clusters on the in-memory transports
// and send customer messages between their servers and workers.

func startMem(t *testing.T, servers, workers int, env map[string]string) *memcluster.Cluster {
	t.Helper()
	if env == nil {
		env = map[string]string{}
	}
	env["FPT_LB"] = "off"
	c, err := memcluster.Start(context.Background(), memcluster.Options{Servers: servers, Workers: workers, Env: env})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// got is what one customer received.
type got struct {
	mu   sync.Mutex
	msgs []*appmsg.Message
	errs []error
	ch   chan struct{} // a token per call
}

func newGot() *got { return &got{ch: make(chan struct{}, 10000)} }

func (g *got) handler(m *appmsg.Message, err error) {
	g.mu.Lock()
	if err != nil {
		g.errs = append(g.errs, err)
	} else {
		g.msgs = append(g.msgs, m)
	}
	g.mu.Unlock()
	g.ch <- struct{}{}
}

// wait waits for n more calls.
func (g *got) wait(t *testing.T, n int) {
	t.Helper()
	for range n {
		select {
		case <-g.ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("a customer got %d calls, not %d", len(g.msgs)+len(g.errs), n)
		}
	}
}

func (g *got) snapshot() ([]*appmsg.Message, []error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]*appmsg.Message(nil), g.msgs...), append([]error(nil), g.errs...)
}

func add(t *testing.T, s *customer.Set, k customer.Key) *got {
	t.Helper()
	g := newGot()
	if err := s.Add(k, g.handler); err != nil {
		t.Fatal(err)
	}
	return g
}

var (
	s0, s1 = node.ServerID(0), node.ServerID(1)
	w0, w1 = node.WorkerID(0), node.WorkerID(1)
)

// ps-lite's rule: a server delivers to (app, app), a worker to (app,
// customer); a server answers the worker customer that asked; servers and
// workers talk to each other in any direction, and to themselves.
func TestRouting(t *testing.T) {
	c := startMem(t, 2, 2, nil)
	srv := add(t, c.Customers(s0), customer.Key{App: 0, Customer: 0})
	srv1 := add(t, c.Customers(s1), customer.Key{App: 0, Customer: 0})
	wa := add(t, c.Customers(w0), customer.Key{App: 0, Customer: 0})
	wb := add(t, c.Customers(w0), customer.Key{App: 0, Customer: 1})
	other := add(t, c.Customers(w1), customer.Key{App: 0, Customer: 1})

	keys := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	req := appmsg.Meta{App: 0, Customer: 1, Timestamp: 5, Head: 42, Recipient: uint32(s0), Flags: appmsg.Request | appmsg.Push, DType: frame.Float32, Priority: 3}
	if err := c.Customers(w0).Send(&req, [][]byte{keys, {9}}); err != nil {
		t.Fatal(err)
	}
	srv.wait(t, 1)
	msgs, _ := srv.snapshot()
	m := msgs[0]
	want := req
	want.Sender = uint32(w0)
	if m.Meta != want || len(m.Segments) != 2 || string(m.Segments[0]) != string(keys) || m.Segments[1][0] != 9 {
		t.Fatalf("server got %+v %v, want %+v", m.Meta, m.Segments, want)
	}
	// The response, as a KVServer sends it, to the customer that asked.
	resp := m.Meta
	resp.Recipient, resp.Flags = m.Meta.Sender, appmsg.Pull
	if err := c.Customers(s0).Send(&resp, nil); err != nil {
		t.Fatal(err)
	}
	wb.wait(t, 1)
	if msgs, _ := wb.snapshot(); msgs[0].Meta.Sender != uint32(s0) || msgs[0].Meta.Timestamp != 5 || len(msgs[0].Segments) != 0 {
		t.Fatalf("worker customer 1 got %+v", msgs[0].Meta)
	}
	// Server to server, worker to worker, and to oneself.
	for _, tt := range []struct {
		from, to node.ID
		cust     int32
		g        *got
	}{{s0, s1, 7, srv1}, {w0, w1, 1, other}, {s0, s0, 3, srv}, {w0, w0, 0, wa}} {
		m := appmsg.Meta{App: 0, Customer: tt.cust, Recipient: uint32(tt.to), Flags: appmsg.Simple | appmsg.Request}
		if err := c.Customers(tt.from).Send(&m, [][]byte{[]byte("body")}); err != nil {
			t.Fatalf("%s to %s: %v", tt.from, tt.to, err)
		}
		tt.g.wait(t, 1)
		msgs, _ := tt.g.snapshot()
		if l := msgs[len(msgs)-1]; l.Meta.Sender != uint32(tt.from) || string(l.Segments[0]) != "body" {
			t.Fatalf("%s to %s: got %+v %q", tt.from, tt.to, l.Meta, l.Segments)
		}
	}
	if err := c.Finish(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// Sends that cannot be: a bad recipient, too many segments, a bad dtype
// or flag. None reaches anybody; the cluster carries on.
func TestSendRefused(t *testing.T) {
	c := startMem(t, 1, 1, nil)
	set := c.Customers(w0)
	for _, tt := range []struct {
		name string
		m    appmsg.Meta
		segs [][]byte
		want error
	}{
		{"group", appmsg.Meta{Recipient: 2}, nil, customer.ErrRecipient},
		{"no such server", appmsg.Meta{Recipient: uint32(s1)}, nil, customer.ErrRecipient},
		{"no such worker", appmsg.Meta{Recipient: uint32(w1)}, nil, customer.ErrRecipient},
		{"five segments", appmsg.Meta{Recipient: uint32(s0)}, make([][]byte, 5), appmsg.ErrInvalid},
		{"dtype", appmsg.Meta{Recipient: uint32(s0), DType: 7}, nil, appmsg.ErrInvalid},
		{"failed flag", appmsg.Meta{Recipient: uint32(s0), Flags: appmsg.Failed}, nil, appmsg.ErrInvalid},
	} {
		if err := set.Send(&tt.m, tt.segs); !errors.Is(err, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, err, tt.want)
		}
	}
	if err := c.Finish(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// Per sender, messages arrive in the order sent, from several senders at
// once, while the handler is slow.
func TestOrder(t *testing.T) {
	c := startMem(t, 1, 2, nil)
	var mu sync.Mutex
	last := map[uint32]int32{}
	done := make(chan struct{})
	const n = 500
	count := 0
	err := c.Customers(s0).Add(customer.Key{}, func(m *appmsg.Message, err error) {
		if err != nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if prev, ok := last[m.Meta.Sender]; ok && m.Meta.Timestamp != prev+1 {
			t.Errorf("from %d: %d after %d", m.Meta.Sender, m.Meta.Timestamp, prev)
		}
		last[m.Meta.Sender] = m.Meta.Timestamp
		if count++; count == 2*n {
			close(done)
		}
		if count%100 == 0 {
			time.Sleep(time.Millisecond)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, w := range []node.ID{w0, w1} {
		wg.Go(func() {
			for i := range int32(n) {
				m := appmsg.Meta{Timestamp: i, Recipient: uint32(s0)}
				if err := c.Customers(w).Send(&m, [][]byte{make([]byte, int(i)%300)}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatalf("%d of %d messages arrived", count, 2*n)
	}
	if err := c.Finish(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A handler that blocks holds up its own customer only: another customer
// of the same node, and the node's FPT traffic, carry on.
func TestBlockingHandler(t *testing.T) {
	c := startMem(t, 1, 1, nil)
	release := make(chan struct{})
	blocked := newGot()
	if err := c.Customers(s0).Add(customer.Key{App: 1, Customer: 1}, func(m *appmsg.Message, err error) {
		if err == nil {
			<-release
		}
		blocked.handler(m, err)
	}); err != nil {
		t.Fatal(err)
	}
	free := add(t, c.Customers(s0), customer.Key{App: 2, Customer: 2})
	send := func(app int32, n int) {
		for i := range n {
			m := appmsg.Meta{App: app, Timestamp: int32(i), Recipient: uint32(s0)}
			if err := c.Customers(w0).Send(&m, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	send(1, 3)
	send(2, 50)
	free.wait(t, 50)
	// The worker's own requests still complete.
	if err := c.Workers[0].Barrier(context.Background(), node.WorkerGroup); err != nil {
		t.Fatal(err)
	}
	if msgs, _ := blocked.snapshot(); len(msgs) != 0 {
		t.Fatalf("blocked customer ran %d", len(msgs))
	}
	close(release)
	blocked.wait(t, 3)
	if err := c.Finish(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// Messages for a customer registered late wait for it and come first, in
// order.
func TestLateRegistration(t *testing.T) {
	c := startMem(t, 1, 1, nil)
	for i := range int32(5) {
		m := appmsg.Meta{App: 3, Customer: 9, Timestamp: i, Recipient: uint32(w0)}
		if err := c.Customers(s0).Send(&m, nil); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(200 * time.Millisecond)
	g := add(t, c.Customers(w0), customer.Key{App: 3, Customer: 9})
	g.wait(t, 5)
	msgs, _ := g.snapshot()
	for i, m := range msgs {
		if m.Meta.Timestamp != int32(i) {
			t.Fatalf("message %d has timestamp %d", i, m.Meta.Timestamp)
		}
	}
	if err := c.Finish(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A message for a customer never registered fails the node after
// FPT_START_TIMEOUT, naming the app and customer; every customer in the
// cluster then hears of the failure once, and no message after.
func TestUnregisteredTimesOut(t *testing.T) {
	c := startMem(t, 1, 2, map[string]string{"FPT_START_TIMEOUT": "2"})
	gs := []*got{
		add(t, c.Customers(s0), customer.Key{}),
		add(t, c.Customers(w0), customer.Key{}),
		add(t, c.Customers(w1), customer.Key{App: 0, Customer: 4}),
	}
	m := appmsg.Meta{App: 6, Customer: 7, Recipient: uint32(w1)}
	if err := c.Customers(s0).Send(&m, nil); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for i, g := range gs {
		g.wait(t, 1)
		msgs, errs := g.snapshot()
		if len(msgs) != 0 || len(errs) != 1 {
			t.Fatalf("customer %d: %d messages, %d failures", i, len(msgs), len(errs))
		}
		if !strings.Contains(errs[0].Error(), "app 6, customer 7") {
			t.Errorf("customer %d's failure does not name the customer: %v", i, errs[0])
		}
	}
	if d := time.Since(start); d < time.Second {
		t.Fatalf("failed after %s, before FPT_START_TIMEOUT", d)
	}
	// Nothing more is delivered, sends fail.
	m = appmsg.Meta{Recipient: uint32(w0)}
	if err := c.Customers(s0).Send(&m, nil); !errors.Is(err, customer.ErrFailed) {
		t.Fatalf("send after the failure: %v", err)
	}
	time.Sleep(100 * time.Millisecond)
	for i, g := range gs {
		if msgs, errs := g.snapshot(); len(msgs)+len(errs) != 1 {
			t.Fatalf("customer %d called %d times", i, len(msgs)+len(errs))
		}
	}
}

// records is a slog.Handler that passes on the records at or above a
// level, for a test to wait for.
type records struct {
	level slog.Level
	ch    chan slog.Record
}

func (h records) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level }
func (h records) Handle(_ context.Context, r slog.Record) error {
	h.ch <- r
	return nil
}
func (h records) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h records) WithGroup(string) slog.Handler      { return h }

// next waits for the next record whose message contains msg, skipping the
// others.
func (h records) next(t *testing.T, msg string) slog.Record {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case r := <-h.ch:
			if strings.Contains(r.Message, msg) {
				return r
			}
		case <-deadline:
			t.Fatalf("no log record %q", msg)
		}
	}
}

func attr(r slog.Record, key string) string {
	var v string
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value.String()
		}
		return v == ""
	})
	return v
}

// A wait for a customer not registered yet is not silent: it is logged
// while it lasts, naming the customer and counting its messages, and its
// end is logged once the customer comes; the messages then reach it and
// the node goes on.
func TestUnregisteredWarns(t *testing.T) {
	log := records{level: slog.LevelInfo, ch: make(chan slog.Record, 10000)}
	c, err := memcluster.Start(context.Background(), memcluster.Options{Servers: 1, Workers: 1, Logger: slog.New(log),
		Env: map[string]string{"FPT_LB": "off", "FPT_START_TIMEOUT": "30"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	// The first warning a second in: the three messages are there by then.
	customer.SetHeldWarnings(c.Customers(w0), time.Second, 200*time.Millisecond)
	k := customer.Key{App: 6, Customer: 7}
	for i := range int32(3) {
		m := appmsg.Meta{App: k.App, Customer: k.Customer, Timestamp: i, Recipient: uint32(w0)}
		if err := c.Customers(s0).Send(&m, nil); err != nil {
			t.Fatal(err)
		}
	}
	const waits = "messages wait for a customer"
	for range 2 {
		r := log.next(t, waits)
		if r.Level != slog.LevelWarn || attr(r, "customer") != k.String() || attr(r, "messages") != "3" || attr(r, "first_from") != s0.String() {
			t.Fatalf("warning: %s %q customer=%q messages=%q first_from=%q", r.Level, r.Message, attr(r, "customer"), attr(r, "messages"), attr(r, "first_from"))
		}
	}
	g := add(t, c.Customers(w0), k)
	if r := log.next(t, "customer registered"); attr(r, "messages") != "3" {
		t.Fatalf("end of the wait: messages=%q", attr(r, "messages"))
	}
	g.wait(t, 3)
	if msgs, errs := g.snapshot(); len(msgs) != 3 || len(errs) != 0 {
		t.Fatalf("%d messages, %d failures", len(msgs), len(errs))
	}
	// No warning after the customer came.
	time.Sleep(500 * time.Millisecond)
	for len(log.ch) > 0 {
		if r := <-log.ch; strings.Contains(r.Message, waits) {
			t.Fatalf("a warning after registration: %q", r.Message)
		}
	}
	if err := c.Finish(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A node lost: every customer of every other node hears of it once, with
// its queue dropped, and a blocked handler is not waited for.
func TestNodeLostNotifies(t *testing.T) {
	c := startMem(t, 2, 2, nil)
	var gs []*got
	for _, id := range []node.ID{s0, w0, w1} {
		gs = append(gs, add(t, c.Customers(id), customer.Key{App: 1, Customer: 1}))
	}
	if err := c.Drop(s1); err != nil {
		t.Fatal(err)
	}
	for i, g := range gs {
		g.wait(t, 1)
		if _, errs := g.snapshot(); len(errs) != 1 || !strings.Contains(errs[0].Error(), "server1") {
			t.Fatalf("customer %d: %v", i, errs)
		}
	}
	// Adding a customer now is refused: it could only wait for ever.
	if err := c.Customers(w0).Add(customer.Key{App: 9, Customer: 9}, func(*appmsg.Message, error) {}); !errors.Is(err, customer.ErrFailed) {
		t.Fatalf("add after the failure: %v", err)
	}
}

// Removing: the handler is not running when Remove returns, later
// messages are dropped, the key may be registered again.
func TestRemove(t *testing.T) {
	c := startMem(t, 1, 1, nil)
	set := c.Customers(s0)
	k := customer.Key{App: 4, Customer: 4}
	var running sync.Mutex
	entered := make(chan struct{}, 1)
	if err := set.Add(k, func(*appmsg.Message, error) {
		running.Lock()
		entered <- struct{}{}
		time.Sleep(50 * time.Millisecond)
		running.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	m := appmsg.Meta{App: 4, Recipient: uint32(s0)}
	if err := c.Customers(w0).Send(&m, nil); err != nil {
		t.Fatal(err)
	}
	<-entered
	if err := set.Remove(k); err != nil {
		t.Fatal(err)
	}
	if !running.TryLock() {
		t.Fatal("the handler still runs after Remove returned")
	}
	if err := set.Remove(k); !errors.Is(err, customer.ErrUnknown) {
		t.Fatalf("second Remove: %v", err)
	}
	if err := c.Customers(w0).Send(&m, nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // dropped with a warning, not queued
	g := add(t, set, k)
	if err := c.Customers(w0).Send(&m, nil); err != nil {
		t.Fatal(err)
	}
	g.wait(t, 1)
	if msgs, _ := g.snapshot(); len(msgs) != 1 {
		t.Fatalf("re-registered customer got %d", len(msgs))
	}
	if err := c.Finish(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A malformed App payload from a member fails the node that received it,
// as any other malformed frame from a member does, naming the sender.
func TestMalformedFails(t *testing.T) {
	for _, to := range []node.ID{s0, w1} {
		t.Run(to.String(), func(t *testing.T) {
			c := startMem(t, 1, 2, nil)
			g := add(t, c.Customers(to), customer.Key{})
			bad := &frame.Message{Header: frame.Header{Type: frame.App, Recipient: uint32(to)}, Payload: []byte{1, 9, 0, 0}}
			if err := c.Member(w0).Van().Send(bad); err != nil {
				t.Fatal(err)
			}
			g.wait(t, 1)
			_, errs := g.snapshot()
			if len(errs) != 1 || !strings.Contains(errs[0].Error(), "appmsg") || !strings.Contains(errs[0].Error(), "worker0") {
				t.Fatalf("failure: %v", errs)
			}
		})
	}
}
