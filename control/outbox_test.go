package control

import (
	"errors"
	"sync"
	"testing"
	"time"
)

// gated is a Transport whose Send blocks until open is closed, recording
// what it was given in order.
type gated struct {
	open    chan struct{}
	in      chan *Message
	mu      sync.Mutex
	sent    []uint64 // the messages' Seq
	entered chan struct{}
}

func newGated() *gated {
	return &gated{open: make(chan struct{}), in: make(chan *Message), entered: make(chan struct{}, 100)}
}

func (g *gated) Port() int                 { return 1 }
func (g *gated) Incoming() <-chan *Message { return g.in }
func (g *gated) Close() error              { return nil }
func (g *gated) Send(endpoint string, m *Message) error {
	g.entered <- struct{}{}
	<-g.open
	g.mu.Lock()
	defer g.mu.Unlock()
	g.sent = append(g.sent, m.Seq)
	return nil
}

const outboxWait = 30 * time.Second

// Post returns while the transport's Send is blocked, and posted and sent
// messages reach the transport in the order they were handed over, the
// first of them while it blocked.
func TestOutboxPostsInOrder(t *testing.T) {
	g := newGated()
	o := NewOutbox(g, nil)
	post := func(seq uint64) {
		t.Helper()
		if err := o.Post("tcp://h:1", &Message{Command: Report, Seq: seq}); err != nil {
			t.Fatal(err)
		}
	}
	post(1) // the goroutine takes it and blocks in g.Send
	select {
	case <-g.entered:
	case <-time.After(outboxWait):
		t.Fatal("the outbox never sent the first post")
	}
	post(2)
	sent := make(chan error, 1)
	go func() { sent <- o.Send("tcp://h:1", &Message{Command: Barrier, Seq: 3}) }()
	// Post 4 only once 3 is queued, so that the order handed over is 1 to 4.
	deadline := time.Now().Add(outboxWait)
	for {
		o.mu.Lock()
		n := len(o.queue)
		o.mu.Unlock()
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d messages queued; want 2 (the post and the send)", n)
		}
		time.Sleep(time.Millisecond)
	}
	post(4)
	select {
	case err := <-sent:
		t.Fatalf("Send returned (%v) while the transport's Send was blocked", err)
	default:
	}
	close(g.open)
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	want := []uint64{1, 2, 3, 4}
	if len(g.sent) != len(want) {
		t.Fatalf("sent %v; want %v", g.sent, want)
	}
	for i := range want {
		if g.sent[i] != want[i] {
			t.Fatalf("sent %v; want %v", g.sent, want)
		}
	}
	if err := o.Post("tcp://h:1", &Message{Command: Report}); !errors.Is(err, ErrClosed) {
		t.Errorf("Post after Close: %v; want ErrClosed", err)
	}
	if err := o.Send("tcp://h:1", &Message{Command: Report}); !errors.Is(err, ErrClosed) {
		t.Errorf("Send after Close: %v; want ErrClosed", err)
	}
}

// Send returns the transport's error; a posted message's error is logged,
// and the ones after it still go.
func TestOutboxSendErrors(t *testing.T) {
	o := NewOutbox(&failing{}, nil)
	defer o.Close()
	if err := o.Post("tcp://h:1", &Message{Seq: 1}); err != nil {
		t.Fatal(err)
	}
	if err := o.Send("tcp://h:1", &Message{Seq: 2}); err == nil {
		t.Fatal("Send of a message the transport refuses: nil error")
	}
}

type failing struct{}

func (failing) Port() int                   { return 1 }
func (failing) Incoming() <-chan *Message   { return nil }
func (failing) Close() error                { return nil }
func (failing) Send(string, *Message) error { return errors.New("refused") }
