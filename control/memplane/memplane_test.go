package memplane_test

import (
	"errors"
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/fptps/fpt/control"
	"github.com/fptps/fpt/control/memplane"
	"github.com/fptps/fpt/node"
)

func endpoint(p *memplane.Plane) string { return "tcp://127.0.0.1:" + strconv.Itoa(p.Port()) }

func listen(t *testing.T, n *memplane.Network, port int) *memplane.Plane {
	t.Helper()
	p, err := n.Listen(port, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// recv takes the next message, or nil after a short wait.
func recv(p *memplane.Plane, wait time.Duration) *control.Message {
	select {
	case m := <-p.Incoming():
		return m
	case <-time.After(wait):
		return nil
	}
}

func TestOrderAndCopy(t *testing.T) {
	n := memplane.NewNetwork()
	a, b := listen(t, n, 0), listen(t, n, 0)
	if a.Port() == b.Port() {
		t.Fatal("two planes on one port")
	}
	m := &control.Message{Command: control.Barrier, Sender: node.WorkerID(0), Nodes: []node.Info{{Role: node.Worker, Host: "h", ControlPort: 1}}}
	for seq := range uint64(100) {
		m.Seq = seq
		if err := a.Send(endpoint(b), m); err != nil {
			t.Fatal(err)
		}
	}
	m.Nodes[0].Host = "changed after Send"
	for seq := range uint64(100) {
		got := recv(b, 5*time.Second)
		if got == nil || got.Seq != seq || got.Command != control.Barrier || got.Nodes[0].Host != "h" {
			t.Fatalf("message %d: got %+v", seq, got)
		}
	}
}

// A message to a port nobody listens on yet waits for its listener, as
// ZeroMQ queues for a peer that is not up.
func TestSendBeforeListen(t *testing.T) {
	n := memplane.NewNetwork()
	a := listen(t, n, 0)
	if err := a.Send("tcp://127.0.0.1:9000", &control.Message{Command: control.AddNode}); err != nil {
		t.Fatal(err)
	}
	s := listen(t, n, 9000)
	if got := recv(s, 5*time.Second); got == nil || got.Command != control.AddNode {
		t.Fatalf("got %+v", got)
	}
	if _, err := n.Listen(9000, nil); err == nil {
		t.Fatal("a second plane on port 9000")
	}
}

func TestHoldReleaseDrop(t *testing.T) {
	n := memplane.NewNetwork()
	a, b, c := listen(t, n, 0), listen(t, n, 0), listen(t, n, 0)
	n.Hold(a.Port(), b.Port())
	for seq := range uint64(3) {
		a.Send(endpoint(b), &control.Message{Command: control.Heartbeat, Seq: seq})
	}
	c.Send(endpoint(b), &control.Message{Command: control.Heartbeat, Seq: 99})
	if got := recv(b, 5*time.Second); got == nil || got.Seq != 99 {
		t.Fatalf("got %+v, want c's message past the held route", got)
	}
	if got := recv(b, 20*time.Millisecond); got != nil {
		t.Fatalf("a held message arrived: %+v", got)
	}
	n.Release(a.Port(), b.Port())
	for seq := range uint64(3) {
		if got := recv(b, 5*time.Second); got == nil || got.Seq != seq {
			t.Fatalf("released message %d: got %+v", seq, got)
		}
	}
	n.Drop(c.Port())
	c.Send(endpoint(b), &control.Message{Command: control.Heartbeat})
	b.Send(endpoint(c), &control.Message{Command: control.Heartbeat})
	if got := recv(b, 20*time.Millisecond); got != nil {
		t.Fatalf("a dropped node's message arrived: %+v", got)
	}
	if got := recv(c, 20*time.Millisecond); got != nil {
		t.Fatalf("a message reached a dropped node: %+v", got)
	}
}

func TestErrorsAndClose(t *testing.T) {
	n := memplane.NewNetwork()
	a := listen(t, n, 0)
	for _, ep := range []string{"127.0.0.1:1", "tcp://127.0.0.1", "tcp://:5", "tcp://h:0", "tcp://h:x"} {
		if err := a.Send(ep, &control.Message{Command: control.Heartbeat}); err == nil {
			t.Errorf("Send to %q accepted", ep)
		}
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := <-a.Incoming(); ok {
		t.Error("Incoming open after Close")
	}
	if err := a.Send("tcp://h:5", &control.Message{Command: control.Heartbeat}); !errors.Is(err, control.ErrClosed) {
		t.Errorf("Send after Close: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Error("second Close:", err)
	}
}
