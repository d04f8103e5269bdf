package capi

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/fptps/fpt/appmsg"
	"github.com/fptps/fpt/customer"
	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/node"
)

// This file is fpt.h's "Nodes and groups" and "Messages between
// customers" (API version 2): what include/ps builds ps-lite's KVWorker,
// KVServer, SimpleApp and Postoffice on.

// MsgHandler is a customer's handler (fpt_msg_handler): m and its
// segments are the handler's for the call; err, not nil, is the node's
// failure (m.Meta.Flags has appmsg.Failed, and no segments), and the last
// call.
type MsgHandler func(m *appmsg.Message, err error)

// MaxSegments is fpt.h's FPT_MSG_MAX_SEGMENTS.
const MaxSegments = appmsg.MaxSegments

// started returns the running node's state for a query op (running or
// finalizing, as Rank), or why not.
func (l *Lib) started(op string) error {
	if l.state != running && l.state != finalizing {
		return l.stateErr(op)
	}
	return nil
}

// MyID is this node's id in ps-lite's numbering (the scheduler is 1).
func (l *Lib) MyID() (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.started("fpt_my_id"); err != nil {
		return 0, err
	}
	if m := l.node.Member(); m != nil {
		return int(m.Self().ID), nil
	}
	return int(node.SchedulerID), nil
}

// GroupIDs is the ids of the nodes in a group (1, 2, 4 or their union)
// or, for an id of 8 or more, that node alone, ascending. The cluster's
// counts (DMLC_NUM_SERVER, DMLC_NUM_WORKER) bound the ids, and the node
// table says which of them are nodes, so the scheduler answers as the
// others do: a worker process of several customers (StartCustomer) is one
// node, one id, though each of its customers counts in DMLC_NUM_WORKER.
func (l *Lib) GroupIDs(groupOrID int) ([]int, error) {
	const op = "fpt_group_ids"
	l.mu.Lock()
	if err := l.started(op); err != nil {
		l.mu.Unlock()
		return nil, err
	}
	cfg, n := l.cfg, l.node
	l.mu.Unlock()
	isNode := func(id node.ID) bool {
		if m := n.Member(); m != nil {
			_, ok := m.Info(id)
			return ok
		}
		set := n.Customers() // the scheduler's, over its table
		if set == nil {
			return true
		}
		_, ok := set.Info(id)
		return ok
	}
	return groupIDs(op, groupOrID, cfg.NumServers, cfg.NumWorkers, isNode)
}

// groupIDs is GroupIDs for a cluster of the given size whose node table
// holds the ids isNode says.
func groupIDs(op string, groupOrID, servers, workers int, isNode func(node.ID) bool) ([]int, error) {
	switch {
	case groupOrID <= 0 || (groupOrID > int(node.AllGroup) && groupOrID < 8):
		return nil, fail(CodeArg, op, "%d is no group (1, 2, 4 or a union of them) and no node id (8 or more)", groupOrID)
	case groupOrID >= 8:
		id := node.ID(groupOrID)
		if groupOrID > math.MaxUint32 || !known(id, servers, workers) || !isNode(id) {
			return nil, fail(CodeArg, op, "%d is no node of this cluster (%d servers, %d workers)", groupOrID, servers, workers)
		}
		return []int{groupOrID}, nil
	}
	g := node.Group(groupOrID)
	var ids []int
	if g&node.SchedulerGroup != 0 {
		ids = append(ids, int(node.SchedulerID))
	}
	if g&node.ServerGroup != 0 {
		for r := range servers {
			if id := node.ServerID(r); isNode(id) {
				ids = append(ids, int(id))
			}
		}
	}
	if g&node.WorkerGroup != 0 {
		for r := range workers {
			if id := node.WorkerID(r); isNode(id) {
				ids = append(ids, int(id))
			}
		}
	}
	slices.Sort(ids)
	return ids, nil
}

// known reports whether id is a server or worker of the cluster.
func known(id node.ID, servers, workers int) bool {
	r, ok := id.Role()
	switch {
	case !ok:
		return false
	case r == node.Server:
		return id.Rank() < servers
	case r == node.Worker:
		return id.Rank() < workers
	}
	return false
}

