// Package server runs a server node of an fpt cluster. A server is an
// aggregator: for every partition it owns it sums the W workers'
// contributions of an iteration and sends the sum to every worker itself
// (FPT's push = push + aggregate + broadcast). It also keeps ps-lite's
// classic key-value store for Push, Pull and PushPull, with the semantics of
// ps-lite's KVServerDefaultHandle: a push adds into the stored value, a pull
// returns it. The store is kept in key order (kvstore) and, with
// FPT_CHECKPOINT_DIR, checkpointed in sets of files, one per server of a
// classic layout; a restarted job's servers each load their keys from the
// newest complete set, whatever the servers were then (checkpoint.go).
package server

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"sync"

	"github.com/fptps/fpt/classic"
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

	mu     sync.Mutex // guards store, ranges, dirty and the leave's counts (the netconn van calls in parallel)
	store  *kvstore.Store
	ranges *classic.Ranges // made at the first use, once the node table is there (rangesLocked)
	dirty  bool            // changed since the last checkpoint
	ckptAt ckptLabel       // the label of the last checkpoint

	// What a leave (Leave) waits for: the classic requests each worker
	// sent that were served, redirected or held (a held one is served by
	// the carryOut that releases it), what each worker's KVDrained said,
	// the hand-overs not yet carried out (carryOut) and their frames not
	// yet written (unsent). outAt is the version of the layout that left
	// this server out after one that had it (0: none did); wasIn says
	// whether the last layout applied had it. wake is signalled when one of
	// them changes.
	handled  map[node.ID]uint64
	drained  map[node.ID]drainedAt
	carrying int
	unsent   int
	outAt    uint32
	wasIn    bool
	wake     chan struct{}
	// leftInOrder are the other servers that left in order: their keys
	// are on their way, unless their connection breaks first; broken are
	// the servers whose connection broke before the scheduler's word of
	// them (PeerLost).
	leftInOrder map[node.ID]bool
	broken      map[node.ID]bool

	loaded   chan struct{} // closed once the store may serve (after a checkpoint's load)
	ckpt     *checkpointer // nil without FPT_CHECKPOINT_DIR
	stopOnce sync.Once
}

// Start joins the cluster as a server. With the LB on (config.LB), the
// server reports its measured rates to the scheduler and follows its
// directives.
//
// With FPT_CHECKPOINT_DIR, the server loads its keys of the job's first
// layout from the newest complete set of checkpoints once it has the node
// table, before the job starts, and refuses to start on a checkpoint it
// cannot read.
func Start(ctx context.Context, n *cluster.Member) (*Server, error) {
	s := New(n)
	cfg := n.Config()
	if cfg.CheckpointDir != "" {
		if err := checkDir(cfg.CheckpointDir); err != nil {
			return nil, err
		}
		s.loaded = make(chan struct{})
		// Before the start barriers: under FPT_ON_SERVER_LOSS=retry a
		// failure after them would be a loss the job survives, and the
		// others' checkpoints would then replace the set not loaded.
		n.OnTable(s.load)
	}
	if err := s.base.Start(ctx, s); err != nil {
		return nil, err
	}
	if cfg.CheckpointDir != "" {
		s.ckpt = startCheckpointer(cfg.CheckpointDir, cfg.CheckpointEvery, s.snapshot, n.Logger())
	}
	return s, nil
}

// load loads the store from FPT_CHECKPOINT_DIR's newest
// complete set once the node table is there (the node's OnTable): the
// job's first layout, and so the keys of this server, are known only
// then. A joining server loads nothing: its keys come from the servers
// that had them (classic.Ranges).
func (s *Server) load(ctx context.Context) error {
	n := s.node
	if !n.Joined() {
		dir := n.Config().CheckpointDir
		n.Logger().Info("loading the newest complete set of checkpoints", "dir", dir)
		store, set, err := loadCheckpoint(ctx, dir, n.Self().ID, n.TableLayout(), n.JobStamp())
		if err != nil {
			return err
		}
		if len(set.files) > 0 {
			n.Logger().Info("checkpoint loaded", "dir", dir, "set", set.ckptLabel, "servers", len(set.files), "keys", store.Len(), "passed_over", set.passed)
		}
		s.mu.Lock()
		s.store = store // before loaded is closed: no handler uses the store yet
		s.mu.Unlock()
	}
	close(s.loaded)
	return nil
}

