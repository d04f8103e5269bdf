// Package van is fpt's data plane: framed TCP between the servers and
// workers of a cluster, one connection per pair of nodes, carrying tensor
// partitions.
//
// Two implementations sit behind Transport. The epoll van (the default) runs
// one receiver goroutine, locked to its OS thread, over a level-triggered
// epoll set of every peer connection, and one sender goroutine that drains
// the node's send pool and writes header and payload with a single writev,
// the frames that follow one another in the pool to one connection
// together (up to batchBytes).
// Its goroutine count does not grow with the number of peers. The netconn
// van uses the standard library (a reader goroutine per connection, writes
// through net.Buffers); it is the honest baseline the epoll van is measured
// against, and a simple transport for tests.
//
// A connection proves membership before any frame is read from it: the
// acceptor runs the handshake (acceptHello) on a blocking net.Conn within
// HandshakeTimeout — on a short-lived goroutine for the epoll van, so that
// its loop never waits on a stranger, and on the connection's reader for
// the netconn van — and hands the connection to the receiver only once the
// dialer has said a valid Hello, is one the node admits (Config.Admit),
// and, with Config.HelloKey, has answered the challenge (auth/hello.go).
// Anything else is closed, counted (Config.OnReject) and logged at a
// bounded rate; the handler never hears of it. Past the handshake, a
// frame's length is checked against its type before any buffer exists,
// the van's own payload buffer grows as bytes arrive (doubling up to
// 64 MiB, then once to the frame's length), and a peer that stops
// mid-frame for IOTimeout is closed. The data plane authenticates
// peers; it does not encrypt.
//
// Every outgoing frame goes through the pool (package pool): within a
// destination the most urgent first, across destinations by weight.
package van

import (
	"github.com/fptps/fpt/node"

	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/fptps/fpt/frame"
)

// Handler receives what arrives. The epoll van calls it from its single
// receiver goroutine; the netconn van from one goroutine per peer, so an
// implementation must be safe for concurrent use. Calls must not block for
// long: the receiver serves every peer.
type Handler interface {
	// HandleFrame is called once per complete, validated frame other than
	// Hello and Bye. payload is only valid during the call, unless inPlace:
	// then it is the buffer the handler's Sink gave for this frame
	// (PayloadBuffer), which the handler owns again.
	HandleFrame(h *frame.Header, payload []byte, inPlace bool)
	// PeerLost is called once when the connection to a peer that had said
	// Hello ends without a Bye, or is closed for a protocol error.
	PeerLost(peer node.ID, err error)
}

// Sink may be implemented by a Handler to choose where a frame's payload
// is read to, saving the copy from the van's buffer into its destination
// (the aggregator's sum buffer, the caller's FPTPull buffer).
type Sink interface {
	// PayloadBuffer is called, on the goroutine that then calls
	// HandleFrame, once a frame's header has been validated and before its
	// payload is read. It returns a buffer of exactly h.Length bytes to read
	// the payload into, or nil to use the van's own. When it returns one,
	// the frame's HandleFrame gets that buffer as its payload, unless the
	// connection fails first (PeerLost follows then).
	PayloadBuffer(h *frame.Header) []byte
}

