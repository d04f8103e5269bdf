package control

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestGate: what the gate cuts and counts for sequences of monitor events.
func TestGate(t *testing.T) {
	t0 := time.Unix(1000, 0)
	type step struct {
		ev     int
		value  uint32
		at     time.Duration // after t0
		cut    bool
		reason string
	}
	tests := []struct {
		name  string
		limit int
		steps []step
	}{
		{"member", 2, []step{
			{evAccepted, 7, 0, false, ""},
			{evHandshakeSucceeded, 0, 0, false, ""},
			{evDisconnected, 7, time.Second, false, ""},
		}},
		{"wrong secret", 2, []step{
			{evAccepted, 7, 0, false, ""},
			{evHandshakeFailedProtocol, protoCryptographic, 0, false, "auth"},
			{evDisconnected, 7, 0, false, ""},
		}},
		{"wrong client key", 2, []step{{evHandshakeFailedAuth, 400, 0, false, "auth"}}},
		{"bad command", 2, []step{{evHandshakeFailedProtocol, 0x11000002, 0, false, "protocol"}}},
		{"timeout", 2, []step{
			{evAccepted, 7, 0, false, ""},
			{evHandshakeFailedNoDetail, 11, 5 * time.Second, false, "handshake"},
			{evDisconnected, 7, 5 * time.Second, false, ""},
		}},
		// A connect and close (a starting member's probe of the
		// scheduler's port, a health check): libzmq reports the reset
		// (bytes of its greeting unread) or the broken pipe.
		{"port probe, reset", 2, []step{
			{evAccepted, 7, 0, false, ""},
			{evHandshakeFailedNoDetail, 104, 0, false, ""},
			{evDisconnected, 7, 0, false, ""},
		}},
		{"port probe, closed", 2, []step{
			{evAccepted, 7, 0, false, ""},
			{evHandshakeFailedNoDetail, 32, 0, false, ""},
			{evDisconnected, 7, 0, false, ""},
		}},
		{"downgrade, no outcome reported", 2, []step{
			{evAccepted, 7, 0, false, ""},
			{evDisconnected, 7, 0, false, "protocol"},
		}},
		{"downgrade beside a handshake: not counted rather than a member", 2, []step{
			{evAccepted, 7, 0, false, ""},
			{evAccepted, 8, 0, false, ""},
			{evHandshakeSucceeded, 0, 0, false, ""},
			{evDisconnected, 7, 0, false, ""},
		}},
		{"over the limit", 2, []step{
			{evAccepted, 7, 0, false, ""},
			{evAccepted, 8, 0, false, ""},
			{evAccepted, 9, 0, true, "busy"},
			// The cut connection's failure is not counted twice.
			{evHandshakeFailedNoDetail, 104, 0, false, ""},
			// A success frees a place.
			{evHandshakeSucceeded, 0, 0, false, ""},
			{evAccepted, 10, 0, false, ""},
			{evAccepted, 11, 0, true, "busy"},
		}},
		{"places free again after the handshake interval", 1, []step{
			{evAccepted, 7, 0, false, ""},
			{evAccepted, 8, time.Second, true, "busy"},
			{evAccepted, 9, handshakeIvl, false, ""},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := newGate(tt.limit, handshakeIvl)
			for i, s := range tt.steps {
				cut, reason := g.event(s.ev, s.value, t0.Add(s.at))
				if cut != s.cut || reason != s.reason {
					t.Fatalf("step %d (event %#x %d): cut %v, reason %q; want %v, %q", i, s.ev, s.value, cut, reason, s.cut, s.reason)
				}
				if cut {
					g.Cut()
				}
			}
		})
	}
}

// TestPortProbeIsNoRefusal: connections that close before any handshake
// (a starting member's probe of the scheduler's port, a health check) are
// neither counted nor logged as refusals, on a real plane; a bad greeting
// after them still is.
func TestPortProbeIsNoRefusal(t *testing.T) {
	var logged lockedBuffer
	var mu sync.Mutex
	refused := map[string]int{}
	p, err := Listen(Config{BindHost: "127.0.0.1", Secret: testSecret,
		Logger: slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelDebug})),
		OnReject: func(r string) {
			mu.Lock()
			refused[r]++
			mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(p.Port()))
	dial := func() net.Conn {
		t.Helper()
		c, err := net.DialTimeout("tcp", addr, waitTime)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	disconnects := func() int { return strings.Count(logged.String(), fmt.Sprintf("event=%d ", evDisconnected)) }
	const probes = 4
	for i := range probes {
		c := dial()
		if i%2 == 1 {
			// After the plane's greeting has begun: the close then
			// resets the connection rather than ending it.
			c.SetReadDeadline(time.Now().Add(waitTime))
			if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
				t.Fatal(err)
			}
		}
		c.Close()
	}
	// Each connection's disconnection is reported after its handshake's
	// failure, and the plane takes the events in order.
	for deadline := time.Now().Add(waitTime); disconnects() < probes; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d probes' disconnections seen; log:\n%s", disconnects(), probes, logged.String())
		}
	}
	mu.Lock()
	n := len(refused)
	mu.Unlock()
	if n != 0 || strings.Contains(logged.String(), "control: refused") {
		t.Fatalf("port probes counted as refusals %v; log:\n%s", refused, logged.String())
	}
	// What is not a probe is still refused.
	c := dial()
	c.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
	c.Close()
	for deadline := time.Now().Add(waitTime); ; time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		n := refused["protocol"]
		mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a bad greeting not refused as protocol; log:\n%s", logged.String())
		}
	}
}
