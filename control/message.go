// Package control is fpt's control plane: small messages between the
// scheduler and the other nodes over ZeroMQ (registration, node table,
// barriers, heartbeats, failure notices, termination, and later the LB's
// reports and decisions).
//
// Every node binds one ROUTER socket and keeps one DEALER per peer it talks
// to, all owned by a single goroutine, since goczmq sockets are not safe for
// concurrent use (plane.go: Listen, Plane.Send, Plane.Incoming, Plane.Close).
// The message type (this file) and its codec (codec.go: MarshalBinary,
// AppendBinary, Unmarshal) are pure and fuzzed; one encoded Message is one
// ZeroMQ frame. Transport (transport.go) is what the scheduler and
// cluster.Member need of a plane, so that tests can run them on the
// in-memory one (control/memplane).
package control

import "github.com/fptps/fpt/node"

// Command says what a control message asks or announces.
type Command uint8

// Commands.
const (
	// AddNode registers a node with the scheduler: Nodes[0] describes the
	// sender (its ID 0, or the id of the rank its launcher pinned). A
	// worker process of several customers (ps-lite's Start(customer_id)
	// from several threads) registers each further one with Seq its
	// customer id + 1, after its own AddNode: each counts as a worker.
	AddNode Command = 1 + iota
	// NodeTable answers AddNode once every node has registered: Nodes is
	// the full table (scheduler included) and Recipient the receiver's id.
	// Body begins with the job's stamp (8 bytes, little-endian: the
	// scheduler's clock at the table, Unix ns; it orders checkpoints
	// across a job's restarts). In a job's first table, pairs of 32-bit
	// words follow: a worker's id and the customers it counts for, for
	// each worker process of several (AddNode).
	NodeTable
	// Barrier asks the scheduler to release Group's barrier number Seq once
	// every member has asked. FlagFinal marks the shut-down barrier.
	Barrier
	// BarrierDone releases barrier Seq of Group.
	BarrierDone
	// Heartbeat tells the scheduler that the sender is alive; a worker's
	// Seq is how many iterations it has pushed (the scheduler's stall check).
	Heartbeat
	// HeartbeatAck tells a node that the scheduler is alive.
	HeartbeatAck
	// NodeFailed says that node Target died or was lost; Text says why.
	// A node sends it to the scheduler when it loses a peer; the scheduler
	// sends it to every live node, which then exits non-zero.
	NodeFailed
	// Terminate, from the scheduler after the final barrier, shuts a node down.
	Terminate
	// Report and Decision carry the LB's measurements and decisions in Body.
	Report
	Decision
	// NodeLeft, from the scheduler, says that node Target is no longer a
	// member (Text says why): a server lost under
	// FPT_ON_SERVER_LOSS=retry, or a worker under
	// FPT_ON_WORKER_LOSS=continue. The job goes on without it; the LB's
	// retry decision follows.
	NodeLeft
	// NodeJoined, from the scheduler, announces a server that joins the
	// running job (Nodes[0]): members add it to their table and dial it.
	// Text is the host it named (FPT_HOST_ID; empty for none), for the
	// local groups.
	NodeJoined
	// Joined follows a server joining a running job. From the joining
	// server: Seq 0, it has its table (the members may dial it); Seq 1,
	// every member's connection reached it. From a member: Seq 2, its own
	// connection to the joining server Target is ready to send on. The
	// LB gives the joining server a share once all of these came.
	Joined
	// Layout, from the scheduler, announces a version of the classic key
	// ranges (package classic's encoding in Body): servers hand the keys
	// they no longer own to their new owners, workers send new requests
	// by it.
	Layout
	// Leave, from a server, asks to leave the running job in order
	// (Seq 0), then, once its classic keys are handed over and every
	// worker's requests to it answered, says it is ready to go (Seq 1).
	// The scheduler answers the first with a layout without the server,
	// the second with NodeLeft (FlagGraceful) to every member and to the
	// server itself.
	Leave
	// App carries an application message (package appmsg's encoding in
	// Body) to or from the scheduler's customers, which have no data
	// plane: from a member to the scheduler, Target the recipient (the
	// scheduler); from the scheduler to member Target. Seq is its
	// priority.
	App
	lastCommand = App
)

// Flags.
const (
	// FlagFinal marks the barrier that ends the cluster's life.
	FlagFinal uint8 = 1 << iota
	// FlagJoin marks a NodeTable sent to a server joining a running job:
	// it skips the start barriers, and Body holds, after the stamp, the
	// next barrier number of each group 1..7 (7 little-endian uint64s),
	// the classic layout and the workers' local groups
	// (localagg.AppendJoined).
	FlagJoin
	// FlagGraceful marks a NodeLeft for a server that left in order: every
	// frame it sent arrives before its connections end.
	FlagGraceful
)

// Message is one control message.
type Message struct {
	Command   Command
	Flags     uint8
	Sender    node.ID // 0 before the node table assigned ids
	Recipient node.ID // 0 when the recipient has no id yet
	Group     node.Group
	Seq       uint64
	Target    node.ID // NodeFailed, NodeLeft: the node that died or left
	Nodes     []node.Info
	Text      string
	Body      []byte

	// Origin names the connection the message arrived over, as the plane
	// authenticated it: the same string for every message over one
	// connection, different for different peers (a peer that reconnects
	// gets a new one). The plane sets it from the connection (ZeroMQ's
	// routing id; never from the payload, which does not carry it), so a
	// receiver checks Sender against it. Empty on messages being sent.
	Origin string
}