// BarrierGroup is ps::Postoffice::Barrier over the servers and workers of
// group (the scheduler's bit is ignored; the scheduler's own call returns
// at once).
func (l *Lib) BarrierGroup(group int) error {
	const op = "fpt_barrier_group"
	l.mu.Lock()
	if l.state != running {
		err := l.stateErr(op)
		l.mu.Unlock()
		return err
	}
	m := l.node.Member()
	l.mu.Unlock()
	if group <= 0 || group > int(node.AllGroup) {
		return fail(CodeArg, op, "%d is no group (1, 2, 4 or a union of them)", group)
	}
	if m == nil {
		return nil // the scheduler takes part in no barrier
	}
	g := node.Group(group) &^ node.SchedulerGroup
	if g == 0 {
		return nil // the scheduler alone: nobody to wait for
	}
	self := m.Self().ID
	if !self.InGroup(g) {
		return fail(CodeArg, op, "this node (%s) is not in group %d", self, group)
	}
	if err := m.Barrier(context.Background(), g); err != nil {
		return &Error{Code: CodeCluster, Err: fmt.Errorf("capi: %s: %w", op, err)}
	}
	return nil
}

// customers returns the node's customer set, or
// why op cannot run now.
func (l *Lib) customers(op string) (*customer.Set, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != running {
		return nil, l.stateErr(op)
	}
	return l.node.Customers(), nil
}

// customer checks a customer's ids and finds the node's customers, as
// customers does.
func (l *Lib) customer(op string, app, cust int) (*customer.Set, customer.Key, error) {
	if app < math.MinInt32 || app > math.MaxInt32 || cust < math.MinInt32 || cust > math.MaxInt32 {
		return nil, customer.Key{}, fail(CodeArg, op, "app %d, customer %d out of range", app, cust)
	}
	set, err := l.customers(op)
	return set, customer.Key{App: int32(app), Customer: int32(cust)}, err
}

// SetAllocator makes a the allocator of the buffers the node reads
// customer messages into (customer.Allocator): libfpt's C memory, which a
// customer added with CustomerAddKeep keeps without a copy. Before Start.
func (l *Lib) SetAllocator(a customer.Allocator) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.alloc = a
}

// ReleaseBlock gives back the block of a message a keeping handler kept
// (fpt_msg_release): to the allocator, by its address (b[0]'s).
func (l *Lib) ReleaseBlock(b []byte) {
	l.mu.Lock()
	a := l.alloc
	l.mu.Unlock()
	if a != nil {
		a.Free(b)
	}
}

// CustomerAdd registers h as customer (app, cust). On the scheduler its
// messages travel over the control plane. A message's Buffer (the
// allocator's) is freed when h returns.
func (l *Lib) CustomerAdd(app, cust int, h MsgHandler) error {
	return l.customerAdd("fpt_customer_add", app, cust, h, false)
}

// CustomerAddKeep is CustomerAdd for a handler that keeps the messages it
// gets: one with a Buffer is h's, to free with the allocator
// (fpt_msg_release); one without is valid during the call only.
func (l *Lib) CustomerAddKeep(app, cust int, h MsgHandler) error {
	return l.customerAdd("fpt_customer_add_keep", app, cust, h, true)
}

func (l *Lib) customerAdd(op string, app, cust int, h MsgHandler, keep bool) error {
	if h == nil {
		return fail(CodeArg, op, "handler is NULL")
	}
	set, k, err := l.customer(op, app, cust)
	if err != nil {
		return err
	}
	l.mu.Lock()
	alloc := l.alloc
	l.mu.Unlock()
	if alloc != nil {
		set.UseAllocator(alloc)
	}
	handler := func(m *appmsg.Message, err error) {
		if err != nil {
			err = &Error{Code: CodeCluster, Err: fmt.Errorf("capi: customer (%d, %d): %w", app, cust, err)}
		}
		h(m, err)
		if !keep && m.Buffer != nil && alloc != nil {
			alloc.Free(m.Buffer)
		}
	}
	if err := set.Add(k, handler); err != nil {
		return custErr(op, err)
	}
	return nil
}

