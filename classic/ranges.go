package classic

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/kvstore"
	"github.com/fptps/fpt/node"
)

// Verdict is what a server does with a classic request.
type Verdict int

// Verdicts.
const (
	// Serve: the key is this server's, and its value is here.
	Serve Verdict = iota
	// Hold: the request was sent under a layout this server has not
	// applied yet, or its key is one this server gains and not every
	// previous owner has handed its keys over yet.
	Hold
	// Moved: the key is another server's; answer with the owner.
	Moved
)

// Held is a request kept until Ranges releases it; Payload is a copy.
type Held struct {
	Header  frame.Header
	Payload []byte
}

// Todo is what the shell does after a change of Ranges, outside its
// lock: send the frames (KVMove, KVMoveEnd), then route the released
// requests again, in order.
type Todo struct {
	Sends    []frame.Message
	Released []Held
	// Applied are the layouts this change applied, with the keys each
	// took out of the store and kept: the shell logs them, and knows the
	// store changed.
	Applied []Applied
	// Dropped counts the keys taken out because the server moving them
	// was lost before it had sent them whole.
	Dropped int
}

// Applied is a layout applied, and what it did to the store.
type Applied struct {
	Layout         Layout
	MovedOut, Kept int
}

// moveCount is what one server sent this one for one layout version.
type moveCount struct {
	got   uint32 // KVMove frames received
	want  uint32 // the KVMoveEnd's count
	ended bool
	keys  map[uint64]bool // the keys they added to
}

func (c *moveCount) complete() bool { return c.ended && c.got == c.want }

// Ranges is a server's classic key ranges across layout changes. Layouts
// are applied one at a time, in version order: the next waits until every
// server of the one before and this one has handed over the keys this
// server gains, so that a key is only ever handed over complete.
type Ranges struct {
	self      node.ID
	partBytes uint64
	cur       Layout
	prev      Layout    // the layout before cur, while cur is settling
	settling  bool      // a server of prev has not handed its keys over yet
	expect    []node.ID // those servers
	moves     map[uint32]map[node.ID]*moveCount
	queue     []Layout // later layouts offered, in version order
	lost      map[node.ID]bool
	held      []Held
	// early are keys moved here for a layout not applied yet, by its
	// version: applying an earlier one must not send them away (they
	// come from a server further on, over a data connection that the
	// scheduler's Layout messages do not wait for).
	early map[uint64]uint32
}

// NewRanges is server self's ranges, starting from layout l (the job's
// first, or a joining server's table's, which does not name it yet).
// KVMove frames are cut at partBytes, as pushes are.
func NewRanges(self node.ID, l Layout, partBytes uint64) *Ranges {
	return &Ranges{self: self, cur: l, partBytes: partBytes, moves: make(map[uint32]map[node.ID]*moveCount), lost: make(map[node.ID]bool), early: make(map[uint64]uint32)}
}

// Layout is the layout applied last.
func (r *Ranges) Layout() Layout { return r.cur }

// Settling reports whether keys this server gains in the current layout
// are still on their way.
func (r *Ranges) Settling() bool { return r.settling }

// Stable reports whether the store holds this server's keys of the
// current layout and no others: no change settles or is queued, and no
// key came early for a later layout. Only then is it checkpointed.
func (r *Ranges) Stable() bool { return !r.settling && len(r.queue) == 0 && len(r.early) == 0 }

// Route says what to do with classic request h, sent under layout version
// h.Iteration; for Moved, owner is the key's server in the current layout
// (none for a range pull). A range pull (KVPullRange) covers every key of
// this server's range, so it is served only under that very layout, once
// settled: under an older one the worker asks again under a newer one.
func (r *Ranges) Route(h *frame.Header) (v Verdict, owner node.ID) {
	switch v := h.Iteration; {
	case v > uint64(r.cur.Version):
		return Hold, 0
	case h.Type == frame.KVPullRange && v < uint64(r.cur.Version):
		return Moved, 0
	case h.Type == frame.KVPullRange:
		if r.settling {
			return Hold, 0
		}
		return Serve, 0
	}
	if o := r.cur.Owner(h.Key); o != r.self {
		return Moved, o
	}
	if r.settling && r.prev.Owner(h.Key) != r.self {
		return Hold, 0
	}
	return Serve, 0
}

