package worker

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/fptps/fpt/cluster"
	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/localagg"
	"github.com/fptps/fpt/metrics"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/reduce"
	"golang.org/x/sys/unix"
)

// The shell of local aggregation (FPT_LOCAL_AGGREGATION=on): the workers
// of one host sum their pushes in a shared-memory segment, and the group's
// leader pushes one sum per partition (frame.FlagHostSum); the
// aggregators send the sums to leaders only, and a leader hands each to
// its group through the segment. The worker's core is unchanged: a
// member's pushes are taken before the van (intercept) and its results
// come in as its own sums (deliverLocal). The bookkeeping is
// localagg.Core's; this file moves bytes and small notices (a unixgram
// socket per worker, in the abstract namespace, so nothing is left on
// disk).

// localChunks is how many partitions each member may have in the segment
// at once, and how many results the leader may have there.
const localChunks = localagg.Chunks

// Notices between a group's workers: kind, member index, chunk, header.
const (
	noticeHello    = 1 + iota // member → leader: the segment is mapped
	noticeContrib             // member → leader: a contribution is in chunk
	noticeConsumed            // leader → member: the chunk is summed, free
	noticeResult              // leader → member: a result is in chunk
	noticeRead                // member → leader: the result (or host sum) was copied out
	noticeHostSum             // leader → member: a host sum for it to aggregate is in chunk
	noticeLen      = 1 + 2 + 4 + frame.HeaderSize
	// noticesPerDatagram bounds the notices to one peer that the writer
	// packs into one datagram: every datagram costs a send, a receive
	// and a wake-up on both sides, and a peer's socket queues only a few
	// (10 in a network namespace), so the notices that queue up while
	// the writer sends go out together.
	noticesPerDatagram = 64
)

// localAgg is one worker's side of its host's group.
type localAgg struct {
	log    *slog.Logger
	self   node.ID
	group  localagg.Group
	idx    int // self's index in group.Workers
	seg    *localagg.Segment
	dir    string // where the segment lives (FPT_LOCAL_AGGREGATION_DIR)
	name   string // the segment's, and its notice sockets' prefix
	job    uint64
	layout localagg.Layout
	// from is the first iteration the group sums: 0 for the group the job
	// started with, a decision's Iteration for one it re-formed; version
	// is that decision's (0: the start's). Pushes of its iterations cut
	// under an older decision (before a retry) are not its: they go over
	// the network, where the aggregators drop them as a retry's stale.
	from    uint64
	version uint32
	conn    *net.UnixConn
	addrs   []*net.UnixAddr // by member index
	fail    func(error)
	deliver func(h *frame.Header, data []byte)
	send    func(m *frame.Message) error
	// agg is this worker's own aggregator: the leader's host sums of the
	// partitions it aggregates itself go to it, and a member's that its
	// leader hands it through the segment.
	agg     ownAggregator
	metrics *metrics.Node // nil: none

	// elastic: a lost worker leaves the job rather than ending it
	// (FPT_ON_WORKER_LOSS=continue or wait): a notice that cannot reach
	// a lost peer is dropped, and the retry its loss brings dissolves
	// the group.
	elastic bool
	// survives says whether the job outlives the loss of a node
	// (config.Survives): a host sum that cannot reach such an aggregator
	// is left to the retry its loss brings, as any push to it is.
	survives func(node.ID) bool
	dropped  map[node.ID]bool // aggregators whose host sums were dropped (logged once each)

	mu sync.Mutex
	// cond is signalled when a chunk is freed or the side stops;
	// outReady, writer's, when notices are queued for it or a send
	// straight from post ends, or the side closes (a chunk freed per
	// notice read would wake writer for nothing).
	cond, outReady *sync.Cond
	// forming: the group is not formed yet (a re-formed one, formed on a
	// goroutine of its own so that no directive waits for it); its pushes
	// wait in pending, their Done not run, until it is.
	forming bool
	pending []frame.Message
	// hostSums counts the leader's host sums (logged at close).
	hostSums int
	// datagrams counts the datagrams writer sent (logged at close: the
	// notices they carried are packed, several to one where they queued).
	datagrams int
	// sendFull counts the sends that found a member's queue full and
	// were tried again once it had room (logged at close).
	sendFull int
	// early are the notices the leader read while it waited for its
	// members' hellos, for the loop.
	early  [][]byte
	free   []int // member: its contribution chunks free; leader: result chunks free
	closed bool
	// until is the first iteration the group no longer sums (a retry's,
	// dissolve): its pushes and results go over the network, as if each
	// worker were alone on its host. MaxUint64 until a retry.
	until uint64
	// outbox holds the notices to send, which writer sends in order: a
	// notice never blocks the loop that takes them (two loops blocked
	// on each other's full socket queue would wait for ever; a network
	// namespace's queue holds 10 datagrams).
	outbox []outNotice
	// sending: notices are going out on sockets, a batch of the outbox
	// (writer) or one straight from post; only the goroutine that set it
	// uses sockets, so that notices leave in the order made.
	sending bool
	sockets noticeSockets
	direct  []datagram // post's, reused (by the goroutine that set sending)
	// held is flush's spare outbox: the loop swaps it with outbox, as
	// writer does its own, so that holding allocates nothing.
	held []outNotice
	// retired: every worker has the sums of every iteration the group
	// summed (the LB's Done passed them), so nothing of it is needed
	// again; its segment is unmapped (or being) and no call touches it.
	// Its notice socket stays open until the worker closes: a peer that
	// has not followed the retry yet may still send to it, and what
	// comes is dropped.
	retired bool
	// retiredDrops counts the notices dropped since (logged at close).
	retiredDrops int
	// busy counts the calls using the segment: close and unmap unmap it
	// only once they are out.
	busy sync.WaitGroup
	// socks counts the notice socket's goroutines (loop, writer), which
	// close waits for.
	socks     sync.WaitGroup
	closeOnce sync.Once
	// The leader's.
	core  *localagg.Core
	first map[localagg.Slot]frame.Header // each slot's first contribution, which the others must match
	sums  map[localagg.Slot][]byte
	// spare are host sums' buffers whose sends completed, for the next
	// ones (at most maxSpareSums): a leader sums a partition per member
	// round and would otherwise allocate each.
	spare   [][]byte
	readers map[int]readers // result chunks being read
	// waiting are results published while every result chunk was still
	// being read, copied, in order: the notice loop publishes each as a
	// member's read frees a chunk. Never a chunk free while one waits.
	waiting []waitingResult
}

