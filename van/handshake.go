package van

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/fptps/fpt/auth"
	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/node"
)

// maxHandshakes bounds the accepted connections in their handshake at
// once: each holds a short-lived goroutine, and a flood of connections must
// not turn into a flood of goroutines. A connection over the bound is
// closed at once (reason "busy"); members retry nothing, but they dial
// once per pair, so a cluster never has more than its size in flight.
const maxHandshakes = 256

// rejectLogEvery bounds the log lines about refused connections and failed
// accepts: at most one per reason per interval, with the count skipped.
const rejectLogEvery = 5 * time.Second

// rejection is a connection refused before it became a peer: a stranger,
// a peer without the key, a stall. It is counted and logged at a bounded
// rate, never reported to the handler.
type rejection struct {
	reason string // short fixed word for the counter
	err    error
}

func (r *rejection) Error() string { return fmt.Sprintf("refused (%s): %v", r.reason, r.err) }
func (r *rejection) Unwrap() error { return r.err }

func reject(reason string, format string, args ...any) error {
	return &rejection{reason: reason, err: fmt.Errorf(format, args...)}
}

// rateLog logs at most one line per key per interval.
type rateLog struct {
	log   *slog.Logger
	every time.Duration

	mu      sync.Mutex
	last    map[string]time.Time
	skipped map[string]int
}

func newRateLog(log *slog.Logger, every time.Duration) *rateLog {
	return &rateLog{log: log, every: every, last: make(map[string]time.Time), skipped: make(map[string]int)}
}

func (r *rateLog) warn(key, msg string, args ...any) {
	now := time.Now()
	r.mu.Lock()
	if t, ok := r.last[key]; ok && now.Sub(t) < r.every {
		r.skipped[key]++
		r.mu.Unlock()
		return
	}
	skipped := r.skipped[key]
	r.last[key], r.skipped[key] = now, 0
	r.mu.Unlock()
	if skipped > 0 {
		args = append(args, "similar_since_last_line", skipped)
	}
	r.log.Warn(msg, args...)
}

// refused counts and logs a connection closed before it became a peer.
func (c *core) refused(remote string, err error) {
	reason := "protocol"
	var r *rejection
	if errors.As(err, &r) {
		reason = r.reason
	}
	if c.cfg.OnReject != nil {
		c.cfg.OnReject(reason)
	}
	c.rejects.warn(reason, "van: refused a connection", "remote", remote, "reason", reason, "err", err)
}

// acceptHello runs an accepted connection's handshake on a blocking
// net.Conn, within HandshakeTimeout, and returns the peer it proved to be
// and the channel the connection is.
// It reads exactly the handshake's bytes, so that the first frame is left
// in the socket for the receiver. Without a key it is the plain Hello.
func (c *core) acceptHello(nc net.Conn) (node.ID, int, error) {
	if err := nc.SetDeadline(time.Now().Add(c.cfg.HandshakeTimeout)); err != nil {
		return 0, 0, err
	}
	var hdr [frame.HeaderSize]byte
	if _, err := io.ReadFull(nc, hdr[:]); err != nil {
		return 0, 0, reject("handshake", "no hello within %v: %w", c.cfg.HandshakeTimeout, err)
	}
	key := c.cfg.HelloKey
	var wantLen uint64
	if len(key) > 0 {
		wantLen = auth.NonceSize
	}
	h, err := frame.Decode(hdr[:], auth.NonceSize)
	if err != nil {
		return 0, 0, reject("protocol", "hello: %w", err)
	}
	self := c.selfID()
	switch {
	case h.Type != frame.Hello:
		return 0, 0, reject("protocol", "first frame is %s, want hello", h.Type)
	case self == 0:
		return 0, 0, reject("early", "hello from node %d before this node has an id", h.Sender)
	case node.ID(h.Recipient) != self:
		return 0, 0, reject("protocol", "hello for node %d arrived at node %d", h.Recipient, self)
	case h.Sender == 0 || node.ID(h.Sender) == self:
		return 0, 0, reject("protocol", "hello from invalid node id %d", h.Sender)
	case h.Length != wantLen && wantLen == 0:
		return 0, 0, reject("auth", "node %d offers an authenticated hello; this node has no cluster secret", h.Sender)
	case h.Length != wantLen:
		return 0, 0, reject("auth", "node %d sent a plain hello; this node requires the cluster secret (FPT_CLUSTER_SECRET)", h.Sender)
	}
	peer := node.ID(h.Sender)
	if c.cfg.Admit != nil {
		if reason := c.cfg.Admit(peer); reason != "" {
			return 0, 0, reject(reason, "hello from node %d, which may not dial this node (%s)", peer, reason)
		}
	}
	// A Hello names its channel and how many the dialler opens (0 from a
	// node that knows of one only).
	ch, n := int(h.Partition), max(int(h.Aux), 1)
	switch {
	case n != c.cfg.Channels:
		return 0, 0, reject("channels", "node %d opens %d channels per peer, this node expects %d (FPT_CHANNELS must be the same on every node)", peer, n, c.cfg.Channels)
	case ch >= n:
		return 0, 0, reject("protocol", "hello from node %d for channel %d of %d", peer, ch, n)
	}
	if len(key) > 0 {
		t := auth.Transcript{DialerID: uint32(peer), AcceptorID: uint32(self)}
		if _, err := io.ReadFull(nc, t.DialerNonce[:]); err != nil {
			return 0, 0, reject("handshake", "hello nonce from node %d: %w", peer, err)
		}
		if _, err := rand.Read(t.AcceptorNonce[:]); err != nil {
			return 0, 0, fmt.Errorf("van: nonce: %w", err)
		}
		chal := auth.EncodeChallenge(t.AcceptorNonce, t.MAC(key, auth.Acceptor))
		if _, err := nc.Write(chal[:]); err != nil {
			return 0, 0, reject("handshake", "challenge to node %d: %w", peer, err)
		}
		var mac [auth.MACSize]byte
		if _, err := io.ReadFull(nc, mac[:]); err != nil {
			return 0, 0, reject("auth", "no answer from node %d to the challenge (wrong secret?): %w", peer, err)
		}
		if err := t.Verify(key, auth.Dialer, mac[:]); err != nil {
			return 0, 0, reject("auth", "node %d: %w", peer, err)
		}
	}
	if err := nc.SetDeadline(time.Time{}); err != nil {
		return 0, 0, err
	}
	return peer, ch, nil
}
