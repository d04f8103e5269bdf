// Package server runs a server node of an fpt cluster. A server is an
// aggregator: for every partition it owns it sums the W workers'
// contributions of an iteration and sends the sum to every worker itself
// (FPT's push = push + aggregate + broadcast). It also keeps ps-lite's
// classic key-value store for Push, Pull and PushPull, with the semantics of
// ps-lite's KVServerDefaultHandle: a push adds into the stored value, a pull
// returns it. The store is kept in key order (kvstore) and, with
// FPT_CHECKPOINT_DIR, checkpointed to a file per server rank and loaded
// back when a server of that rank starts (checkpoint.go).
package server

import (
	"bytes"
	"context"
	"fmt"
	"sync"

	"github.com/fptps/fpt/cluster"
	"github.com/fptps/fpt/customer"
	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/kvstore"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/role"
	"github.com/fptps/fpt/van"
)

// Server is a running server node.
type Server struct {
	node   *cluster.Member
	base   *role.Base             // the aggregator and the LB agent
	onPush func(iteration uint64) // the agent's; nil without one

	mu    sync.Mutex // guards store and dirty (the netconn van calls in parallel)
	store *kvstore.Store
	dirty bool // changed since the last checkpoint

	loaded chan struct{} // closed once the store may serve (after a checkpoint's load)
	ckpt   *checkpointer // nil without FPT_CHECKPOINT_DIR
}

// Start joins the cluster as a server. With the LB on (config.LB), the
// server reports its measured rates to the scheduler and follows its
// directives.
//
// With FPT_CHECKPOINT_DIR, the server loads its rank's checkpoint once it
// knows its rank, before it answers any classic request, and refuses to
// start on a checkpoint it cannot read.
func Start(ctx context.Context, n *cluster.Member) (*Server, error) {
	s := New(n)
	cfg := n.Config()
	if cfg.CheckpointDir != "" {
		if err := checkDir(cfg.CheckpointDir); err != nil {
			return nil, err
		}
		// Classic requests wait for the load: the rank, and so the file,
		// is known only once the node has joined.
		s.loaded = make(chan struct{})
	}
	if err := s.base.Start(ctx, s); err != nil {
		return nil, err
	}
	if cfg.CheckpointDir != "" {
		path := checkpointPath(cfg.CheckpointDir, n.Self().ID.Rank())
		store, err := loadCheckpoint(path)
		if err != nil {
			s.base.Close()
			n.Fail(err) // the scheduler tells the others why
			n.Close()   // a request waiting for the load gives up
			return nil, err
		}
		if store.Len() > 0 {
			n.Logger().Info("checkpoint loaded", "file", path, "keys", store.Len())
		}
		s.store = store // before loaded is closed: no handler reads it yet
		s.ckpt = startCheckpointer(path, cfg.CheckpointEvery, s.snapshot, n.Logger())
		close(s.loaded)
	}
	return s, nil
}

// Finalize serves until the cluster terminates, then leaves it. With
// FPT_CHECKPOINT_DIR, a clean end writes a last checkpoint.
func (s *Server) Finalize(ctx context.Context) error {
	defer s.base.Close()
	err := s.node.Finalize(ctx)
	if s.ckpt != nil {
		if cerr := s.ckpt.stop(err == nil); err == nil {
			err = cerr
		}
	}
	return err
}

// snapshot encodes the store if it changed since the last call (or if
// forced: the last write failed); the file is written outside the lock, so
// pushes wait only for the encoding.
func (s *Server) snapshot(force bool) ([]byte, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.dirty && !force {
		return nil, false, nil
	}
	var b bytes.Buffer
	if _, err := s.store.Snapshot(&b); err != nil {
		return nil, false, err
	}
	s.dirty = false
	return b.Bytes(), true, nil
}

// New makes the server for n without starting it (Start does both): its
// aggregator and, with the LB on, its LB agent, which is installed on n
// but measures only once Start started the node.
func New(n *cluster.Member) *Server {
	s := &Server{node: n, base: role.New(n, nil, nil, nil), store: kvstore.New(), loaded: make(chan struct{})}
	close(s.loaded)
	if s.base.Agent != nil {
		s.onPush = s.base.Agent.ServerIterationBegan
	}
	return s
}

var _ van.Sink = (*Server)(nil)

// PayloadBuffer implements van.Sink: pushed partitions are read straight
// into the aggregator's buffers.
func (s *Server) PayloadBuffer(h *frame.Header) []byte {
	if h.Type != frame.Push {
		return nil
	}
	return s.base.Agg.PayloadBuffer(h)
}