// waitingResult is a result for the group that waits for a result chunk,
// and who will read it there.
type waitingResult struct {
	h       frame.Header
	data    []byte
	readers readers
}

// ownAggregator is the worker's own aggregator (aggregator.Aggregator)
// as its group's side uses it.
type ownAggregator interface {
	// AddLocal adds the contribution h, copying data.
	AddLocal(h *frame.Header, data []byte) error
	// PayloadBuffer is a buffer of the aggregator's for the contribution
	// h, which HandlePush(h, buf, true) takes back.
	PayloadBuffer(h *frame.Header) []byte
	HandlePush(h *frame.Header, payload []byte, inPlace bool) error
}

type outNotice struct {
	to int
	b  [noticeLen]byte
}

type readers struct {
	left int
	slot localagg.Slot
	init bool // an init round's result: no host sum behind it
	// hostSum: a host sum for the member reading it to aggregate, not a
	// result (no bookkeeping of the core's).
	hostSum bool
}

// newLocalAgg is this worker's side of group g, which sums the
// iterations from from on in the segment name, made for the decision of
// the given version (0: the job's start): not formed yet (form).
func newLocalAgg(n *cluster.Member, g localagg.Group, name string, from uint64, version uint32, deliver func(*frame.Header, []byte), agg ownAggregator) *localAgg {
	cfg := n.Config()
	self := n.Self().ID
	l := &localAgg{log: n.Logger(), self: self, group: g, idx: slices.Index(g.Workers, self), name: name, from: from, version: version,
		fail: n.Fail, deliver: deliver, send: n.Van().Send, agg: agg, metrics: n.Metrics(), elastic: cfg.WorkersMayLeave(), survives: cfg.Survives, dropped: map[node.ID]bool{}, until: math.MaxUint64,
		dir: cfg.SegmentDir(), job: n.JobStamp(), layout: localagg.GroupLayout(len(g.Workers), cfg.PartitionBytes)}
	l.initConds()
	for _, w := range g.Workers {
		l.addrs = append(l.addrs, &net.UnixAddr{Name: "@" + name + "-" + w.String(), Net: "unixgram"})
	}
	return l
}

// form sets the group up: the leader makes the segment and waits for
// every member to map it, then removes its name (a job killed later
// leaves nothing behind); a member maps it and says hello. It gives up
// at deadline, or once the group is dissolved from its first iteration
// (a later retry, perhaps for a member lost meanwhile, which closes it).
func (l *localAgg) form(deadline time.Time) error {
	if !l.enter() {
		return errors.New("local aggregation: closed")
	}
	defer l.busy.Done()
	conn, err := net.ListenUnixgram("unixgram", l.addrs[l.idx])
	if err != nil {
		return fmt.Errorf("notice socket: %w", err)
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		conn.Close()
		return errors.New("local aggregation: closed")
	}
	l.conn = conn
	l.socks.Add(1)
	l.mu.Unlock()
	go l.writer()
	if l.idx == 0 {
		err = l.lead(l.name, l.job, l.layout, deadline)
	} else {
		err = l.join(l.name, l.job, l.layout, deadline)
	}
	if err != nil {
		return err
	}
	l.mu.Lock()
	for i := range localChunks {
		l.free = append(l.free, i)
	}
	l.mu.Unlock()
	early := l.early
	l.early = nil
	for _, b := range early {
		if err := l.handle(b); err != nil {
			return err
		}
	}
	l.socks.Add(1)
	go l.loop()
	return nil
}

// lead makes the segment and waits for every member's hello.
func (l *localAgg) lead(name string, job uint64, layout localagg.Layout, deadline time.Time) error {
	if gone, err := localagg.Sweep(l.dir); err == nil && len(gone) > 0 {
		l.log.Warn("local aggregation: removed segments of jobs that were killed", "segments", gone)
	}
	seg, stale, err := localagg.Create(l.dir, name, job, 0, layout)
	if err != nil {
		return err
	}
	if stale {
		l.log.Warn("local aggregation: replaced a segment left by a killed job", "segment", seg.Path())
	}
	l.seg = seg
	core, err := localagg.NewCore(l.group.Workers, 1<<30, localagg.LossFail)
	if err != nil {
		return err
	}
	for _, w := range l.group.Workers {
		if err := core.Declared(w, 0); err != nil {
			return err
		}
	}
	l.mu.Lock()
	l.core, l.first, l.sums, l.readers = core, map[localagg.Slot]frame.Header{}, map[localagg.Slot][]byte{}, map[int]readers{}
	l.mu.Unlock()
	hello := make([]bool, len(l.group.Workers))
	hello[0] = true
	buf := make([]byte, noticeLen*noticesPerDatagram)
	for slices.Contains(hello, false) {
		if err := l.conn.SetReadDeadline(deadline); err != nil {
			return err
		}
		n, err := l.conn.Read(buf)
		if err != nil {
			return fmt.Errorf("waiting for the group's workers to map the segment: %w", err)
		}
		ns, err := splitNotices(buf[:n])
		if err != nil {
			return err
		}
		for _, b := range ns {
			if b[0] == noticeHello {
				if m := int(binary.LittleEndian.Uint16(b[1:])); m > 0 && m < len(hello) {
					hello[m] = true
				}
				continue
			}
			// A member that mapped the segment may contribute before
			// the others did: its notices wait for the loop.
			l.early = append(l.early, slices.Clone(b))
		}
	}
	if err := l.conn.SetReadDeadline(time.Time{}); err != nil {
		return err
	}
	// Every member mapped it: its name is no longer needed.
	if err := os.Remove(seg.Path()); err != nil {
		return fmt.Errorf("remove the segment's name: %w", err)
	}
	return nil
}

