// Package server runs a server node of an fpt cluster. A server is an
// aggregator: for every partition it owns it sums the W workers'
// contributions of an iteration and sends the sum to every worker itself
// (FPT's push = push + aggregate + broadcast). It also keeps ps-lite's
// classic key-value store for Push, Pull and PushPull, with the semantics of
// ps-lite's KVServerDefaultHandle: a push adds into the stored value, a pull
// returns it.
package server

import (
	"context"
	"fmt"
	"sync"

	"github.com/fptps/fpt/cluster"
	"github.com/fptps/fpt/customer"
	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/reduce"
	"github.com/fptps/fpt/role"
	"github.com/fptps/fpt/van"
)

// Server is a running server node.
type Server struct {
	node    *cluster.Member
	workers int
	base    *role.Base             // the aggregator and the LB agent
	onPush  func(iteration uint64) // the agent's; nil without one

	mu    sync.Mutex // guards store (the netconn van calls in parallel)
	store map[uint64]*stored
}

type stored struct {
	dtype frame.DType
	data  []byte
}

// Start joins the cluster as a server. With the LB on (config.LB), the
// server reports its measured rates to the scheduler and follows its
// directives.
func Start(ctx context.Context, n *cluster.Member) (*Server, error) {
	s := New(n)
	if err := s.base.Start(ctx, s); err != nil {
		return nil, err
	}
	return s, nil
}

// Finalize serves until the cluster terminates, then leaves it.
func (s *Server) Finalize(ctx context.Context) error {
	defer s.base.Close()
	return s.node.Finalize(ctx)
}

// New makes the server for n without starting it (Start does both): its
// aggregator and, with the LB on, its LB agent, which is installed on n
// but measures only once Start started the node.
func New(n *cluster.Member) *Server {
	s := &Server{node: n, workers: n.Config().NumWorkers, base: role.New(n, nil, nil), store: make(map[uint64]*stored)}
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
	if r, ok := from.Role(); !ok || r != node.Worker || from.Rank() >= s.workers {
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
		err = s.kvPush(h, payload)
	case frame.KVPull:
		err = s.kvPull(h)
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

func (s *Server) kvPush(h *frame.Header, payload []byte) error {
	// A classic value is at most FPT_MAX_FRAME_BYTES: checked before the
	// value is allocated (a Total of 2^62 used to panic the server).
	if limit := s.node.Config().MaxFrameBytes; h.Total > limit {
		return s.kvError(h, fmt.Errorf("a classic value of %d bytes exceeds FPT_MAX_FRAME_BYTES (%d)", h.Total, limit))
	}
	s.mu.Lock()
	v := s.store[h.Key]
	if v == nil {
		v = &stored{dtype: h.DType, data: make([]byte, h.Total)}
		s.store[h.Key] = v
	}
	var err error
	switch {
	case v.dtype != h.DType || uint64(len(v.data)) != h.Total:
		err = fmt.Errorf("key %d holds %d bytes of %s, the push has %d bytes of %s", h.Key, len(v.data), v.dtype, h.Total, h.DType)
	default:
		err = reduce.Add(h.DType, v.data[h.Offset:h.Offset+h.Length], payload)
	}
	var reply *van.Message
	if err == nil && h.Type == frame.KVPushPull {
		// Answer with a copy: the stored value keeps changing under later pushes.
		data := append([]byte(nil), v.data[h.Offset:h.Offset+h.Length]...)
		reply = s.reply(h, frame.KVData, data)
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
	v := s.store[h.Key]
	var data []byte
	var err error
	switch {
	case v == nil:
		err = fmt.Errorf("key %d was never pushed", h.Key)
	case v.dtype != h.DType || uint64(len(v.data)) != h.Total:
		err = fmt.Errorf("key %d holds %d bytes of %s, the pull wants %d bytes of %s", h.Key, len(v.data), v.dtype, h.Total, h.DType)
	default:
		data = append([]byte(nil), v.data...)
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
