package control

import (
	"syscall"
	"time"
)

// monitorEvents are the ROUTER events the loop follows (raw.go's names).
const monitorEvents = evAccepted | evDisconnected | evHandshakeSucceeded |
	evHandshakeFailedNoDetail | evHandshakeFailedProtocol | evHandshakeFailedAuth

// gate follows the ROUTER's connections through its monitor's events and
// decides which to cut and which refusals to count. It is the pure part:
// no sockets, no clock (the caller passes the time), no locks.
//
// libzmq names the descriptor of an accepted or disconnected connection
// but not of a handshake's outcome, so the connections still in their
// handshake are counted, not named: those accepted less than ivl ago and
// still open, less the handshakes that succeeded in that time (libzmq ends
// any handshake longer than ivl).
type gate struct {
	limit int
	ivl   time.Duration
	open  map[int]accepted // accepted, not yet disconnected
	wins  []time.Time      // handshakes that succeeded, oldest first
	// outcomes counts the handshake outcomes (either way) reported.
	outcomes uint64
	// cutting counts connections cut (Cut) whose failure libzmq has not
	// reported yet: that failure is not counted again.
	cutting int
}

// accepted is what the gate knows of one open connection.
type accepted struct {
	at       time.Time
	outcomes uint64 // gate.outcomes when it was accepted
}

func newGate(limit int, ivl time.Duration) gate {
	return gate{limit: limit, ivl: ivl, open: make(map[int]accepted)}
}

// pending is the number of connections that may still be in their handshake.
func (g *gate) pending(now time.Time) int {
	for len(g.wins) > 0 && now.Sub(g.wins[0]) >= g.ivl {
		g.wins = g.wins[1:]
	}
	n := 0
	for _, a := range g.open {
		if now.Sub(a.at) < g.ivl {
			n++
		}
	}
	return max(n-len(g.wins), 0)
}

// event takes one monitor event and says what to do: cut the connection
// on descriptor value, and/or count a refusal for reason ("" none).
func (g *gate) event(ev int, value uint32, now time.Time) (cut bool, reason string) {
	switch ev {
	case evHandshakeSucceeded, evHandshakeFailedAuth, evHandshakeFailedProtocol, evHandshakeFailedNoDetail:
		g.outcomes++
	}
	switch ev {
	case evAccepted:
		fd := int(value)
		if g.pending(now) >= g.limit {
			return true, "busy"
		}
		g.open[fd] = accepted{at: now, outcomes: g.outcomes}
	case evHandshakeSucceeded:
		g.wins = append(g.wins, now)
	case evHandshakeFailedAuth:
		return false, "auth"
	case evHandshakeFailedProtocol:
		if value == protoCryptographic {
			return false, "auth" // a client key from another secret
		}
		return false, "protocol"
	case evHandshakeFailedNoDetail:
		if g.cutting > 0 {
			g.cutting--
			return false, ""
		}
		if hungUp(value) {
			// The peer closed before its handshake ended: a port probe
			// (a starting member's, a health check's, a scanner's)
			// holds nothing and forges nothing, so it is no refusal.
			return false, ""
		}
		return false, "handshake" // timed out half-way
	case evDisconnected:
		fd := int(value)
		a, ok := g.open[fd]
		delete(g.open, fd)
		if ok && a.outcomes == g.outcomes {
			// No handshake ended, this one's or any other, while it was
			// open: libzmq refused its greeting without saying so (ZMTP
			// 1.0 or 2.0, or bytes that are no greeting, while
			// authentication is on). Under concurrent handshakes such a
			// refusal goes uncounted rather than a member counted.
			return false, "protocol"
		}
	}
	return false, ""
}

// Cut records that the connection event said to cut was cut.
func (g *gate) Cut() { g.cutting++ }

// hungUp reports whether errno, a failed handshake's, says that the peer
// closed its end (with or without bytes unread), rather than that the
// handshake interval ran out (libzmq then reports the errno of its last
// read, EAGAIN).
func hungUp(errno uint32) bool {
	return errno == uint32(syscall.EPIPE) || errno == uint32(syscall.ECONNRESET)
}
