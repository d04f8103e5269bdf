package control

import (
	"fmt"
	"log/slog"
	"time"
)

// busyBound is how long a run of hang-ups from one peer is taken for the
// peer being busy rather than for a refusal: a busy plane cuts new
// connections only while maxUnauthenticated others are in their
// handshake, and each of those ends within handshakeIvl.
const busyBound = 2 * handshakeIvl

// shakeLog decides what one DEALER's handshake outcomes log. It is pure:
// the caller passes the time and writes the line.
//
// A peer that hangs up during the handshake either cut the connection
// for being busy (a connection flood: more than maxUnauthenticated in
// their handshake) or cannot read this node's credentials (another
// secret). The DEALER's monitor tells the two apart by nothing but time:
// a busy peer lets a later try through, so hang-ups are reported as
// such, and blamed on the secret only once they have gone on for
// busyBound.
type shakeLog struct {
	since    time.Time // first failure since the last success; zero: none
	hangups  int       // hang-ups since then
	unlogged int       // failures since the last line
	lastLog  time.Time // of the last line about failures
}

// shakeLine is a log line to write; msg "" is none.
type shakeLine struct {
	level slog.Level
	msg   string
	args  []any
}

// failed takes a failed handshake with endpoint (the monitor's event ev
// and value, why: handshakeFailure's words), at now; curve: this node
// speaks CURVE (it has a secret).
func (s *shakeLog) failed(endpoint string, ev int, value uint32, why string, curve bool, now time.Time) shakeLine {
	if s.since.IsZero() {
		s.since = now
	}
	hangup := ev == evHandshakeFailedNoDetail && hungUp(value)
	if hangup {
		s.hangups++
	}
	s.unlogged++
	if now.Sub(s.lastLog) < rejectLogEvery {
		return shakeLine{}
	}
	n := s.unlogged
	s.lastLog, s.unlogged = now, 0
	failing := now.Sub(s.since)
	if hangup && failing < busyBound {
		return shakeLine{level: slog.LevelWarn,
			msg: "control: a peer hung up during the handshake; connecting again",
			args: []any{"peer", endpoint, "why", why, "failed_handshakes", n,
				"hint", fmt.Sprintf("a peer busy with more than %d connections in their handshake (a connection flood) cuts new ones; one with another FPT_CLUSTER_SECRET hangs up on every try", maxUnauthenticated)}}
	}
	hint := "is an fpt node listening there?"
	if curve {
		hint = "is FPT_CLUSTER_SECRET (or FPT_CLUSTER_SECRET_FILE) the same on every node?"
	}
	return shakeLine{level: slog.LevelError, msg: "control: the handshake with a peer failed; " + hint,
		args: []any{"peer", endpoint, "why", why, "failed_handshakes", n, "failing_for", failing.Round(time.Millisecond)}}
}

// succeeded takes a handshake with endpoint that succeeded, at now: after
// hang-ups, it says that the peer was busy rather than refusing.
func (s *shakeLog) succeeded(endpoint string, now time.Time) shakeLine {
	hangups, since := s.hangups, s.since
	*s = shakeLog{}
	if hangups == 0 {
		return shakeLine{}
	}
	return shakeLine{level: slog.LevelInfo,
		msg:  "control: the handshake with a peer succeeded after it hung up on earlier tries: the peer was busy (a connection flood), not refusing this node",
		args: []any{"peer", endpoint, "hangups", hangups, "after", now.Sub(since).Round(time.Millisecond)}}
}
