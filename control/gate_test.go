package control

import (
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
			{evHandshakeFailedNoDetail, 110, 5 * time.Second, false, "handshake"},
			{evDisconnected, 7, 5 * time.Second, false, ""},
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