// Transport is a node's end of the data plane.
type Transport interface {
	// Addr is the address the van listens on ("host:port").
	Addr() string
	// Dial connects to a peer's data address and introduces this node with
	// a Hello frame. One connection per pair of nodes carries both
	// directions; by convention the node with the smaller id dials.
	Dial(ctx context.Context, peer node.ID, addr string) error
	// AwaitPeers returns once every listed peer has a connection (dialled
	// or accepted and introduced), or with ctx's error.
	AwaitPeers(ctx context.Context, peers []node.ID) error
	// Send queues m for its Header.Recipient, blocking while the pool holds
	// more than its byte limit (back-pressure). It fails at once for a
	// peer without a connection or after Close. The van sets the frame's
	// Sender and Length on the wire, not in m, which the caller may read
	// while it is queued.
	Send(m *frame.Message) error
	// Forward queues m like Send but never blocks: the receive path uses it
	// (an aggregator's broadcast), since a receiver waiting on its own pool
	// could deadlock two nodes that send to each other. Its volume is bounded
	// by what the node's peers sent it.
	Forward(m *frame.Message) error
	// SetSelf sets this node's id once the scheduler has assigned it (the
	// van listens before that, so that its port can be registered). Call it
	// before Dial, and before any peer may dial in.
	SetSelf(id node.ID)
	// SetWeight sets the share of the sender given to one destination (1 by
	// default; 0 pauses it). See package pool.
	SetWeight(peer node.ID, weight float64)
	// SetReceiveWeight sets the share of the receiver given to one source
	// (1 by default) when several have data ready: each turn of the epoll
	// loop reads up to a budget proportional to the weight. The receive
	// side never pauses a source: weight 0 gets the minimum budget. The
	// netconn van, a reader per connection, records it without effect.
	SetReceiveWeight(peer node.ID, weight float64)
	// SetShaping switches weighted shaping off (every flow and source
	// served alike, paused flows too) or back on, in both directions; the
	// weights set are kept. The LB switches it off while it probes.
	SetShaping(on bool)
	// Stats reports what moved per peer and direction so far: bytes,
	// frames, busy time, and received payload bytes by whether they were
	// read in place (see PeerStats).
	Stats() []PeerStats
	// QueuedBytes is the bytes waiting in the send pool (headers included).
	QueuedBytes() int64
	// Close drains the pool (up to the configured timeout), says Bye to
	// every peer, and releases every socket, goroutine and fd.
	Close() error
	// Abort releases everything as Close does, for a node that failed:
	// nothing queued is worth delivering and a peer may have stopped
	// reading, so it does not drain the pool (what is queued fails with
	// ErrClosed). It says Bye to every peer, so that they wait for the
	// scheduler's verdict rather than report a lost connection, but gives
	// a write stuck on a peer that does not read a second only: then
	// every connection breaks, and the peers not told Bye yet see it
	// lost. After Close or Abort, both do nothing.
	Abort() error
}

// PeerStats counts what moved between this node and one peer. The busy
// times count only while the direction was moving a frame, so that
// SentBytes/SentBusy and ReceivedBytes/ReceivedBusy estimate what the link
// carries when in use, and an idle link does not look like a slow one:
//
//   - SentBusy adds up the time the sender spent writing frames to the
//     peer, waiting for room in the socket buffer included.
//   - ReceivedBusy adds up the time from the read that began a frame to
//     the read that completed the last frame in progress. A frame that
//     arrives within one read adds nothing.
//
// The payload bytes of every complete frame received are counted once more,
// by where they were read to: ReceivedInPlaceBytes into the buffer the
// handler's Sink chose (no copy follows), ReceivedCopiedBytes into the
// van's own buffer, which the handler copies from if it keeps them.
//
// The vans convert their counters' snapshots (van/internal/peerstat) to
// PeerStats: the two types keep the same fields.
type PeerStats struct {
	Peer                 node.ID
	SentBytes            uint64 // header and payload bytes written
	ReceivedBytes        uint64 // header and payload bytes read
	SentFrames           uint64
	ReceivedFrames       uint64
	ReceivedInPlaceBytes uint64 // payload bytes read into a Sink's buffer
	ReceivedCopiedBytes  uint64 // payload bytes read into the van's buffer
	// ReadCalls is the read system calls that moved bytes from the peer's
	// connections (0 from a van without connections): the epoll van reads
	// a frame's payload and the next frame's header in one when both are
	// there, so a backlog costs about one read per frame.
	ReadCalls uint64
	// WriteCalls is the write system calls that moved bytes to the peer's
	// connections (0 from a van without connections; the netconn van
	// counts each chunk it hands the standard library as one): the
	// sender writes the frames that follow one another in its pool to
	// one connection with one writev, so a backlog of small frames costs
	// fewer writes than frames.
	WriteCalls   uint64
	SentBusy     time.Duration
	ReceivedBusy time.Duration
	// Channels is the connections (Config.Channels) the peer has, or had
	// when it was last connected; 0 from a van without connections
	// (van/memvan).
	Channels int
}