// join maps the leader's segment, once it is there, and says hello.
func (l *localAgg) join(name string, job uint64, layout localagg.Layout, deadline time.Time) error {
	for {
		seg, err := localagg.Open(l.dir, name, job, 0, layout)
		if err == nil {
			l.seg = seg
			break
		}
		// Not there yet, or still being written: the leader may be
		// slower to start. Another job's or another layout's stays
		// wrong, and is reported at the deadline.
		if errors.Is(err, localagg.ErrDisagree) || time.Now().After(deadline) {
			return err
		}
		if l.abandoned() {
			return errors.New("local aggregation: group dissolved before it formed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return l.notify(0, noticeHello, 0, nil)
}

// notify sends a notice to member m (post).
func (l *localAgg) notify(m int, kind byte, chunk int, h *frame.Header) error {
	return l.post(l.notice(m, kind, chunk, h))
}

// notice is a notice to member m from this side.
func (l *localAgg) notice(m int, kind byte, chunk int, h *frame.Header) outNotice {
	n := outNotice{to: m}
	n.b[0] = kind
	binary.LittleEndian.PutUint16(n.b[1:], uint16(l.idx))
	binary.LittleEndian.PutUint32(n.b[3:], uint32(chunk))
	if h != nil {
		h.Encode(n.b[7:])
	}
	return n
}

// post sends notices ns, in order. Where nothing is queued or going out
// and they fit one datagram (to one member), it sends them itself, unless
// the member's queue is full: handed to writer, they would wait for that
// goroutine's wake-up, and where the caller is the program's thread,
// which goes back to C holding its P, perhaps for sysmon to find the
// writer there. Otherwise, or if that send fails, writer sends them (and
// handles the failure), in order.
func (l *localAgg) post(ns ...outNotice) error {
	if len(ns) == 0 {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return errors.New("local aggregation: closed")
	}
	if l.sending || len(l.outbox) > 0 {
		l.outbox = append(l.outbox, ns...)
		if !l.sending {
			l.outReady.Broadcast()
		}
		return nil
	}
	l.sending = true
	l.mu.Unlock()
	l.direct = packNotices(l.direct, ns)
	sent := len(l.direct) == 1 && l.sendNow(l.direct[0])
	l.mu.Lock()
	l.sending = false
	if sent {
		l.datagrams++
	} else {
		l.outbox = slices.Insert(l.outbox, 0, ns...)
	}
	if len(l.outbox) > 0 || l.closed {
		l.outReady.Broadcast()
	}
	return nil
}

// sendNow sends datagram d if it can without waiting. Called by the
// goroutine that set sending.
func (l *localAgg) sendNow(d datagram) bool {
	fd, err := l.sockets.to(d.to, l.addrs[d.to])
	if err != nil {
		return false
	}
	_, err = unix.Write(fd, d.b)
	return err == nil
}

// initConds makes the side's condition variables, on mu.
func (l *localAgg) initConds() {
	l.cond = sync.NewCond(&l.mu)
	l.outReady = sync.NewCond(&l.mu)
}

// enter counts a user of the segment in, unless closed or retired.
func (l *localAgg) enter() bool {
	ok, _ := l.enterRetired()
	return ok
}

// enterRetired is enter, also saying whether the side was retired.
func (l *localAgg) enterRetired() (ok, retired bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || l.retired {
		return false, l.retired
	}
	l.busy.Add(1)
	return true, false
}

// writer sends the queued notices until close, over the group's sockets
// (noticeSockets), which it closes on its way out. Its buffers are
// reused from batch to batch: the outbox it took last (notify fills the
// other) and the datagrams (the kernel copies each as it is sent).
func (l *localAgg) writer() {
	defer l.socks.Done()
	// Every return leaves sending set, for good: no one uses the
	// sockets after. (Read at return: post may have dialled some.)
	defer func() { l.sockets.close() }()
	var spare []outNotice
	var ds []datagram
	for {
		l.mu.Lock()
		for (len(l.outbox) == 0 || l.sending) && !l.closed {
			l.outReady.Wait()
		}
		if l.closed {
			for l.sending {
				l.outReady.Wait()
			}
			l.sending = true
			l.mu.Unlock()
			return
		}
		out := l.outbox
		l.outbox = spare[:0]
		l.sending = true
		l.mu.Unlock()
		ds = packNotices(ds, out)
		spare = out
		for _, n := range ds {
			fd, err := l.sockets.to(n.to, l.addrs[n.to])
			if err == nil {
				err = l.write(fd, n.b)
			}
			if err != nil {
				l.mu.Lock()
				closed, retired := l.closed, l.retired
				l.mu.Unlock()
				if closed {
					return
				}
				if retired {
					// Nothing of the group is needed any more.
					l.log.Debug("local aggregation: notice of a retired group dropped", "member", l.group.Workers[n.to], "err", err)
					continue
				}
				if l.elastic {
					// The peer's socket is gone with its process: the
					// scheduler's retry for its loss dissolves the group,
					// and the workers left push again over the network
					// what the notice was about.
					l.log.Warn("local aggregation: notice to a lost group member dropped", "member", l.group.Workers[n.to], "err", err)
					continue
				}
				l.fail(fmt.Errorf("worker: local aggregation: notice to %s: %w", l.group.Workers[n.to], err))
				return
			}
			l.mu.Lock()
			l.datagrams++
			l.mu.Unlock()
		}
		l.mu.Lock()
		l.sending = false
		l.mu.Unlock()
	}
}

// noticeSockets are the sockets notices go out on, each connected to a
// member's (by index), dialled on first use. A notice sent to an address
// from one unconnected socket finds the member's queue full often (it
// holds 10 datagrams) and gets EAGAIN, and since the kernel only wakes a
// connected sender when that queue drains, the writer would retry at
// every wake-up (most of its sends failed so). They are plain
// non-blocking descriptors, not the runtime poller's: the poller watches
// every descriptor for room to write as well, edge-triggered, so each
// datagram a member read would wake this process's poller for room no one
// waits for (a thread woken per notice); writer waits for room itself
// (write). Only the goroutine that set localAgg.sending uses them; writer
// closes them on its way out.
type noticeSockets map[int]int

// to is the socket connected to member m at addr.
func (s *noticeSockets) to(m int, addr *net.UnixAddr) (int, error) {
	if fd, ok := (*s)[m]; ok {
		return fd, nil
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("notice socket: %w", err)
	}
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: addr.Name}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("connect to %s: %w", addr.Name, err)
	}
	if *s == nil {
		*s = make(noticeSockets)
	}
	(*s)[m] = fd
	return fd, nil
}

func (s noticeSockets) close() {
	for _, fd := range s {
		unix.Close(fd)
	}
}

// roomWait bounds one wait of write for room in a member's queue, so that
// close ends the wait within it.
const roomWait = 50 * time.Millisecond

// write sends datagram b over fd, waiting while the member's queue is
// full, and counts the datagrams that found it full (sendFull).
func (l *localAgg) write(fd int, b []byte) error {
	full := false
	for {
		_, err := unix.Write(fd, b)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, unix.EINTR):
			continue
		case !errors.Is(err, unix.EAGAIN):
			return err
		}
		l.mu.Lock()
		if !full {
			full = true
			l.sendFull++
		}
		closed := l.closed
		l.mu.Unlock()
		if closed {
			return errors.New("local aggregation: closed")
		}
		room := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		if _, err := unix.Poll(room, int(roomWait/time.Millisecond)); err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("wait for room: %w", err)
		}
	}
}

