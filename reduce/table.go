package reduce

import (
	"errors"
	"fmt"
	"slices"

	"github.com/fptps/fpt/frame"
)

// PartID names one partition of one tensor in one iteration: the unit an
// aggregator sums.
type PartID struct {
	Key       uint64
	Partition uint32
	Iteration uint64
	// Version is the LB decision the partition was cut under: after a
	// retry (a lost server) the same iteration is cut again under a newer
	// one, and the two rounds must never mix.
	Version uint32
}

// Contribution is one worker's value for one partition.
type Contribution struct {
	PartID
	// Workers is how many workers' contributions make up the round (> 0):
	// the job's workers in that iteration, which may change while it runs
	// (a worker lost or joining). Every contribution to a round says the
	// same.
	Workers int
	// Worker is the contributor's index among them, 0..Workers-1.
	Worker int
	// Also are the indexes of the other workers whose values Data holds
	// summed with Worker's: a host's sum (package localagg). Each counts
	// as contributed.
	Also          []int
	DType         frame.DType // element type of Data
	Offset, Total uint64      // where this partition sits in its tensor (bytes)
	// Init marks the key's init round: only worker 0 (the first of the
	// iteration's workers) contributes and its value is the result
	// (ps-lite/MXNet init semantics).
	Init bool
	Data []byte // only read during Table.Add; never retained, unless Adopt
	// Adopt says that Data was handed out by the table's Buffer: the table
	// takes it back, as the partition's sum buffer when c opens the round
	// (saving a copy: the van read the payload straight into it) and to its
	// free list otherwise, or on error.
	Adopt bool
}

// Sum is a completed partition, ready to broadcast to every worker.
type Sum struct {
	PartID
	DType         frame.DType
	Offset, Total uint64
	// Data is owned by the Table: it stays valid until the Sum is passed to
	// Release, after which neither the Sum nor Data may be used.
	Data []byte

	slot *slot // the bookkeeping record this Sum belongs to
}

// Errors returned by Table.Add, wrapped with the partition and worker they
// concern; test with errors.Is.
var (
	ErrWorker    = errors.New("aggregator: worker index out of range")
	ErrDuplicate = errors.New("aggregator: duplicate contribution")
	ErrMismatch  = errors.New("aggregator: contribution does not match the partition's first")
	ErrInit      = errors.New("aggregator: bad init contribution")
	ErrData      = errors.New("aggregator: malformed contribution")
)

// slot is the record of one partition being aggregated (or of one Sum handed
// out and not yet released). Slots are recycled.
type slot struct {
	sum     Sum
	owner   *Table
	workers int      // contributions the round needs
	seen    []uint64 // bitset of worker indexes that have contributed
	count   int      // number of bits set in seen
	// acc is the float32 running sum of a 16-bit round of more than two
	// workers, rounded once into sum.Data when the last contribution is in
	// (adding in 16 bits would round at every contribution). Kept with
	// the slot when it is recycled, so a steady loop allocates nothing.
	acc     []float32
	widened bool // acc holds the round's sum so far
}

// Table aggregates contributions partition by partition; each round needs
// as many contributions as its contributions' Workers says, so rounds of
// different worker counts (before and after a worker left) may be pending
// side by side. The zero value is not usable: call NewTable. A Table is not
// safe for concurrent use.
//
// Memory: each partition's sum lives in one buffer, filled by copying the
// first contribution and adding the others into it. Released buffers are
// kept on a free list per exact size and reused, so a training loop that
// aggregates the same partitions every iteration allocates nothing once
// warm. The idle buffers are bounded: when a buffer of a size with no idle
// buffer is needed, idle buffers of other sizes are dropped to make room, so
// the Table never holds more buffer bytes (in use plus idle) than the most it
// has ever had in use at once. A layout change therefore does not strand the
// old sizes' buffers. Trim drops every idle buffer.
type Table struct {
	pending      map[PartID]*slot
	pendingBytes int64

	free      map[int][][]byte // idle buffers by exact length
	idleBytes int64
	slots     []*slot // idle slots
}

// NewTable returns an empty table.
func NewTable() *Table {
	return &Table{
		pending: make(map[PartID]*slot),
		free:    make(map[int][][]byte),
	}
}

