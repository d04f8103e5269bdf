package van

import (
	"fmt"
	"time"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/node"
)

// A pair of nodes may be joined by several connections, its channels
// (Config.Channels, FPT_CHANNELS): where one TCP flow cannot fill a link
// (a per-flow cap, a long fat pipe), n flows can. The node with the
// smaller id dials all of them, each with its own authenticated Hello,
// which names the channel (Header.Partition) and how many there are
// (Header.Aux); the acceptor makes the peer usable only once every
// channel has proved itself. The sender and the receiver stay one
// goroutine each: the sender writes each frame to the channel channelOf
// picks, the receiver reads every channel like any other connection.
//
// Order. The pool sends one destination's frames most urgent first,
// equal priorities in order; what the layers above rely on within that is
// the order of one partition's frames (a key's iterations) and of
// everything that is not FPT tensor traffic (classic requests and their
// answers, App messages, Params, the counts that end a move or a range).
// So Push and Result frames are striped by key and partition, one
// partition always on the same channel, and every other frame takes
// channel 0: one channel keeps the single connection's order exactly.
//
// Loss. The channels of a peer live and die together: one that ends
// without its Bye breaks the others, and the peer is reported lost once,
// naming the channel that failed. A peer has left in order only when
// every channel said Bye (the sender writes Bye on each after its last
// frame).

// MaxChannels bounds Config.Channels: more connections per pair than this
// buy nothing a real link needs and cost descriptors and handshakes.
const MaxChannels = 64

// DefaultChannels is the channels per pair when Config.Channels is 0.
const DefaultChannels = 1

// channelOf is the channel (of n) that frame h travels on.
func channelOf(h *frame.Header, n int) int {
	if n <= 1 {
		return 0
	}
	switch h.Type {
	case frame.Push, frame.Result:
		// Consecutive partitions of a key, and consecutive keys of
		// one partition each, go round the channels.
		return int((h.Key*7 + uint64(h.Partition)) % uint64(n))
	}
	return 0
}

// checkChannels validates Config.Channels (0 already replaced by the
// default).
func checkChannels(n int) error {
	if n < 1 || n > MaxChannels {
		return fmt.Errorf("van: %d channels per peer; want 1 to %d", n, MaxChannels)
	}
	return nil
}

// channelGroup gathers the accepted channels of one peer until all have
// completed their handshake.
type channelGroup struct {
	links []link // by channel; nil: not yet
	got   int
	done  chan struct{} // closed once the group is complete or given up
	p     *peer
	err   error
}

// join adds an accepted channel (ch) of peer id to its group and waits,
// up to HandshakeTimeout, until every channel of the peer has come: then
// the peer is added with all its links, and every member returns it. A
// group that stays incomplete (a dialler that died between two dials, a
// channel refused) is given up: every member returns the error, and its
// caller closes its connection.
func (c *core) join(id node.ID, ch int, l link) (*peer, error) {
	n := c.cfg.Channels
	c.mu.Lock()
	g := c.groups[id]
	if g == nil {
		g = &channelGroup{links: make([]link, n), done: make(chan struct{})}
		c.groups[id] = g
	}
	if g.links[ch] != nil {
		c.mu.Unlock()
		return nil, reject("duplicate", "node %d opened channel %d twice", id, ch)
	}
	g.links[ch] = l
	if g.got++; g.got == n {
		delete(c.groups, id)
		g.p, g.err = c.addPeerLocked(id, g.links)
		close(g.done)
		c.mu.Unlock()
		return g.p, g.err
	}
	c.mu.Unlock()
	t := time.NewTimer(c.cfg.HandshakeTimeout)
	defer t.Stop()
	why := ErrClosed
	select {
	case <-g.done:
		return g.p, g.err
	case <-t.C:
		why = nil
	case <-c.closing:
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-g.done:
		return g.p, g.err
	default:
	}
	if why == nil {
		why = reject("channels", "node %d opened %d of its %d channels within %v", id, g.got, n, c.cfg.HandshakeTimeout)
	}
	if c.groups[id] == g {
		delete(c.groups, id)
	}
	g.err = why
	close(g.done)
	return nil, why
}

// endChannel is called exactly once per channel of a peer, by the
// goroutine that owns the connection, after it has ended; err is why.
// A channel that ends without its Bye breaks the peer's others, and the
// last one to end drops the peer.
func (c *core) endChannel(p *peer, ch int, err error) {
	if !p.byes[ch].Load() {
		if len(p.links) > 1 {
			err = fmt.Errorf("channel %d of %d: %w", ch, len(p.links), err)
		}
		p.fail(err)
	}
	if p.live.Add(-1) == 0 {
		c.dropPeer(p, err)
	}
}