// HandleFrame implements van.Handler.
func (s *Server) HandleFrame(h *frame.Header, payload []byte) {
	from := node.ID(h.Sender)
	if h.Type == frame.App {
		// Customers' messages come from servers and workers alike (the
		// van admits members only). A malformed one fails the node, as
		// any other malformed frame from a member does.
		if err := s.base.Customers.HandleFrame(h, payload); err != nil {
			s.node.Fail(fmt.Errorf("server: from %s: %s: %w", from, h, err))
		}
		return
	}
	if r, ok := from.Role(); !ok || r != node.Worker || !s.node.WasMember(from) {
		s.node.Fail(fmt.Errorf("server: %s frame from %s, which is not a worker of this cluster", h.Type, from))
		return
	}
	var err error
	switch h.Type {
	case frame.Push:
		if s.onPush != nil {
			s.onPush(h.Iteration)
		}
		err = s.base.Agg.HandlePush(h, payload)
	case frame.KVPush, frame.KVPushPull:
		if s.awaitLoad() {
			err = s.kvPush(h, payload)
		}
	case frame.KVPull:
		if s.awaitLoad() {
			err = s.kvPull(h)
		}
	default:
		err = fmt.Errorf("unexpected %s frame", h.Type)
	}
	if err != nil {
		s.node.Fail(fmt.Errorf("server: from %s: %s: %w", from, h, err))
	}
}

// PeerLost implements van.Handler; the cluster node handles it.
func (s *Server) PeerLost(node.ID, error) {}

// Customers is the server's customers (fpt.h's fpt_customer_add).
func (s *Server) Customers() *customer.Set { return s.base.Customers }

// awaitLoad waits until the store may serve; false: the node is closing
// (its start failed), and the request is dropped with it.
func (s *Server) awaitLoad() bool {
	select {
	case <-s.loaded:
		return true
	case <-s.node.Closed():
		return false
	}
}

func (s *Server) kvPush(h *frame.Header, payload []byte) error {
	// A classic value is at most FPT_MAX_FRAME_BYTES: checked before the
	// value is allocated (a Total of 2^62 used to panic the server).
	if limit := s.node.Config().MaxFrameBytes; h.Total > limit {
		return s.kvError(h, fmt.Errorf("a classic value of %d bytes exceeds FPT_MAX_FRAME_BYTES (%d)", h.Total, limit))
	}
	s.mu.Lock()
	part, err := s.store.Add(h.Key, h.DType, h.Offset, payload, h.Total)
	s.dirty = s.dirty || err == nil
	var reply *van.Message
	if err == nil && h.Type == frame.KVPushPull {
		// Answer with a copy: the stored value keeps changing under later pushes.
		reply = s.reply(h, frame.KVData, append([]byte(nil), part...))
	}
	s.mu.Unlock()
	if err != nil {
		return s.kvError(h, err)
	}
	if reply == nil {
		reply = s.reply(h, frame.KVAck, nil)
	}
	return s.node.Van().Forward(reply)
}

func (s *Server) kvPull(h *frame.Header) error {
	s.mu.Lock()
	v, ok := s.store.Get(h.Key)
	var data []byte
	var err error
	switch {
	case !ok:
		err = fmt.Errorf("key %d was never pushed", h.Key)
	case v.DType != h.DType || uint64(len(v.Data)) != h.Total:
		err = fmt.Errorf("key %d holds %d bytes of %s, the pull wants %d bytes of %s", h.Key, len(v.Data), v.DType, h.Total, h.DType)
	default:
		data = append([]byte(nil), v.Data...)
	}
	s.mu.Unlock()
	if err != nil {
		return s.kvError(h, err)
	}
	// Large values go back in partition-sized chunks, like pushes.
	for part, c := range frame.Chunks(uint64(len(data)), s.node.Config().PartitionBytes, h.DType.Size()) {
		r := s.reply(h, frame.KVData, data[c[0]:c[1]])
		r.Header.Offset, r.Header.Partition = c[0], part
		if err := s.node.Van().Forward(r); err != nil {
			return err
		}
	}
	return nil
}

// kvError answers a classic request with its failure: the worker's Wait
// returns it. The server itself carries on.
func (s *Server) kvError(h *frame.Header, err error) error {
	s.node.Logger().Warn("classic request refused", "from", node.ID(h.Sender), "key", h.Key, "err", err)
	r := s.reply(h, frame.KVError, []byte(err.Error()))
	r.Header.DType = 0
	return s.node.Van().Forward(r)
}

func (s *Server) reply(h *frame.Header, t frame.Type, payload []byte) *van.Message {
	return &van.Message{
		Header: frame.Header{
			Type: t, DType: h.DType,
			Sender: uint32(s.node.Self().ID), Recipient: h.Sender,
			Key: h.Key, Partition: h.Partition, Offset: h.Offset, Total: h.Total,
			Priority: h.Priority, Aux: h.Aux,
		},
		Payload: payload,
	}
}