// datagram is notices to one member, packed back to back.
type datagram struct {
	to int
	b  []byte
}

// packNotices packs out into datagrams, ds's storage reused: each
// member's notices in the order queued (a member reads them in that
// order), at most noticesPerDatagram to a datagram.
func packNotices(ds []datagram, out []outNotice) []datagram {
	ds = ds[:0]
	for _, n := range out {
		i := len(ds) - 1 // the member's latest datagram: a group has few
		for i >= 0 && ds[i].to != n.to {
			i--
		}
		if i < 0 || len(ds[i].b) == noticeLen*noticesPerDatagram {
			i = len(ds)
			if i < cap(ds) {
				ds = ds[:i+1]
				ds[i].to, ds[i].b = n.to, ds[i].b[:0]
			} else {
				ds = append(ds, datagram{to: n.to, b: make([]byte, 0, noticeLen*noticesPerDatagram)})
			}
		}
		ds[i].b = append(ds[i].b, n.b[:]...)
	}
	return ds
}

// splitNotices is a datagram's notices.
func splitNotices(b []byte) ([][]byte, error) {
	if len(b) == 0 || len(b)%noticeLen != 0 {
		return nil, fmt.Errorf("local aggregation: a %d-byte datagram of notices", len(b))
	}
	ns := make([][]byte, 0, len(b)/noticeLen)
	for ; len(b) > 0; b = b[noticeLen:] {
		ns = append(ns, b[:noticeLen:noticeLen])
	}
	return ns, nil
}

// dissolve ends the group's sums from iteration from on: a retry decision
// (a lost worker, FPT_ON_WORKER_LOSS=continue or wait) re-cuts those
// iterations, each worker pushes them again over the network, and the
// aggregators send every worker its sums (aggregator/hosts.go). The group
// stops there rather than re-forming over the members left: its leader
// may be the one lost, and with it the segment's sums of those iterations.
// The host sums of earlier iterations are complete for every worker.
func (l *localAgg) dissolve(from uint64) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if from >= l.until {
		return
	}
	l.until = from
	if l.forming && from <= l.from {
		// It would sum nothing: stop waiting for its members (one may
		// be the worker this retry is for).
		go l.close()
		return
	}
	for s := range l.first {
		if s.Iter >= from {
			delete(l.first, s)
			delete(l.sums, s)
		}
	}
	// Every worker is sent its own sums of those iterations (publish).
	l.waiting = slices.DeleteFunc(l.waiting, func(r waitingResult) bool { return !r.readers.init && r.h.Iteration >= from })
	// A member waiting for a chunk its lost leader would never free
	// drops its push (the retry sends it again).
	l.cond.Broadcast()
	l.log.Info("local aggregation: group dissolved", "host", l.group.Host, "group", l.group.Workers, "from_iteration", from)
}

// due reports whether this side may be retired at done, the LB's Done:
// the group was dissolved before done (every worker has the sums of every
// iteration it summed, and no retry re-cuts them: a retry starts at an
// iteration some worker lacks) and is not retired, closed or forming.
func (l *localAgg) due(done uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.closed && !l.retired && !l.forming && l.until != math.MaxUint64 && l.until <= done
}

// unmap retires this side: no call enters it from now on (a notice that
// comes is dropped, a push or result of its iterations is not its), and
// once the calls under way are out its segment is unmapped. Its notice
// socket stays open until close, so that a peer still sending to the
// group meets a socket that drops what comes, never a refusal that
// would fail the job.
func (l *localAgg) unmap() {
	l.mu.Lock()
	if l.closed || l.retired {
		l.mu.Unlock()
		return
	}
	l.retired = true
	l.waiting = nil // its members read nothing more
	until := l.until
	l.cond.Broadcast()
	l.mu.Unlock()
	l.busy.Wait()
	if l.unmapSegment() {
		l.log.Info("local aggregation: group's segment unmapped", "host", l.group.Host, "group", l.group.Workers, "from_iteration", l.from, "until_iteration", until)
	}
}

// unmapSegment unmaps the segment once, if mapped; no call may use it.
func (l *localAgg) unmapSegment() bool {
	l.mu.Lock()
	seg := l.seg
	l.seg = nil
	l.mu.Unlock()
	if seg == nil {
		return false
	}
	if err := seg.Close(); err != nil {
		l.log.Warn("local aggregation: closing the segment", "err", err)
	}
	return true
}

// mapped reports whether this side has its segment mapped.
func (l *localAgg) mapped() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.seg != nil
}

// abandoned reports whether the group was closed, or dissolved from its
// first iteration, before it formed.
func (l *localAgg) abandoned() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed || l.until <= l.from
}