// Add records contribution c. It returns the completed Sum when c is the
// last contribution the partition was waiting for (the c.Workers-th of a
// normal round, or worker 0's value in an init round), and nil otherwise. Once a
// Sum is returned the Table forgets its PartID: the same PartID may start a
// new round. The Sum must be passed to Release when the caller is done with
// it.
//
// c.Data is copied or added into the table's buffer; it is not retained
// (unless adopted: see Contribution.Adopt). On error the table is unchanged,
// but for taking back an adopted buffer. Errors: the worker index is out of
// range of c.Workers (ErrWorker); the dtype is unknown or Data, Offset and
// Total disagree with it or with each other (ErrData); Workers, DType,
// Offset, Total or len(Data) differ from the partition's first contribution
// (ErrMismatch); the worker already contributed to this PartID
// (ErrDuplicate); an init contribution comes
// from a worker other than 0 or for a partition that has normal
// contributions pending (ErrInit). A normal contribution that follows an
// init round for the same PartID cannot be told from a new round: it starts
// one.
func (t *Table) Add(c Contribution) (*Sum, error) {
	if err := t.check(c); err != nil {
		if c.Adopt {
			t.recycle(c.Data)
		}
		return nil, fmt.Errorf("key %d partition %d iteration %d worker %d: %w",
			c.Key, c.Partition, c.Iteration, c.Worker, err)
	}
	if c.Init {
		return &t.start(c).sum, nil
	}
	s := t.pending[c.PartID]
	if s == nil {
		s = t.start(c)
		if s.count == s.workers {
			return &s.sum, nil // a single-worker job
		}
		t.pending[c.PartID] = s
		t.pendingBytes += int64(len(s.sum.Data))
		return nil, nil
	}
	// check has validated dtype and lengths: Add cannot fail here.
	if s.workers > 2 && isHalf(c.DType) {
		s.accumulate(c.Data)
	} else {
		_ = Add(c.DType, s.sum.Data, c.Data)
	}
	if c.Adopt {
		t.recycle(c.Data)
	}
	s.mark(c)
	if s.count < s.workers {
		return nil, nil
	}
	if s.widened {
		narrow(s.sum.DType, s.sum.Data, s.acc)
		s.widened = false
	}
	delete(t.pending, c.PartID)
	t.pendingBytes -= int64(len(s.sum.Data))
	return &s.sum, nil
}

// accumulate adds 16-bit contribution data into the slot's float32 sum,
// widening the first contribution (in sum.Data) into it first.
func (s *slot) accumulate(data []byte) {
	n := len(data) / 2
	if !s.widened {
		if cap(s.acc) < n {
			s.acc = make([]float32, n)
		}
		s.acc = s.acc[:n]
		widenInto(s.sum.DType, s.acc, s.sum.Data)
		s.widened = true
	}
	addWidened(s.sum.DType, s.acc, data)
}

// check validates c against the table without changing anything. The
// returned error is not yet wrapped with c's identity.
func (t *Table) check(c Contribution) error {
	if c.Worker < 0 || c.Worker >= c.Workers {
		return fmt.Errorf("%w: index %d of %d workers", ErrWorker, c.Worker, c.Workers)
	}
	for i, w := range c.Also {
		if w < 0 || w >= c.Workers || w == c.Worker || slices.Contains(c.Also[:i], w) {
			return fmt.Errorf("%w: index %d of %d workers, also for %d", ErrWorker, w, c.Workers, c.Worker)
		}
	}
	if c.Init && len(c.Also) > 0 {
		return fmt.Errorf("%w: a sum of several workers", ErrInit)
	}
	es := c.DType.Size()
	if es == 0 {
		return fmt.Errorf("%w: unknown dtype %s", ErrData, c.DType)
	}
	n := uint64(len(c.Data))
	if n%uint64(es) != 0 || c.Offset%uint64(es) != 0 || c.Total%uint64(es) != 0 {
		return fmt.Errorf("%w: offset %d, length %d or total %d not a multiple of %s's %d bytes",
			ErrData, c.Offset, n, c.Total, c.DType, es)
	}
	if c.Offset > c.Total || n > c.Total-c.Offset {
		return fmt.Errorf("%w: [%d, +%d) outside a tensor of %d bytes", ErrData, c.Offset, n, c.Total)
	}
	s := t.pending[c.PartID]
	if c.Init {
		if c.Worker != 0 {
			return fmt.Errorf("%w: only worker 0 contributes to an init round", ErrInit)
		}
		if s != nil {
			return fmt.Errorf("%w: %d normal contributions already pending", ErrInit, s.count)
		}
		return nil
	}
	if s == nil {
		return nil
	}
	if c.Workers != s.workers {
		// Before the duplicate test: seen is sized for s.workers.
		return fmt.Errorf("%w: a round of %d workers, first was of %d", ErrMismatch, c.Workers, s.workers)
	}
	if s.seen[c.Worker/64]&(1<<(c.Worker%64)) != 0 {
		return ErrDuplicate
	}
	for _, w := range c.Also {
		if s.seen[w/64]&(1<<(w%64)) != 0 {
			return fmt.Errorf("%w: worker %d, in a host's sum", ErrDuplicate, w)
		}
	}
	f := &s.sum
	if c.DType != f.DType || c.Offset != f.Offset || c.Total != f.Total || len(c.Data) != len(f.Data) {
		return fmt.Errorf("%w: %s [%d, +%d) of %d bytes, first was %s [%d, +%d) of %d bytes", ErrMismatch,
			c.DType, c.Offset, len(c.Data), c.Total, f.DType, f.Offset, len(f.Data), f.Total)
	}
	return nil
}