// Awaits reports whether the layout change settling here waits for
// server id's keys: it is expected, not lost, and has not sent them all.
func (r *Ranges) Awaits(id node.ID) bool {
	if !r.settling || r.lost[id] || !slices.Contains(r.expect, id) {
		return false
	}
	c := r.moves[r.cur.Version][id]
	return c == nil || !c.complete()
}

// Span is the part of [from, to) this server owns in the current layout
// (to == 0: no upper bound, for both); ok is false when it owns none of
// it.
func (r *Ranges) Span(from, to uint64) (lo, hi uint64, ok bool) {
	return r.cur.Span(r.self, from, to)
}

// Hold keeps a request Route said to hold; payload is copied.
func (r *Ranges) Hold(h *frame.Header, payload []byte) {
	r.held = append(r.held, Held{Header: *h, Payload: append([]byte(nil), payload...)})
}

// Offer takes layout l from the scheduler: applied at once if no change
// is settling, else queued. A version already applied or queued is
// ignored.
func (r *Ranges) Offer(store *kvstore.Store, l Layout) Todo {
	if l.Version <= r.cur.Version || slices.ContainsFunc(r.queue, func(q Layout) bool { return q.Version == l.Version }) {
		return Todo{}
	}
	r.queue = append(r.queue, l)
	slices.SortFunc(r.queue, func(a, b Layout) int { return cmp.Compare(a.Version, b.Version) })
	return r.advance(store)
}

// Move adds a KVMove frame's chunk into the store: a key this server owns
// from layout h.Iteration on. A frame that does not fit the store's value
// of its key is an error (a bug or a forged frame: the value would be
// wrong).
func (r *Ranges) Move(store *kvstore.Store, h *frame.Header, payload []byte) (Todo, error) {
	v, from := uint32(h.Iteration), node.ID(h.Sender)
	switch l, known := r.layoutOf(v); {
	case r.lost[from]:
		return Todo{}, nil // its keys were given up when it was lost
	case v < r.cur.Version:
		return Todo{}, fmt.Errorf("classic: %s moved key %d in layout v%d, which settled before", from, h.Key, v)
	case known && l.Owner(h.Key) != r.self:
		return Todo{}, fmt.Errorf("classic: %s moved key %d here in layout v%d, which does not give it to %s", from, h.Key, v, r.self)
	}
	if _, err := store.Add(h.Key, h.DType, h.Offset, payload, h.Total); err != nil {
		return Todo{}, fmt.Errorf("classic: moved key: %w", err)
	}
	if v := uint32(h.Iteration); v > r.cur.Version {
		r.early[h.Key] = max(r.early[h.Key], v)
	}
	c := r.count(uint32(h.Iteration), node.ID(h.Sender))
	c.got++
	c.keys[h.Key] = true
	if c.ended && c.got > c.want {
		return Todo{}, fmt.Errorf("classic: more than the %d moved chunks %s announced for layout v%d", c.want, node.ID(h.Sender), h.Iteration)
	}
	return r.advance(store), nil
}

// MoveEnd takes a KVMoveEnd frame: its sender has sent all it moves here
// in layout h.Iteration.
func (r *Ranges) MoveEnd(store *kvstore.Store, h *frame.Header) (Todo, error) {
	c := r.count(uint32(h.Iteration), node.ID(h.Sender))
	if c.ended {
		return Todo{}, fmt.Errorf("classic: a second end of the keys %s moved in layout v%d", node.ID(h.Sender), h.Iteration)
	}
	c.ended, c.want = true, h.Aux
	if c.got > c.want {
		return Todo{}, fmt.Errorf("classic: %s moved %d chunks in layout v%d, its end says %d", node.ID(h.Sender), c.got, h.Iteration, c.want)
	}
	return r.advance(store), nil
}

// Lost takes a server's loss: its keys will not come (they are lost with
// it; the scheduler's next layout gives its range to others).
// Keys it had begun to send and not ended are taken out: a part of a
// value must not be served as the whole.
func (r *Ranges) Lost(store *kvstore.Store, id node.ID) Todo {
	r.lost[id] = true
	dropped := 0
	for _, m := range r.moves {
		if c := m[id]; c != nil && !c.complete() {
			for key := range c.keys {
				store.Delete(key)
				dropped++
			}
			c.keys = nil
		}
	}
	t := r.advance(store)
	t.Dropped = dropped
	return t
}

// layoutOf is layout version v if it is the current one or queued.
func (r *Ranges) layoutOf(v uint32) (Layout, bool) {
	if v == r.cur.Version {
		return r.cur, true
	}
	i := slices.IndexFunc(r.queue, func(l Layout) bool { return l.Version == v })
	if i < 0 {
		return Layout{}, false
	}
	return r.queue[i], true
}