// formed takes the pushes that waited while the group formed, then any
// that come, as they come.
func (l *localAgg) formed() error {
	if !l.enter() {
		return nil
	}
	defer l.busy.Done()
	for {
		l.mu.Lock()
		batch := l.pending
		l.pending = nil
		if len(batch) == 0 {
			l.forming = false
			l.mu.Unlock()
			return nil
		}
		l.mu.Unlock()
		rest, err := l.take(batch)
		if err != nil {
			return err
		}
		// Of an iteration the group was dissolved from meanwhile: the
		// retry that dissolved it sends them again.
		for i := range rest {
			if rest[i].Done != nil {
				rest[i].Done(nil)
			}
		}
	}
}

// intercept takes the pushes of sends (not an init round's) into the
// group's sums and returns the frames left to send. A push taken is done
// (its Done runs) once its bytes are in the segment or the host's sum.
// While the group forms, its pushes wait (formed takes them).
func (l *localAgg) intercept(sends []frame.Message) ([]frame.Message, error) {
	if l == nil {
		return sends, nil
	}
	if ok, retired := l.enterRetired(); retired {
		return sends, nil // not its: every worker has its iterations' sums
	} else if !ok {
		return nil, errors.New("local aggregation: closed")
	}
	defer l.busy.Done()
	l.mu.Lock()
	if l.forming {
		rest := sends[:0:0]
		for i := range sends {
			if l.ours(&sends[i].Header) {
				l.pending = append(l.pending, sends[i])
			} else {
				rest = append(rest, sends[i])
			}
		}
		l.mu.Unlock()
		return rest, nil
	}
	l.mu.Unlock()
	return l.take(sends)
}

// ours reports whether h is a push the group sums: not an init round's,
// of an iteration it sums, cut under its decision or a later one. Called
// with l.mu held.
func (l *localAgg) ours(h *frame.Header) bool {
	return h.Type == frame.Push && h.Flags&frame.FlagInit == 0 && h.Iteration >= l.from && h.Iteration < l.until && h.Aux >= l.version
}

// take is intercept once the group formed.
func (l *localAgg) take(sends []frame.Message) ([]frame.Message, error) {
	rest := sends[:0:0]
	// A member's contributions' notices, posted together, and then the
	// Done of their pushes: a Done may hand this worker more pushes,
	// whose contributions may wait for chunks that the leader frees only
	// once it has these notices.
	var unsent []outNotice
	var contributed []func(error)
	for i := range sends {
		m := &sends[i]
		l.mu.Lock()
		ours := l.ours(&m.Header)
		l.mu.Unlock()
		if !ours {
			rest = append(rest, *m)
			continue
		}
		if l.idx > 0 {
			if err := l.contribute(m, &unsent); err != nil {
				return nil, err
			}
			if m.Done != nil {
				contributed = append(contributed, m.Done)
			}
			continue
		}
		if err := l.arrive(0, &m.Header, m.Payload); err != nil {
			return nil, err
		}
		if m.Done != nil {
			m.Done(nil)
		}
	}
	if err := l.post(unsent...); err != nil {
		return nil, err
	}
	for _, done := range contributed {
		done(nil)
	}
	return rest, nil
}

// contribute writes a member's push into a free chunk and adds the
// notice that tells the leader to unsent, for the caller to post (take:
// a call's together, packed). A push of an iteration the group was
// dissolved from while it waited for a chunk is dropped: the retry that
// dissolved it sent the push again, over the network. Before it waits
// for a chunk, what is unsent goes out: the leader frees chunks for the
// notices it gets.
func (l *localAgg) contribute(m *frame.Message, unsent *[]outNotice) error {
	if len(m.Payload) > len(l.seg.Contribution(l.idx, 0)) {
		return fmt.Errorf("local aggregation: a %d-byte partition does not fit the segment's %d-byte slots", len(m.Payload), len(l.seg.Contribution(l.idx, 0)))
	}
	l.mu.Lock()
	for len(l.free) == 0 && !l.closed && !l.retired && m.Header.Iteration < l.until {
		if len(*unsent) > 0 {
			l.mu.Unlock()
			err := l.post(*unsent...)
			*unsent = (*unsent)[:0]
			if err != nil {
				return err
			}
			l.mu.Lock()
			continue
		}
		l.cond.Wait()
	}
	if l.closed {
		l.mu.Unlock()
		return errors.New("local aggregation: closed")
	}
	if m.Header.Iteration >= l.until || l.retired {
		l.mu.Unlock()
		return nil
	}
	chunk := l.free[len(l.free)-1]
	l.free = l.free[:len(l.free)-1]
	l.mu.Unlock()
	copy(l.seg.Contribution(l.idx, chunk), m.Payload)
	*unsent = append(*unsent, l.notice(0, noticeContrib, chunk, &m.Header))
	return nil
}