// CustomerRemove removes customer (app, cust): when it returns, its
// handler is not running and will not run again. Not from its own handler.
func (l *Lib) CustomerRemove(app, cust int) error {
	const op = "fpt_customer_remove"
	set, k, err := l.customer(op, app, cust)
	if err != nil {
		return err
	}
	if err := set.Remove(k); err != nil {
		return custErr(op, err)
	}
	return nil
}

// Msg is fpt_msg_meta as C gives it, before its fields are checked.
type Msg struct {
	App, Customer, Timestamp, Head int32
	Recipient                      int32
	Flags                          uint32
	DType                          int32
	Priority                       int32
}

// MsgSend sends m with segs to m.Recipient, a server or worker of the
// cluster (this node too); segs are free again when it returns
// (customer.Set.Send).
func (l *Lib) MsgSend(m Msg, segs [][]byte) error {
	const op = "fpt_msg_send"
	set, err := l.customers(op)
	if err != nil {
		return err
	}
	switch {
	case len(segs) > MaxSegments:
		return fail(CodeArg, op, "%d segments (at most FPT_MSG_MAX_SEGMENTS, %d)", len(segs), MaxSegments)
	case m.DType < 0 || m.DType > math.MaxUint8 || (m.DType != 0 && frame.DType(m.DType).Size() == 0):
		return fail(CodeArg, op, "dtype %d (0 or FPT_FLOAT32, FPT_FLOAT64, FPT_FLOAT16, FPT_BFLOAT16)", m.DType)
	case m.Recipient < 8 && m.Recipient != int32(node.SchedulerID):
		return fail(CodeArg, op, "recipient %d is not a node (a group, or no node)", m.Recipient)
	}
	meta := appmsg.Meta{App: m.App, Customer: m.Customer, Timestamp: m.Timestamp, Head: m.Head,
		Recipient: uint32(m.Recipient), Flags: m.Flags, DType: frame.DType(m.DType), Priority: m.Priority}
	if err := set.Send(&meta, segs); err != nil {
		return custErr(op, err)
	}
	return nil
}

// custErr gives a customer set's error its code.
func custErr(op string, err error) error {
	code := CodeCluster // a send the van could not take: the node is going
	switch {
	case errors.Is(err, customer.ErrExists), errors.Is(err, customer.ErrUnknown),
		errors.Is(err, customer.ErrRecipient), errors.Is(err, appmsg.ErrInvalid):
		code = CodeArg
	case errors.Is(err, customer.ErrClosed):
		code = CodeState
	}
	return &Error{Code: code, Err: fmt.Errorf("capi: %s: %w", op, err)}
}

// StartCustomer is ps-lite's Start(customer_id) of one of a process's
// customer threads. The first call starts the node (Start) as that
// customer. On a worker, each further customer that calls it while the
// cluster assembles registers beside the node and counts as one of
// DMLC_NUM_WORKER workers (cluster.Customers); it returns once the
// cluster has started. On a server or the scheduler a further call only
// waits for the start.
func (l *Lib) StartCustomer(id int) error {
	const op = "fpt_start_customer"
	if id < 0 {
		return fail(CodeArg, op, "customer id %d is negative", id)
	}
	l.mu.Lock()
	switch l.state {
	case idle:
		l.mu.Unlock()
		return l.start(op, id)
	case starting, running:
	default:
		err := l.stateErr(op)
		l.mu.Unlock()
		return err
	}
	if id == l.first {
		l.mu.Unlock()
		return fail(CodeState, op, "customer %d started twice", id)
	}
	extra, done := l.extra, l.startDone
	l.mu.Unlock()
	if extra != nil {
		if err := extra.Add(id); err != nil {
			return &Error{Code: CodeState, Err: fmt.Errorf("capi: %s: %w", op, err)}
		}
	}
	<-done
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state == broken {
		return &Error{Code: CodeState, Err: fmt.Errorf("capi: %s: the node's start failed: %w", op, l.startErr)}
	}
	return nil
}