// Finalize serves until the cluster terminates, then leaves it. With
// FPT_CHECKPOINT_DIR, a clean end writes a last checkpoint.
//
// Under FPT_ON_SERVER_LOSS=retry, a server whose ctx ends (launch's
// SIGTERM) leaves the running job in order instead (Leave), and Finalize
// returns Leave's outcome: nil once it left.
func (s *Server) Finalize(ctx context.Context) error {
	if s.node.Config().RetryServerLoss {
		fin := make(chan error, 1)
		go func() { fin <- s.finalize(context.WithoutCancel(ctx)) }()
		select {
		case err := <-fin:
			return err
		case <-ctx.Done():
		}
		select {
		case err := <-fin: // the job ended as the signal came
			return err
		default:
		}
		// Past FPT_LEAVE_TIMEOUT the node fails, and the job goes on as
		// after a loss.
		lctx, cancel := context.WithTimeout(context.Background(), s.node.Config().LeaveTimeout)
		defer cancel()
		err := s.Leave(lctx)
		<-fin // the final barrier ends with the node's close
		return err
	}
	return s.finalize(ctx)
}

func (s *Server) finalize(ctx context.Context) error {
	err := s.node.Finalize(ctx)
	if cerr := s.stop(err == nil); err == nil {
		err = cerr
	}
	return err
}

// stop stops the agent and the customers and, with FPT_CHECKPOINT_DIR,
// the checkpoints, writing a last one after a clean end (clean). Only its
// first call does anything: a leave and the final barrier it interrupts
// both end here.
func (s *Server) stop(clean bool) error {
	var err error
	s.stopOnce.Do(func() {
		s.base.Close()
		if s.ckpt == nil {
			return
		}
		if clean {
			s.mu.Lock()
			r := s.rangesLocked()
			l := r.Layout()
			unsettled := l.Index(s.node.Self().ID) >= 0 && !r.Stable()
			s.mu.Unlock()
			if unsettled {
				s.node.Logger().Warn("no last checkpoint: the classic key layout is still changing here; the newest complete set stays the last one", "layout", l)
			}
		}
		err = s.ckpt.stop(clean)
	})
	return err
}

// snapshot encodes the store, and names its file, if it changed since the
// last call, its layout did, or force (the last write failed). It does
// not while the store is not exactly this server's part of a layout (a
// change settles, or this server is out of it): the file would not be a
// whole part of a set. The file is written outside the lock, so pushes
// wait only for the encoding.
func (s *Server) snapshot(force bool) (string, []byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	self := s.node.Self().ID
	r := s.rangesLocked()
	l := r.Layout()
	label := ckptLabel{stamp: s.node.JobStamp(), version: l.Version}
	if !r.Stable() || l.Index(self) < 0 || !s.dirty && !force && label == s.ckptAt {
		return "", nil, nil
	}
	var b bytes.Buffer
	if _, err := s.store.Snapshot(&b, ckptMeta(label, self, l)); err != nil {
		return "", nil, err
	}
	s.dirty, s.ckptAt = false, label
	return ckptName(label, self), b.Bytes(), nil
}

// New makes the server for n without starting it (Start does both): its
// aggregator and, with the LB on, its LB agent, which is installed on n
// but measures only once Start started the node.
func New(n *cluster.Member) *Server {
	s := &Server{node: n, store: kvstore.New(), loaded: make(chan struct{}),
		handled: make(map[node.ID]uint64), drained: make(map[node.ID]drainedAt), wake: make(chan struct{}, 1),
		leftInOrder: make(map[node.ID]bool), broken: make(map[node.ID]bool)}
	s.base = role.New(n, nil, nil, s.left)
	n.OnLayout(s.newLayout)
	close(s.loaded)
	if s.base.Agent != nil {
		s.onPush = s.base.Agent.ServerIterationBegan
	}
	return s
}

var _ van.Sink = (*Server)(nil)

// PayloadBuffer implements van.Sink: pushed partitions are read straight
// into the aggregator's buffers, customers' messages into their own.
func (s *Server) PayloadBuffer(h *frame.Header) []byte {
	switch h.Type {
	case frame.Push:
		return s.base.Agg.PayloadBuffer(h)
	case frame.App:
		return s.base.Customers.PayloadBuffer(h)
	}
	return nil
}