// arrive is the leader's: member m's contribution h, data, is summed into
// the host's sum at once, which is pushed once every member's is in.
func (l *localAgg) arrive(m int, h *frame.Header, data []byte) error {
	s := localagg.Slot{Key: h.Key, Part: int(h.Partition), Iter: h.Iteration}
	l.mu.Lock()
	if s.Iter >= l.until {
		// A member's, sent before the group was dissolved: the retry
		// has it pushed again over the network.
		l.mu.Unlock()
		return nil
	}
	f, seen := l.first[s]
	if !seen {
		l.first[s] = *h
	} else if f.DType != h.DType || f.Offset != h.Offset || f.Total != h.Total || f.Length != h.Length || f.Recipient != h.Recipient || f.Aux != h.Aux {
		l.mu.Unlock()
		return fmt.Errorf("local aggregation: workers %s and %s of host %q disagree on key %d (declared differently?): %s against %s",
			node.ID(f.Sender), node.ID(h.Sender), l.group.Host, h.Key, h, &f)
	}
	eff, err := l.core.Arrived(l.group.Workers[m], s)
	if err != nil {
		l.mu.Unlock()
		return err
	}
	for _, sum := range eff.Sums {
		if sum.First {
			l.sums[s] = l.firstSum(h, data)
		} else if err := reduce.Add(h.DType, l.sums[s], data); err != nil {
			l.mu.Unlock()
			return fmt.Errorf("local aggregation: %w", err)
		}
	}
	var out, own []*frame.Message
	var shared []sharedSum
	for _, snd := range eff.Sends {
		hh := l.first[snd.Slot]
		hh.Sender = uint32(l.self)
		hh.Flags |= frame.FlagHostSum
		buf := l.sums[snd.Slot]
		delete(l.first, snd.Slot)
		delete(l.sums, snd.Slot)
		if node.ID(hh.Recipient) == l.self {
			own = append(own, &frame.Message{Header: hh, Payload: buf})
			continue
		}
		if sh, ok := l.shareSum(hh, buf); ok {
			shared = append(shared, sh)
			continue
		}
		out = append(out, &frame.Message{Header: hh, Payload: buf, Done: func(err error) {
			if err = l.sendError(&hh, err); err != nil {
				l.fail(fmt.Errorf("worker: %w", err))
				return
			}
			l.mu.Lock()
			if len(l.spare) < maxSpareSums {
				l.spare = append(l.spare, buf)
			}
			l.mu.Unlock()
		}})
	}
	l.hostSums += len(out) + len(own) + len(shared)
	l.mu.Unlock()
	l.metrics.LocalSummed(len(eff.Sums), len(out)+len(own)+len(shared))
	for _, msg := range own {
		l.addOwn(msg)
	}
	for _, sh := range shared {
		if err := l.handOver(sh); err != nil {
			return err
		}
	}
	for _, msg := range out {
		if err := l.sendError(&msg.Header, l.send(msg)); err != nil {
			return err
		}
	}
	return nil
}

// sharedSum is a host sum for a member of the group to aggregate, handed
// over in a result chunk of the segment rather than over loopback TCP.
type sharedSum struct {
	m     int // the member's index
	chunk int
	h     frame.Header
	buf   []byte
}

// shareSum takes a result chunk for the host sum h, buf, where its
// aggregator is a member of the group and a chunk is free; ok false
// otherwise (the leader's own partitions go to its aggregator, the
// others' over the network; with every chunk taken, a member's goes over
// loopback rather than waiting, since the notice loop, perhaps the caller,
// frees them). Called with l.mu held.
func (l *localAgg) shareSum(h frame.Header, buf []byte) (sharedSum, bool) {
	m := slices.Index(l.group.Workers, node.ID(h.Recipient))
	if m <= 0 || l.seg == nil || len(l.free) == 0 || len(buf) > len(l.seg.HostSum(0)) {
		return sharedSum{}, false
	}
	chunk := l.free[len(l.free)-1]
	l.free = l.free[:len(l.free)-1]
	l.readers[chunk] = readers{left: 1, hostSum: true}
	return sharedSum{m: m, chunk: chunk, h: h, buf: buf}, true
}

// handOver writes a shared host sum into its chunk, tells its member,
// and keeps the buffer for the next sums.
func (l *localAgg) handOver(sh sharedSum) error {
	copy(l.seg.HostSum(sh.chunk), sh.buf)
	l.mu.Lock()
	if len(l.spare) < maxSpareSums {
		l.spare = append(l.spare, sh.buf)
	}
	l.mu.Unlock()
	return l.notify(sh.m, noticeHostSum, sh.chunk, &sh.h)
}

// addShared is a member's: the host sum h its leader wrote into chunk
// goes to its aggregator (which copies it), on the notice loop, as the
// leader's own does (addOwn); then the chunk is the leader's again.
func (l *localAgg) addShared(h *frame.Header, chunk int) {
	if !l.enter() {
		return
	}
	defer l.busy.Done()
	if err := l.agg.AddLocal(h, l.seg.HostSum(chunk)[:h.Length]); err != nil {
		l.fail(fmt.Errorf("worker: from %s through the segment: %s: %w", node.ID(h.Sender), h, err))
		return
	}
	if err := l.notify(0, noticeRead, chunk, h); err != nil {
		l.log.Debug("local aggregation: host sum read after close", "err", err)
	}
}

// sendError is what a host sum h that could not be sent (err) means for
// the group: nothing where the job outlives its aggregator's loss (a
// worker of a balanced split, perhaps a member of this very group, under
// FPT_ON_WORKER_LOSS=continue or wait): if the aggregator is gone, the
// scheduler's retry for its loss has the partition pushed again, over the
// network; if it is not, the cluster fails anyway. Otherwise the error,
// naming the host sum.
func (l *localAgg) sendError(h *frame.Header, err error) error {
	if err == nil {
		return nil
	}
	if to := node.ID(h.Recipient); l.survives != nil && l.survives(to) {
		l.mu.Lock()
		first := !l.dropped[to]
		if first {
			l.dropped[to] = true
		}
		l.mu.Unlock()
		if first {
			l.log.Warn("local aggregation: host sums to a lost aggregator dropped; the retry for its loss has those partitions pushed again", "aggregator", to, "err", err)
		}
		return nil
	}
	return fmt.Errorf("local aggregation: host sum %s: %w", h, err)
}

// addOwn adds the leader's host sum of a partition it aggregates itself
// to its aggregator, on the goroutine that completed it: the notice loop,
// or the caller whose push did. The sum may complete there and be handed
// to the group (publish) and to this worker, all without waiting: the
// aggregator forwards, never blocks, and publish leaves a result that
// finds no chunk free for the loop. (A goroutine of its own per host sum
// cost a small step a quarter of its thread wake-ups: docs/latency.md.)
// The sum's buffer is the aggregator's (firstSum), which takes it over.
func (l *localAgg) addOwn(msg *frame.Message) {
	if !l.enter() {
		return
	}
	defer l.busy.Done()
	err := l.agg.HandlePush(&msg.Header, msg.Payload, true)
	if err = l.sendError(&msg.Header, err); err != nil {
		l.fail(fmt.Errorf("worker: %w", err))
	}
}