// start opens a round with c as its first contribution: a slot whose buffer
// holds a copy of c.Data.
func (t *Table) start(c Contribution) *slot {
	s := t.newSlot(c.Workers)
	buf := c.Data
	if !c.Adopt {
		buf = t.buffer(len(c.Data))
		copy(buf, c.Data)
	}
	s.sum = Sum{
		PartID: c.PartID,
		DType:  c.DType,
		Offset: c.Offset,
		Total:  c.Total,
		Data:   buf,
		slot:   s,
	}
	s.count = 0
	s.mark(c)
	s.widened = false
	return s
}

// mark counts c's workers as contributed to s.
func (s *slot) mark(c Contribution) {
	s.seen[c.Worker/64] |= 1 << (c.Worker % 64)
	for _, w := range c.Also {
		s.seen[w/64] |= 1 << (w % 64)
	}
	s.count += 1 + len(c.Also)
}

// newSlot returns an idle slot, or a new one, for a round of the given
// number of workers, its bitset clear.
func (t *Table) newSlot(workers int) *slot {
	words := (workers + 63) / 64
	var s *slot
	if n := len(t.slots); n > 0 {
		s = t.slots[n-1]
		t.slots[n-1] = nil
		t.slots = t.slots[:n-1]
	} else {
		s = &slot{owner: t}
	}
	if cap(s.seen) < words {
		s.seen = make([]uint64, words)
	} else {
		s.seen = s.seen[:words]
		clear(s.seen)
	}
	s.workers = workers
	return s
}

// Buffer hands out a buffer of exactly n bytes (idle or new, contents
// arbitrary) for a contribution to be received into and then given to Add
// with Adopt set, which takes it back whatever happens.
func (t *Table) Buffer(n int) []byte { return t.buffer(n) }

// Recycle takes back a buffer handed out by Buffer that will not be given
// to Add (its contribution turned out to be stale).
func (t *Table) Recycle(buf []byte) { t.recycle(buf) }

// recycle puts a buffer on the free list.
func (t *Table) recycle(buf []byte) {
	t.free[len(buf)] = append(t.free[len(buf)], buf)
	t.idleBytes += int64(len(buf))
}

// buffer returns a buffer of exactly n bytes, idle or new. Its contents are
// arbitrary.
func (t *Table) buffer(n int) []byte {
	if l := t.free[n]; len(l) > 0 {
		b := l[len(l)-1]
		l[len(l)-1] = nil
		t.free[n] = l[:len(l)-1]
		t.idleBytes -= int64(n)
		return b
	}
	// A miss: the idle buffers are of other sizes. Drop at least n bytes
	// of them (or all), so that total memory only grows when what is in
	// use grows.
	need := int64(n)
	for size, l := range t.free {
		if need <= 0 || t.idleBytes == 0 {
			break
		}
		for len(l) > 0 && need > 0 {
			l[len(l)-1] = nil
			l = l[:len(l)-1]
			t.idleBytes -= int64(size)
			need -= int64(size)
		}
		if len(l) == 0 {
			delete(t.free, size)
		} else {
			t.free[size] = l
		}
	}
	return make([]byte, n)
}

// Release hands a Sum returned by Add back to the table, which reuses its
// buffer. The Sum and its Data must not be used afterwards. Releasing nil, a
// Sum not obtained from this table's Add, or a Sum already released does
// nothing. (A Sum released twice after its record was reused for a later
// round cannot be recognised: release each Sum exactly once.)
func (t *Table) Release(s *Sum) {
	if s == nil || s.slot == nil || s.slot.owner != t || &s.slot.sum != s || s.Data == nil {
		return
	}
	sl := s.slot
	if t.pending[s.PartID] == sl {
		return // still being aggregated: not the caller's to release
	}
	buf := s.Data
	*s = Sum{slot: sl}
	t.recycle(buf)
	t.slots = append(t.slots, sl)
}

// DropStale forgets the partitions being aggregated that a retry
// superseded: those of iteration from or later cut under a version older
// than version. Their buffers return to the free list; it returns how many
// were dropped. Sums already handed out are not affected.
func (t *Table) DropStale(version uint32, from uint64) int {
	n := 0
	for id, s := range t.pending {
		if id.Iteration < from || id.Version >= version {
			continue
		}
		delete(t.pending, id)
		t.pendingBytes -= int64(len(s.sum.Data))
		t.recycle(s.sum.Data)
		s.sum = Sum{slot: s}
		t.slots = append(t.slots, s)
		n++
	}
	return n
}

// Pending returns the number of partitions that have some but not all of
// their contributions.
func (t *Table) Pending() int { return len(t.pending) }

// PendingBytes returns the size of the buffers of the pending partitions.
func (t *Table) PendingBytes() int64 { return t.pendingBytes }

// Trim drops every idle buffer and record (float32 accumulators included), returning the memory to the
// garbage collector; the table allocates afresh as it warms up again.
// Useful after a layout change or when training ends.
func (t *Table) Trim() {
	clear(t.free)
	t.idleBytes = 0
	clear(t.slots)
	t.slots = t.slots[:0]
}