// HandleFrame implements van.Handler.
func (s *Server) HandleFrame(h *frame.Header, payload []byte, inPlace bool) {
	from := node.ID(h.Sender)
	if h.Type == frame.App {
		// Customers' messages come from servers and workers alike (the
		// van admits members only). A malformed one fails the node, as
		// any other malformed frame from a member does.
		if err := s.base.Customers.HandleFrame(h, payload, inPlace); err != nil {
			s.node.Fail(fmt.Errorf("server: from %s: %s: %w", from, h, err))
		}
		return
	}
	want := node.Worker
	if h.Type == frame.KVMove || h.Type == frame.KVMoveEnd {
		want = node.Server
	}
	if r, ok := from.Role(); !ok || r != want || !s.node.WasMember(from) {
		s.node.Fail(fmt.Errorf("server: %s frame from %s, which is not a %s of this cluster", h.Type, from, want))
		return
	}
	var err error
	switch h.Type {
	case frame.Push:
		err = handlePush(s.base.Agg, s.onPush, h, payload, inPlace)
	case frame.KVPush, frame.KVPushPull, frame.KVPull, frame.KVPullRange:
		if s.awaitLoad() {
			err = s.classicRequest(h, payload)
		}
		s.mu.Lock()
		s.handled[from]++
		s.mu.Unlock()
		s.wakeLeave()
	case frame.KVDrained:
		s.mu.Lock()
		if d := s.drained[from]; uint32(h.Iteration) >= d.version {
			s.drained[from] = drainedAt{requests: h.Total, version: uint32(h.Iteration)}
		}
		s.mu.Unlock()
		s.wakeLeave()
	case frame.KVMove, frame.KVMoveEnd:
		err = s.moved(h, payload)
	default:
		err = fmt.Errorf("unexpected %s frame", h.Type)
	}
	if err != nil {
		s.node.Fail(fmt.Errorf("server: from %s: %s: %w", from, h, err))
	}
}

// pushHandler is the aggregator's part of a push.
type pushHandler interface {
	HandlePush(h *frame.Header, payload []byte, inPlace bool) error
}

// handlePush hands a pushed partition to agg, then tells the LB agent
// (report, nil without one) that its iteration began. The report comes
// after: the aggregator may answer the push at once, and building and
// sending a report must not delay that. The agent's rates come from its
// own periodic reads of the van's counters, so the order does not change
// what it reports.
func handlePush(agg pushHandler, report func(iteration uint64), h *frame.Header, payload []byte, inPlace bool) error {
	err := agg.HandlePush(h, payload, inPlace)
	if report != nil {
		report(h.Iteration)
	}
	return err
}

// drainedAt is what a worker's KVDrained said: how many classic
// requests it sent this server, as of layout version.
type drainedAt struct {
	requests uint64
	version  uint32
}

// PeerLost implements van.Handler; the cluster node handles the loss. A
// server that left in order, or leaves now (its NodeLeft may come after
// this), and whose connection broke all the same may not have handed all
// its keys over (lostWhileHandingOver).
func (s *Server) PeerLost(id node.ID, _ error) {
	if r, _ := id.Role(); r != node.Server {
		return
	}
	s.mu.Lock()
	inOrder := s.leftInOrder[id]
	delete(s.leftInOrder, id)
	if !inOrder {
		s.broken[id] = true
	}
	s.mu.Unlock()
	if inOrder {
		s.lostWhileHandingOver(id)
	}
}

// lostWhileHandingOver takes the loss of server id, which left in order but
// whose connection broke before its Bye. If keys it was handing over
// had not all come, they are lost, silently for the workers (they heard
// that it left in order): this server fails instead, naming it, and the
// job goes on as after a loss of its own.
func (s *Server) lostWhileHandingOver(id node.ID) {
	if !s.awaitLoad() {
		return
	}
	s.mu.Lock()
	r := s.rangesLocked()
	missing := r.Awaits(id)
	t := r.Lost(s.store, id)
	s.changedLocked(t)
	s.mu.Unlock()
	if missing || t.Dropped > 0 {
		s.node.Fail(fmt.Errorf("server: %s left the job in order, but its connection broke before all the classic keys it handed over here came: they are lost", id))
	}
	go s.carryOut(t)
}