// firstSum is a buffer for the host sum of slot h holding data, its
// first contribution: the aggregator's own where the leader aggregates
// the partition itself, so that the sum needs no copy there (addOwn), a
// spare one otherwise. h.Length is len(data): a push's own, or a
// member's contribution cut to it. Called with l.mu held: the aggregator
// never calls into the group under its lock.
func (l *localAgg) firstSum(h *frame.Header, data []byte) []byte {
	if node.ID(h.Recipient) != l.self {
		return append(l.sumBuf(len(data)), data...)
	}
	buf := l.agg.PayloadBuffer(h)
	copy(buf, data)
	return buf
}

// maxSpareSums bounds the host sums' buffers a leader keeps for reuse.
const maxSpareSums = 64

// sumBuf is an empty buffer with room for n bytes, a spare one where one
// is large enough. Called with l.mu held.
func (l *localAgg) sumBuf(n int) []byte {
	for i := len(l.spare) - 1; i >= 0; i-- {
		if b := l.spare[i]; cap(b) >= n {
			l.spare[i] = l.spare[len(l.spare)-1]
			l.spare = l.spare[:len(l.spare)-1]
			return b[:0]
		}
	}
	return make([]byte, 0, n)
}

// publish is the leader's: a result it received, data, goes to every
// member through the segment, before the leader's own lands (its buffer
// is the program's after that).
func (l *localAgg) publish(h *frame.Header, data []byte) error {
	if l == nil || l.idx != 0 || !l.enter() {
		return nil
	}
	defer l.busy.Done()
	chunk, ok, err := l.claim(h, data)
	if err != nil || !ok {
		return err
	}
	return l.fill(chunk, h, data)
}

// claim takes a free result chunk for the result h, data. ok is false
// where there is nothing to fill: the group no longer sums h's iteration
// (every worker is sent its own sums of it), or every chunk is still
// being read. Waiting for one then would wait for ever on the notice
// loop, which frees them (a host sum it completed, addOwn); the result
// waits instead, copied, for the loop to fill it in as a member's read
// frees one (read).
func (l *localAgg) claim(h *frame.Header, data []byte) (chunk int, ok bool, err error) {
	s := localagg.Slot{Key: h.Key, Part: int(h.Partition), Iter: h.Iteration}
	init := h.Flags&frame.FlagInit != 0
	l.mu.Lock()
	defer l.mu.Unlock()
	if h.Iteration >= l.until && !init {
		return 0, false, nil
	}
	if !init {
		if _, err := l.core.ResultIn(s); err != nil {
			return 0, false, err
		}
	}
	if len(data) > len(l.seg.HostSum(0)) {
		return 0, false, fmt.Errorf("local aggregation: a %d-byte result does not fit the segment's slots", len(data))
	}
	r := readers{left: len(l.group.Workers) - 1, slot: s, init: init}
	if len(l.free) == 0 {
		l.waiting = append(l.waiting, waitingResult{h: *h, data: bytes.Clone(data), readers: r})
		return 0, false, nil
	}
	chunk = l.free[len(l.free)-1]
	l.free = l.free[:len(l.free)-1]
	l.readers[chunk] = r
	return chunk, true, nil
}

// fill writes the result h, data into chunk, which its readers hold, and
// tells the members.
func (l *localAgg) fill(chunk int, h *frame.Header, data []byte) error {
	copy(l.seg.HostSum(chunk), data)
	for m := 1; m < len(l.group.Workers); m++ {
		hh := *h
		hh.Recipient = uint32(l.group.Workers[m])
		if err := l.notify(m, noticeResult, chunk, &hh); err != nil {
			return err
		}
	}
	return nil
}

// loop takes the group's notices until the socket closes; once the side
// is retired it drops them.
func (l *localAgg) loop() {
	defer l.socks.Done()
	buf := make([]byte, noticeLen*noticesPerDatagram)
	for {
		n, err := l.conn.Read(buf)
		if err != nil {
			l.mu.Lock()
			closed := l.closed
			l.mu.Unlock()
			if !closed {
				l.fail(fmt.Errorf("worker: local aggregation: %w", err))
			}
			return
		}
		ok, retired := l.enterRetired()
		if retired {
			// A peer's that had not followed the retry yet: it has
			// the group's sums all the same (the LB's Done says so).
			l.mu.Lock()
			l.retiredDrops += max(1, n/noticeLen)
			l.mu.Unlock()
			l.log.Debug("local aggregation: notices for a retired group dropped", "host", l.group.Host, "group", l.group.Workers, "kind", buf[0], "notices", n/noticeLen)
			continue
		}
		if !ok {
			return // closing
		}
		held := l.hold()
		err = l.handleAll(buf[:n])
		if held {
			l.flush()
		}
		l.busy.Done()
		if err != nil {
			l.mu.Lock()
			closed := l.closed
			l.mu.Unlock()
			if !closed { // closing: a notice it can no longer answer is no failure
				l.fail(fmt.Errorf("worker: %w", err))
			}
			return
		}
	}
}

// hold has the notices posted while the loop takes a datagram queue,
// for flush to send packed once it is done: a contribution whose sum
// completes on the loop has the member told of the result (publish) and
// of its chunk freed in one datagram, one wake-up, not two. It reports
// whether it held them: not while another goroutine sends (which then
// takes what queues) or once closed.
func (l *localAgg) hold() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sending || l.closed {
		return false
	}
	l.sending = true
	return true
}

