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
	"sync/atomic"

	"github.com/fptps/fpt/aggregator"
	"github.com/fptps/fpt/cluster"
	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/van"
)

// Server is a running server node.
type Server struct {
	node    *cluster.Node
	workers int

	mu      sync.Mutex // guards the fields below (the netconn van calls in parallel)
	table   *aggregator.Table
	store   map[uint64]*stored
	adopted map[adoptKey]bool // pushes being read straight into a table buffer
}

// adoptKey names one worker's contribution to one partition.
type adoptKey struct {
	part   aggregator.PartID
	worker uint32
}

type stored struct {
	dtype frame.DType
	data  []byte
}

// Run starts a server on n, serves until the cluster terminates, and
// returns the node's failure, if any.
func Run(ctx context.Context, n *cluster.Node) error {
	s := New(n)
	if err := n.Start(ctx, s); err != nil {
		return err
	}
	return n.Finalize(ctx)
}

// New makes the server's frame handler for n; pass it to n.Start.
func New(n *cluster.Node) *Server {
	w := n.Config().NumWorkers
	return &Server{node: n, workers: w, table: aggregator.NewTable(w), store: make(map[uint64]*stored),
		adopted: make(map[adoptKey]bool)}
}

// PayloadBuffer implements van.Sink: a pushed partition is read straight
// into a buffer of the aggregation table, which becomes the partition's sum
// when it is the first contribution (no copy) and is summed and recycled
// otherwise.
func (s *Server) PayloadBuffer(h *frame.Header) []byte {
	if h.Type != frame.Push {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.adopted[adoptKey{partID(h), h.Sender}] = true
	return s.table.Buffer(int(h.Length))
}

func partID(h *frame.Header) aggregator.PartID {
	return aggregator.PartID{Key: h.Key, Partition: h.Partition, Iteration: h.Iteration}
}

// HandleFrame implements van.Handler.
func (s *Server) HandleFrame(h *frame.Header, payload []byte) {
	from := node.ID(h.Sender)
	if r, ok := from.Role(); !ok || r != node.Worker || from.Rank() >= s.workers {
		s.node.Fail(fmt.Errorf("server: %s frame from %s, which is not a worker of this cluster", h.Type, from))
		return
	}
	var err error
	switch h.Type {
	case frame.Push:
		err = s.aggregate(h, payload)
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
func (s *Server) PeerLost(uint32, error) {}

func (s *Server) aggregate(h *frame.Header, payload []byte) error {
	s.mu.Lock()
	k := adoptKey{partID(h), h.Sender}
	adopt := s.adopted[k]
	delete(s.adopted, k)
	sum, err := s.table.Add(aggregator.Contribution{
		PartID: k.part,
		Adopt:  adopt,
		Worker: node.ID(h.Sender).Rank(),
		DType:  h.DType,
		Offset: h.Offset,
		Total:  h.Total,
		Init:   h.Flags&frame.FlagInit != 0,
		Data:   payload,
	})
	s.mu.Unlock()
	if err != nil || sum == nil {
		return err
	}
	// Every worker gets the same buffer; it returns to the table when the
	// last copy has left.
	remaining := int32(s.workers)
	release := func(error) {
		if atomic.AddInt32(&remaining, -1) == 0 {
			s.mu.Lock()
			s.table.Release(sum)
			s.mu.Unlock()
		}
	}
	self := uint32(s.node.Self().ID)
	msgs := make([]van.Message, s.workers) // live until their Done
	for rank := range msgs {
		msgs[rank] = van.Message{
			Header: frame.Header{
				Type: frame.Result, DType: sum.DType, Flags: h.Flags,
				Sender: self, Recipient: uint32(node.WorkerID(rank)),
				Key: sum.Key, Partition: sum.Partition, Iteration: sum.Iteration,
				Offset: sum.Offset, Total: sum.Total, Priority: h.Priority, Aux: h.Aux,
			},
			Payload: sum.Data,
			Done:    release,
		}
		if err := s.node.Van().Forward(&msgs[rank]); err != nil {
			// Neither this frame nor the ones after it will call Done.
			for range s.workers - rank {
				release(err)
			}
			return fmt.Errorf("broadcast to worker %d: %w", rank, err)
		}
	}
	return nil
}

func (s *Server) kvPush(h *frame.Header, payload []byte) error {
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
		err = aggregator.Add(h.DType, v.data[h.Offset:h.Offset+h.Length], payload)
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