// wakeLeave wakes a leave waiting for its requests and hand-overs.
func (s *Server) wakeLeave() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Leave leaves the running job in order (FPT_ON_SERVER_LOSS=retry): the
// scheduler takes this server out of the LB's decisions (its incomplete
// iterations are pushed again to the others) and out of the classic key
// layout, so that it hands every classic key over to the servers that own
// it now; once those frames are written, every worker has said that it
// sends nothing more here and every request it sent was answered, the
// server leaves the job and closes. With FPT_CHECKPOINT_DIR, its
// checkpoints stop when the leave begins: its last file holds its keys
// until the others' set of the layout without it is complete. Launch
// calls it when a server is interrupted (SIGTERM, SIGINT).
func (s *Server) Leave(ctx context.Context) error {
	s.node.Logger().Info("leaving the job: handing the classic keys over")
	if s.ckpt != nil {
		s.ckpt.halt()
	}
	err := s.node.Leave(ctx, s.awaitDrained)
	if err != nil {
		err = fmt.Errorf("server: leaving the job: %w", err)
		s.node.Fail(err)
	}
	if cerr := s.stop(err == nil); err == nil {
		err = cerr
	}
	s.node.Close() // drains: the keys and the last answers go out before Bye
	return err
}

// awaitDrained waits until this server may go (drainedLocked): its keys
// are handed over (their frames written) and every worker of the job
// said, with KVDrained, how many classic requests it sent here, all of
// which were answered.
func (s *Server) awaitDrained(ctx context.Context) error {
	for {
		s.mu.Lock()
		done := s.drainedLocked()
		s.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-s.wake:
		case <-s.node.Done():
			return s.node.Err()
		case <-ctx.Done():
			return fmt.Errorf("handing the classic keys over: %w", ctx.Err())
		}
	}
}

// drainedLocked: a layout left this server out (outAt), its hand-overs
// are carried out and written, and each worker of the table said, as of
// that layout or a later one, how many classic requests it sent here, all
// of which are handled. s.mu is held.
func (s *Server) drainedLocked() bool {
	r := s.rangesLocked()
	if s.outAt == 0 || r.Layout().Index(s.node.Self().ID) >= 0 || r.Settling() || s.carrying > 0 || s.unsent > 0 {
		return false
	}
	for _, w := range s.node.Workers() {
		if d, ok := s.drained[w]; !ok || d.version < s.outAt || s.handled[w] != d.requests {
			return false
		}
	}
	return true
}

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

// classicRequest serves, holds or redirects a classic request, as the
// key ranges say (classic.Ranges.Route), under one hold of the lock: a
// layout applied in between would take the key out of the store.
func (s *Server) classicRequest(h *frame.Header, payload []byte) error {
	switch {
	case h.Type == frame.KVPullRange && h.DType.Size() == 0:
		return s.kvError(h, fmt.Errorf("a range pull of unknown dtype %d", h.DType))
	case h.Type != frame.KVPullRange && h.Total > s.node.Config().MaxFrameBytes:
		// A classic value is at most FPT_MAX_FRAME_BYTES: checked before
		// the value is allocated (a Total of 2^62 used to panic the server).
		return s.kvError(h, fmt.Errorf("a classic value of %d bytes exceeds FPT_MAX_FRAME_BYTES (%d)", h.Total, s.node.Config().MaxFrameBytes))
	}
	s.mu.Lock()
	r := s.rangesLocked()
	verdict, owner := r.Route(h)
	switch verdict {
	case classic.Hold:
		r.Hold(h, payload)
		s.mu.Unlock()
		return nil
	case classic.Moved:
		version := r.Layout().Version
		s.mu.Unlock()
		return s.redirect(h, owner, version)
	}
	switch h.Type {
	case frame.KVPull:
		return s.kvPull(h)
	case frame.KVPullRange:
		return s.rangePull(r, h)
	}
	return s.kvPush(h, payload)
}