// flush sends, packed, what was posted while the loop held the notices,
// as far as it can without waiting (as post does), and leaves the rest,
// in order, to writer. Only after hold reported true.
func (l *localAgg) flush() {
	l.mu.Lock()
	out := l.outbox
	l.outbox = l.held[:0]
	l.mu.Unlock()
	l.direct = packNotices(l.direct, out)
	sent := 0
	for _, d := range l.direct {
		if !l.sendNow(d) {
			break
		}
		sent++
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sending = false
	l.datagrams += sent
	l.held = out[:0] // out's notices are sent, or copied into rest below
	if sent < len(l.direct) {
		// Each member's notices fill its datagrams in order, so those
		// sent are a prefix of its own: the rest go back ahead of any
		// posted since.
		sentTo := make([]int, len(l.addrs)) // by member, its notices sent
		for _, d := range l.direct[:sent] {
			sentTo[d.to] += len(d.b) / noticeLen
		}
		rest := make([]outNotice, 0, len(out)+len(l.outbox))
		for _, n := range out {
			if sentTo[n.to] > 0 {
				sentTo[n.to]--
				continue
			}
			rest = append(rest, n)
		}
		l.outbox = append(rest, l.outbox...)
	}
	if len(l.outbox) > 0 || l.closed {
		l.outReady.Broadcast()
	}
}

// read is the leader's: member m copied out the result in chunk. Once
// every member has, the chunk is free, or holds the first result waiting
// for one, which read returns for the caller to fill in.
func (l *localAgg) read(m, chunk int) (*waitingResult, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.readers[chunk]
	if !ok {
		return nil, fmt.Errorf("local aggregation: %s read a result not published", l.group.Workers[m])
	}
	if !r.init && !r.hostSum {
		if _, err := l.core.Read(l.group.Workers[m], r.slot); err != nil {
			return nil, err
		}
	}
	if r.left--; r.left > 0 {
		l.readers[chunk] = r
		return nil, nil
	}
	delete(l.readers, chunk)
	if len(l.waiting) == 0 {
		l.free = append(l.free, chunk)
		return nil, nil
	}
	next := l.waiting[0]
	l.waiting[0] = waitingResult{}
	l.waiting = l.waiting[1:]
	l.readers[chunk] = next.readers
	return &next, nil
}

// handleAll takes a datagram's notices, in order.
func (l *localAgg) handleAll(b []byte) error {
	ns, err := splitNotices(b)
	if err != nil {
		return err
	}
	for _, n := range ns {
		if err := l.handle(n); err != nil {
			return err
		}
	}
	return nil
}

// handle takes one notice.
func (l *localAgg) handle(b []byte) error {
	if len(b) != noticeLen {
		return fmt.Errorf("local aggregation: a %d-byte notice", len(b))
	}
	kind, m, chunk := b[0], int(binary.LittleEndian.Uint16(b[1:])), int(binary.LittleEndian.Uint32(b[3:]))
	if m >= len(l.group.Workers) || chunk >= localChunks {
		return fmt.Errorf("local aggregation: a notice from member %d about chunk %d", m, chunk)
	}
	var h *frame.Header
	if kind != noticeConsumed && kind != noticeHello {
		hh, err := frame.Decode(b[7:], uint64(len(l.seg.HostSum(0))))
		if err != nil {
			return fmt.Errorf("local aggregation: %w", err)
		}
		h = &hh
	}
	switch {
	case l.idx == 0 && kind == noticeContrib && m > 0:
		if int(h.Length) > len(l.seg.Contribution(m, chunk)) {
			return fmt.Errorf("local aggregation: %s from %s does not fit a slot", h, l.group.Workers[m])
		}
		if err := l.arrive(m, h, l.seg.Contribution(m, chunk)[:h.Length]); err != nil {
			return err
		}
		return l.notify(m, noticeConsumed, chunk, nil)
	case l.idx == 0 && kind == noticeRead && m > 0:
		next, err := l.read(m, chunk)
		if err != nil || next == nil {
			return err
		}
		return l.fill(chunk, &next.h, next.data)
	case l.idx > 0 && kind == noticeConsumed && m == 0:
		l.mu.Lock()
		l.free = append(l.free, chunk)
		l.cond.Broadcast()
		l.mu.Unlock()
		return nil
	case l.idx > 0 && kind == noticeResult && m == 0:
		if int(h.Length) > len(l.seg.HostSum(chunk)) {
			return fmt.Errorf("local aggregation: result %s does not fit a slot", h)
		}
		l.deliver(h, l.seg.HostSum(chunk)[:h.Length])
		return l.notify(0, noticeRead, chunk, h)
	case l.idx > 0 && kind == noticeHostSum && m == 0:
		if int(h.Length) > len(l.seg.HostSum(chunk)) || h.Type != frame.Push || h.Flags&frame.FlagHostSum == 0 || node.ID(h.Recipient) != l.self {
			return fmt.Errorf("local aggregation: host sum %s does not fit a slot or is not this worker's", h)
		}
		l.addShared(h, chunk)
		return nil
	case kind == noticeHello:
		return nil // a member's, after the leader stopped counting
	}
	return fmt.Errorf("local aggregation: notice %d from member %d unexpected here", kind, m)
}

// stop marks the side closed and wakes its waits (close does the rest).
func (l *localAgg) stop() {
	l.mu.Lock()
	l.closed = true
	l.cond.Broadcast()
	l.outReady.Broadcast()
	l.mu.Unlock()
}

// close ends this worker's side: its socket, its mapping (the leader's
// removes the segment's name if still there).
func (l *localAgg) close() {
	if l == nil {
		return
	}
	l.closeOnce.Do(l.closeNow)
}

func (l *localAgg) closeNow() {
	l.mu.Lock()
	l.closed = true
	l.cond.Broadcast()
	l.outReady.Broadcast()
	conn, pending := l.conn, l.pending
	l.pending = nil
	l.mu.Unlock()
	if conn != nil {
		conn.Close()
	}
	// Pushes that waited for a group never formed: dropped, as those of
	// a dissolved group are (the retry that ended it sends them again).
	for i := range pending {
		if pending[i].Done != nil {
			pending[i].Done(nil)
		}
	}
	// No one touches the segment once they are out (a pending socket
	// call ends with the socket, a wait for a chunk or for room in a
	// member's queue with closed).
	l.busy.Wait()
	l.socks.Wait()
	if l.idx == 0 && l.core != nil {
		l.log.Info("local aggregation: group closed", "host", l.group.Host, "group", l.group.Workers, "from_iteration", l.from, "host_sums", l.hostSums, "notice_datagrams", l.datagrams, "notice_sends_full", l.sendFull, "notices_dropped_retired", l.retiredDrops)
	}
	l.unmapSegment()
}