// Config configures a Transport.
type Config struct {
	// Self is this node's id, sent in Hello and checked on every frame
	// (0 until SetSelf when it is not known yet).
	Self node.ID
	// ListenAddr is "host:port" to listen on ("host:0" picks a port).
	ListenAddr string
	// Handler receives frames; required.
	Handler Handler
	// MaxPayload bounds a frame's payload; a header announcing more closes
	// the connection. Default DefaultMaxPayload.
	MaxPayload uint64
	// PartitionBytes, when set, is the cluster's FPT_PARTITION_BYTES: a
	// frame carrying a tensor piece may not announce more (requests and
	// acknowledgements nothing), checked before any buffer is allocated.
	PartitionBytes uint64
	// PoolBytes bounds the bytes queued for sending. Default DefaultPoolBytes.
	PoolBytes int64
	// UnsentBytes bounds what each connection's socket holds unsent, so
	// that the pool, not the kernel, decides what leaves next (see
	// limitUnsent). Default DefaultUnsentBytes; negative: the kernel's.
	UnsentBytes int
	// IOTimeout bounds how long a write may make no progress, and how long
	// Close waits for the pool to drain. Default DefaultIOTimeout.
	IOTimeout time.Duration
	// Logger; slog.Default() when nil.
	Logger *slog.Logger

	// HelloKey, when set, makes every connection prove membership before
	// any frame is read: the Hello becomes a challenge–response keyed by it
	// (see auth/hello.go; cluster derives it from the job's secret with
	// auth.HelloKey). A peer without the same key completes no handshake.
	// Empty: the plain Hello (protected mode, loopback only).
	HelloKey []byte
	// Admit, when set, is asked about each Hello's sender before anything
	// else is read from the connection: "" admits it, anything else is the
	// short reason it is refused ("early", "stranger", "direction"). Nil
	// admits every id.
	Admit func(peer node.ID) (reason string)
	// OnReject, when set, is called once per connection refused before it
	// became a peer, with a short fixed reason (for the rejected
	// connections counter). It must not block.
	OnReject func(reason string)
	// HandshakeTimeout bounds an accepted connection's whole handshake
	// (and a dialled one's wait for the challenge), and how long a peer's
	// first accepted channel waits for the others. Default
	// DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// Channels is the connections per pair of nodes (FPT_CHANNELS), 1 to
	// MaxChannels; every node of a cluster must use the same. Default
	// DefaultChannels. See channels.go. The in-memory van ignores it.
	Channels int
}

// Defaults.
const (
	DefaultMaxPayload = 1 << 30
	DefaultPoolBytes  = 512 << 20
	DefaultIOTimeout  = 30 * time.Second
	// DefaultHandshakeTimeout: a member answers a Hello within
	// milliseconds; a peer that sends nothing, or drips, is closed soon.
	DefaultHandshakeTimeout = 5 * time.Second
	// DefaultUnsentBytes holds about 4 ms of a 2 Gbit/s link, enough to
	// keep a fast link busy between two wake-ups of the sender.
	DefaultUnsentBytes = 1 << 20
)

// Kinds of Transport, as FPT_VAN names them.
const (
	KindEpoll   = "epoll"
	KindNetConn = "netconn"
)

// ErrClosed is returned by calls on a closed van.
var ErrClosed = errors.New("van: closed")

// ErrNoPeer is returned (wrapped) by Send and Forward for a node without a
// connection, and passed to Done for a frame whose peer was lost before it
// could be written.
var ErrNoPeer = errors.New("van: no connection to node")

// New starts a Transport of the named kind, listening on cfg.ListenAddr.
func New(kind string, cfg Config) (Transport, error) {
	if cfg.Handler == nil {
		return nil, errors.New("van: Config.Handler is nil")
	}
	if cfg.MaxPayload == 0 {
		cfg.MaxPayload = DefaultMaxPayload
	}
	if cfg.PoolBytes == 0 {
		cfg.PoolBytes = DefaultPoolBytes
	}
	if cfg.IOTimeout == 0 {
		cfg.IOTimeout = DefaultIOTimeout
	}
	if cfg.HandshakeTimeout == 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.UnsentBytes == 0 {
		cfg.UnsentBytes = DefaultUnsentBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Channels == 0 {
		cfg.Channels = DefaultChannels
	}
	if err := checkChannels(cfg.Channels); err != nil {
		return nil, err
	}
	switch kind {
	case KindEpoll, "":
		return newEpoll(cfg)
	case KindNetConn:
		return newNetConn(cfg)
	}
	return nil, fmt.Errorf("van: unknown kind %q (want %s or %s)", kind, KindEpoll, KindNetConn)
}