// kvPush adds a classic push into the store; s.mu is held, and released.
func (s *Server) kvPush(h *frame.Header, payload []byte) error {
	part, err := s.store.Add(h.Key, h.DType, h.Offset, payload, h.Total)
	s.dirty = s.dirty || err == nil
	var reply *frame.Message
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

// kvPull answers a classic pull; s.mu is held, and released.
func (s *Server) kvPull(h *frame.Header) error {
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

// rangePull answers a range pull routed here with every key of the range
// this server owns, in key order; s.mu is held, and released. The values
// are copied into one buffer under the lock (later pushes change them).
func (s *Server) rangePull(r *classic.Ranges, h *frame.Header) error {
	type kv struct {
		key    uint64
		off, n int // in buf
	}
	var found []kv
	var buf []byte
	var err error
	if lo, hi, ok := r.Span(h.Key, h.Total); ok {
		s.store.Ascend(lo, hi, func(key uint64, v kvstore.Value) bool {
			if v.DType != h.DType {
				err = fmt.Errorf("key %d holds %s, the range pull wants %s", key, v.DType, h.DType)
				return false
			}
			found = append(found, kv{key, len(buf), len(v.Data)})
			buf = append(buf, v.Data...)
			return true
		})
	}
	s.mu.Unlock()
	if err != nil {
		return s.kvError(h, err)
	}
	var frames uint64
	for _, f := range found {
		data := buf[f.off : f.off+f.n]
		for part, c := range frame.Chunks(uint64(f.n), s.node.Config().PartitionBytes, h.DType.Size()) {
			m := s.reply(h, frame.KVData, data[c[0]:c[1]])
			m.Header.Key, m.Header.Total, m.Header.Offset, m.Header.Partition = f.key, uint64(f.n), c[0], part
			m.Header.Iteration = h.Iteration
			if err := s.node.Van().Forward(m); err != nil {
				return err
			}
			frames++
		}
	}
	end := s.reply(h, frame.KVRangeEnd, nil)
	end.Header.DType, end.Header.Key, end.Header.Total, end.Header.Iteration = 0, 0, frames, h.Iteration
	return s.node.Van().Forward(end)
}

// redirect answers a classic request sent under an older layout than this
// server's (version): the key's owner there (none for a range pull) is
// where the worker sends it again.
func (s *Server) redirect(h *frame.Header, owner node.ID, version uint32) error {
	m := s.reply(h, frame.KVMoved, binary.LittleEndian.AppendUint32(nil, uint32(owner)))
	m.Header.DType, m.Header.Iteration = 0, uint64(version)
	return s.node.Van().Forward(m)
}

// rangesLocked is the server's classic key ranges, made at the first use
// from the layout the node table came with (a joining server's does not
// name it: its keys come with the next one). s.mu is held.
func (s *Server) rangesLocked() *classic.Ranges {
	if s.ranges == nil {
		l := s.node.TableLayout()
		s.ranges = classic.NewRanges(s.node.Self().ID, l, s.node.Config().PartitionBytes)
		s.wasIn = l.Index(s.node.Self().ID) >= 0
	}
	return s.ranges
}

// newLayout applies a new layout of the classic key ranges (the
// cluster node's OnLayout): the keys that are no longer this server's
// are taken out of the store and sent to their owners.
func (s *Server) newLayout(l classic.Layout) {
	if !s.awaitLoad() { // the keys to move may be in the checkpoint
		return
	}
	s.mu.Lock()
	t := s.rangesLocked().Offer(s.store, l)
	s.changedLocked(t)
	s.mu.Unlock()
	// Off the role's goroutine: the LB's directives need not wait for
	// the keys to be sent.
	go s.carryOut(t)
}

// changedLocked notes a change of the key ranges, which may have taken
// keys out of the store, and counts the carryOut of t that every caller
// starts next (a leave waits for it); s.mu is held.
func (s *Server) changedLocked(t classic.Todo) {
	s.carrying++
	self := s.node.Self().ID
	for _, a := range t.Applied {
		s.dirty = s.dirty || a.MovedOut > 0
		in := a.Layout.Index(self) >= 0
		switch {
		case in:
			s.outAt = 0
		case s.wasIn:
			s.outAt = a.Layout.Version
		}
		s.wasIn = in
	}
	s.dirty = s.dirty || t.Dropped > 0
}

// moved takes a KVMove or KVMoveEnd frame from another server.
func (s *Server) moved(h *frame.Header, payload []byte) error {
	if limit := s.node.Config().MaxFrameBytes; h.Total > limit {
		return fmt.Errorf("a moved classic value of %d bytes exceeds FPT_MAX_FRAME_BYTES (%d)", h.Total, limit)
	}
	if !s.awaitLoad() {
		return nil
	}
	s.mu.Lock()
	r := s.rangesLocked()
	var t classic.Todo
	var err error
	if h.Type == frame.KVMove {
		t, err = r.Move(s.store, h, payload)
		s.dirty = s.dirty || err == nil
	} else {
		t, err = r.MoveEnd(s.store, h)
	}
	if err != nil {
		s.mu.Unlock()
		return err
	}
	s.changedLocked(t)
	s.mu.Unlock()
	s.carryOut(t)
	return nil
}

// left takes another node's departure (role.New's left): a lost
// server's keys will not come; one that left in order (graceful) sends
// them all before its connection ends. A leave waits for the workers of
// the table, which no longer names id.
func (s *Server) left(id node.ID, graceful bool) error {
	defer s.wakeLeave()
	if r, _ := id.Role(); r != node.Server {
		return nil
	}
	s.mu.Lock()
	broken := s.broken[id]
	delete(s.broken, id)
	if graceful && !broken {
		s.leftInOrder[id] = true
	}
	s.mu.Unlock()
	if graceful {
		if broken {
			s.lostWhileHandingOver(id)
		}
		return nil
	}
	if !s.awaitLoad() {
		return nil
	}
	s.mu.Lock()
	t := s.rangesLocked().Lost(s.store, id)
	s.changedLocked(t)
	s.mu.Unlock()
	if t.Dropped > 0 {
		s.node.Logger().Warn("classic keys a lost server had not sent whole dropped", "server", id, "keys", t.Dropped)
	}
	go s.carryOut(t)
	return nil
}

// carryOut sends what a change of the key ranges produced, then routes
// the requests it released again. A failure fails the node: a key's
// value would be lost. changedLocked counted it in s.carrying.
func (s *Server) carryOut(t classic.Todo) {
	defer func() {
		s.mu.Lock()
		s.carrying--
		s.mu.Unlock()
		s.wakeLeave()
	}()
	for _, a := range t.Applied {
		s.node.Logger().Info("classic key layout applied", "layout", a.Layout, "keys_moved_out", a.MovedOut, "keys_kept", a.Kept)
	}
	s.mu.Lock()
	s.unsent += len(t.Sends)
	s.mu.Unlock()
	done := s.moveSent // one func value for every frame, not one each
	for i := range t.Sends {
		m := &t.Sends[i]
		m.Done = done
		if err := s.node.Van().Forward(m); err != nil {
			done(err) // not queued: no Done
		}
	}
	for _, held := range t.Released {
		if err := s.classicRequest(&held.Header, held.Payload); err != nil {
			s.node.Fail(fmt.Errorf("server: from %s: %s: %w", node.ID(held.Header.Sender), &held.Header, err))
			return
		}
	}
}

// moveSent is the Done of a KVMove or KVMoveEnd frame (always to a
// server): written, or failed. Under FPT_ON_SERVER_LOSS=retry a failed
// one went to a server lost meanwhile, whose range goes to others; else
// the node fails, since a key's value would be lost (the van's error
// names the server).
func (s *Server) moveSent(err error) {
	s.mu.Lock()
	s.unsent--
	s.mu.Unlock()
	s.wakeLeave()
	if err != nil && !s.node.Config().RetryServerLoss {
		s.node.Fail(fmt.Errorf("server: moving classic keys: %w", err))
	}
}

// kvError answers a classic request with its failure: the worker's Wait
// returns it. The server itself carries on.
func (s *Server) kvError(h *frame.Header, err error) error {
	s.node.Logger().Warn("classic request refused", "from", node.ID(h.Sender), "key", h.Key, "err", err)
	r := s.reply(h, frame.KVError, []byte(err.Error()))
	r.Header.DType = 0
	return s.node.Van().Forward(r)
}

func (s *Server) reply(h *frame.Header, t frame.Type, payload []byte) *frame.Message {
	return &frame.Message{
		Header: frame.Header{
			Type: t, DType: h.DType,
			Sender: uint32(s.node.Self().ID), Recipient: h.Sender,
			Key: h.Key, Partition: h.Partition, Offset: h.Offset, Total: h.Total,
			Priority: h.Priority, Aux: h.Aux,
		},
		Payload: payload,
	}
}