func (r *Ranges) count(version uint32, from node.ID) *moveCount {
	m := r.moves[version]
	if m == nil {
		m = make(map[node.ID]*moveCount)
		r.moves[version] = m
	}
	c := m[from]
	if c == nil {
		c = &moveCount{keys: make(map[uint64]bool)}
		m[from] = c
	}
	return c
}

// advance ends a settling change once every expected server's keys are
// in, then applies queued layouts while none settles, and releases the
// held requests whenever something changed.
func (r *Ranges) advance(store *kvstore.Store) Todo {
	var t Todo
	changed := false
	for {
		if r.settling {
			if !r.settled() {
				break
			}
			r.settling, r.expect = false, nil
			delete(r.moves, r.cur.Version)
			changed = true
		}
		if len(r.queue) == 0 {
			break
		}
		l := r.queue[0]
		r.queue = r.queue[1:]
		before := store.Len()
		if msgs := r.apply(store, l); t.Sends == nil && len(msgs) > 0 {
			t.Sends = msgs // most often the only layout: no copy
		} else {
			t.Sends = append(t.Sends, msgs...)
		}
		t.Applied = append(t.Applied, Applied{Layout: l, MovedOut: before - store.Len(), Kept: store.Len()})
		changed = true
	}
	if changed {
		t.Released, r.held = r.held, nil
	}
	return t
}

func (r *Ranges) settled() bool {
	m := r.moves[r.cur.Version]
	for _, id := range r.expect {
		if r.lost[id] {
			continue
		}
		if c := m[id]; c == nil || !c.complete() {
			return false
		}
	}
	return true
}

// apply makes l current: every key this server holds and l gives to
// another server is taken out of the store and sent to it, and every
// other server of l hears how many chunks came from here. The keys this
// server gains are held until the servers of both layouts have sent
// theirs.
func (r *Ranges) apply(store *kvstore.Store, l Layout) []frame.Message {
	from, to, mine := l.Range(r.self)
	var keep func(key uint64) bool
	if len(r.early) > 0 {
		keep = func(key uint64) bool { return r.early[key] > l.Version }
	}
	// Every key outside this server's range leaves: the ranges below and
	// above it, taken off the ends of the store.
	var low, high []kvstore.Item
	if !mine {
		low = store.TakeRange(0, 0, keep)
	} else {
		if from > 0 {
			low = store.TakeRange(0, from, keep)
		}
		if to != 0 {
			high = store.TakeRange(to, 0, keep)
		}
	}
	sent := make(map[node.ID]uint32)
	msgs := make([]frame.Message, 0, len(low)+len(high)+len(l.Servers))
	for _, out := range [2][]kvstore.Item{low, high} {
		for _, m := range out {
			dst := l.Owner(m.Key)
			base := frame.Header{
				Type: frame.KVMove, DType: m.DType, Sender: uint32(r.self), Recipient: uint32(dst),
				Key: m.Key, Iteration: uint64(l.Version), Total: uint64(len(m.Data)),
			}
			for part, ch := range frame.Chunks(uint64(len(m.Data)), r.partBytes, m.DType.Size()) {
				msg := frame.Message{Header: base, Payload: m.Data[ch[0]:ch[1]]}
				msg.Header.Offset, msg.Header.Partition = ch[0], part
				msgs = append(msgs, msg)
				sent[dst]++
			}
		}
	}
	for _, id := range l.Servers {
		if id != r.self {
			msgs = append(msgs, frame.Message{Header: frame.Header{
				Type: frame.KVMoveEnd, Sender: uint32(r.self), Recipient: uint32(id), Iteration: uint64(l.Version), Aux: sent[id],
			}})
		}
	}
	r.prev, r.cur = r.cur, l
	r.expect = nil
	for _, id := range r.prev.Servers {
		// A server outside l gains nothing, and hears no end: the others
		// send theirs to l's servers only. A server of prev that l leaves
		// out is waited for unless it is lost: one that leaves in order
		// hands everything over.
		if mine && id != r.self {
			r.expect = append(r.expect, id)
		}
	}
	for key, v := range r.early {
		if v <= l.Version {
			delete(r.early, key)
		}
	}
	r.settling = true // settled at once when nobody is expected
	for v := range r.moves {
		if v < l.Version {
			delete(r.moves, v)
		}
	}
	return msgs
}
