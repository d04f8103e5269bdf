// Package pool is FPT's send pool: the one buffer every outgoing data frame
// of a node goes through before the van's single sender writes it.
//
// A Pool holds entries grouped into flows; a flow is a destination node.
// Pop picks the next entry to send:
//
//   - Within a flow, the entry with the highest Priority goes first (a
//     lower layer is needed sooner by the next forward pass); entries of
//     equal priority leave in the order they were pushed (FIFO, by a
//     sequence number).
//   - Across flows, bytes are shared by deficit round robin (Shreedhar and
//     Varghese). Every flow with queued entries and a weight above zero is
//     on an active list. When a flow's turn comes it is granted a quantum of
//     BaseQuantum × weight bytes of credit (its deficit); it sends head
//     entries while the head fits in the deficit, then the turn passes to
//     the next flow. An entry larger than the deficit waits while the flow
//     accumulates credit over rounds, so any size is eventually sent. A
//     flow that empties leaves the active list and loses its deficit, so
//     idle time is never banked. In the long run each backlogged flow gets
//     a share of bytes proportional to its weight.
//   - Weights (1 by default) may change at any time; the new quantum
//     applies from the flow's next turn. A weight of 0 pauses the flow: its
//     entries stay queued and are not popped until the weight is raised
//     again. Negative or NaN weights count as 0, and weights are capped at
//     MaxWeight so that a quantum always fits in an int64.
//   - Shaping can be switched off (SetShaping): every flow is then served
//     as if its weight were 1, paused flows included, while the weights set
//     are remembered for when it is switched on again. The LB switches it
//     off to measure what each link can carry unshaped.
//
// The pool is bounded in bytes by its owner, not by itself: Admit says
// whether an entry fits under the limit, and Push never refuses, because
// some producers (the van's Forward path) must not block and are bounded by
// what the node received instead. An entry larger than the whole limit is
// admitted when the pool is empty, so a huge tensor never deadlocks.
//
// A Pool is a pure data structure: no goroutines, no locks, no I/O. The van
// wraps it with a mutex and condition variables.
package pool

import (
	"maps"
	"math"
	"slices"
)

// BaseQuantum is the credit, in bytes, a flow of weight 1 receives per turn.
// 64 KiB keeps turns short for small frames while large frames still move in
// few rounds (see Pop: rounds in which nobody can send are skipped in one
// step).
const BaseQuantum = 64 << 10

// MaxWeight caps a flow's weight; larger values are clamped.
const MaxWeight = 1 << 20

// Entry is one queued item: Bytes counts against the pool's limit and the
// flow's deficit; Value is carried untouched.
type Entry[T any] struct {
	Flow     uint32
	Priority int32
	Bytes    int64
	Value    T
}

// item is an entry with its arrival number, for FIFO among equal priorities.
type item[T any] struct {
	e   Entry[T]
	seq uint64
}

// flow is one destination's queue and scheduling state.
type flow[T any] struct {
	id      uint32
	heap    []item[T] // max-heap by (Priority desc, seq asc)
	weight  float64
	deficit int64
	granted bool // the flow has received its quantum for the current turn
	active  bool // on the active list
}

// Pool is a weighted, priority-aware send buffer. The zero value is not
// usable; call New.
type Pool[T any] struct {
	limit int64
	bytes int64
	n     int
	seq   uint64
	flows map[uint32]*flow[T]
	// ring is the active list; cur is the flow whose turn it is. A flow
	// joining is inserted just before cur, i.e. at the tail of the round.
	ring []*flow[T]
	cur  int
	// unshaped: every flow is served at weight 1 (SetShaping(false)).
	unshaped bool
}

// New returns an empty pool whose owner intends to hold at most limitBytes.
func New[T any](limitBytes int64) *Pool[T] {
	return &Pool[T]{limit: limitBytes, flows: make(map[uint32]*flow[T])}
}

// Admit reports whether an entry of n bytes fits under the limit now. An
// entry larger than the whole limit fits when the pool is empty.
func (p *Pool[T]) Admit(n int64) bool {
	return p.n == 0 || p.bytes+n <= p.limit
}

// Limit is the byte limit the pool was created with.
func (p *Pool[T]) Limit() int64 { return p.limit }

// Bytes is the sum of Bytes over queued entries.
func (p *Pool[T]) Bytes() int64 { return p.bytes }

// Len is the number of queued entries.
func (p *Pool[T]) Len() int { return p.n }

func (p *Pool[T]) flow(id uint32) *flow[T] {
	f := p.flows[id]
	if f == nil {
		f = &flow[T]{id: id, weight: 1}
		p.flows[id] = f
	}
	return f
}

// Push queues e. It never refuses: the caller has decided with Admit, or
// deliberately goes over the limit.
func (p *Pool[T]) Push(e Entry[T]) {
	f := p.flow(e.Flow)
	p.seq++
	f.push(item[T]{e: e, seq: p.seq})
	p.bytes += e.Bytes
	p.n++
	if !f.active && p.weightOf(f) > 0 {
		p.activate(f)
	}
}

// weightOf is the weight f is served at now.
func (p *Pool[T]) weightOf(f *flow[T]) float64 {
	if p.unshaped {
		return 1
	}
	return f.weight
}

// activate puts f at the tail of the current round.
func (p *Pool[T]) activate(f *flow[T]) {
	f.active = true
	f.granted = false
	f.deficit = 0
	p.ring = append(p.ring, nil)
	copy(p.ring[p.cur+1:], p.ring[p.cur:])
	p.ring[p.cur] = f
	p.cur++
	if p.cur >= len(p.ring) {
		p.cur = 0
	}
}

// deactivate takes f off the active list; it loses its deficit.
func (p *Pool[T]) deactivate(f *flow[T]) {
	for i, g := range p.ring {
		if g != f {
			continue
		}
		p.ring = append(p.ring[:i], p.ring[i+1:]...)
		if i < p.cur {
			p.cur--
		}
		if p.cur >= len(p.ring) {
			p.cur = 0
		}
		break
	}
	f.active = false
	f.granted = false
	f.deficit = 0
}

// quantum is the credit f receives per turn.
func (p *Pool[T]) quantum(f *flow[T]) int64 {
	q := int64(BaseQuantum * p.weightOf(f))
	if q < 1 {
		q = 1
	}
	return q
}

// Pop removes and returns the next entry per the schedule. It reports false
// when nothing is eligible: the pool is empty, or every non-empty flow is
// paused.
func (p *Pool[T]) Pop() (Entry[T], bool) { return p.PopIf(nil) }

// PopIf is Pop when take (nil: always) accepts the entry Pop would return;
// otherwise the entry stays queued, still the next, and PopIf reports
// false. A sender uses it to gather the entries that follow one another
// in the schedule and share a destination into one write, without
// changing their order.
func (p *Pool[T]) PopIf(take func(*Entry[T]) bool) (Entry[T], bool) {
	// The turns passed and the credit granted on the way to the next
	// entry are what the next Pop would do anyway: done here, the next
	// call finds the same flow's granted turn and the same head.
	passes := 0 // turns in a row in which nothing was sent
	for len(p.ring) > 0 {
		f := p.ring[p.cur]
		if !f.granted {
			f.granted = true
			f.deficit = addSat(f.deficit, p.quantum(f))
		}
		if head := f.heap[0].e.Bytes; head <= f.deficit {
			if take != nil && !take(&f.heap[0].e) {
				return Entry[T]{}, false
			}
			e := f.pop()
			f.deficit -= max(e.Bytes, 0)
			p.bytes -= e.Bytes
			p.n--
			if len(f.heap) == 0 {
				p.deactivate(f)
			}
			return e, true
		}
		// The head does not fit: the turn passes on, the deficit stays.
		f.granted = false
		p.cur++
		if p.cur == len(p.ring) {
			p.cur = 0
		}
		if passes++; passes == len(p.ring) {
			p.skipRounds()
			passes = 0
		}
	}
	return Entry[T]{}, false
}

// skipRounds is called after a whole round in which no flow could send (all
// heads larger than the deficits). It grants every flow the quanta of the
// rounds that would also pass idle, at once, so that a multi-gigabyte entry
// costs O(flows) work instead of O(size / quantum).
func (p *Pool[T]) skipRounds() {
	var k int64 = math.MaxInt64
	for _, f := range p.ring {
		need := f.heap[0].e.Bytes - f.deficit
		q := p.quantum(f)
		if r := (need + q - 1) / q; r < k {
			k = r
		}
	}
	// After k more grants the first flow can send; the next turn grants
	// one, so k-1 are given here.
	if k <= 1 {
		return
	}
	for _, f := range p.ring {
		f.deficit = addSat(f.deficit, mulSat(p.quantum(f), k-1))
	}
}

// SetWeight sets a flow's weight (1 by default). 0 pauses the flow; negative
// and NaN count as 0; values above MaxWeight are clamped.
func (p *Pool[T]) SetWeight(id uint32, w float64) {
	if !(w > 0) { // also catches NaN
		w = 0
	}
	w = min(w, MaxWeight)
	f := p.flow(id)
	f.weight = w
	p.reconsider(f)
}

// reconsider puts f on or takes it off the active list after its weight,
// or the shaping mode, changed.
func (p *Pool[T]) reconsider(f *flow[T]) {
	w := p.weightOf(f)
	switch {
	case w == 0 && f.active:
		p.deactivate(f)
	case w > 0 && !f.active && len(f.heap) > 0:
		p.activate(f)
	}
}

// SetShaping switches weighted shaping on (the default) or off. Off, every
// flow is served at weight 1 and paused flows are served too; the weights
// set stay recorded and apply again once shaping is back on. Priorities
// within a flow hold either way.
func (p *Pool[T]) SetShaping(on bool) {
	if p.unshaped == !on {
		return
	}
	p.unshaped = !on
	// In id order, not the map's: the flows joining the round do so in
	// the same order every time.
	for _, id := range slices.Sorted(maps.Keys(p.flows)) {
		p.reconsider(p.flows[id])
	}
}

// Shaping reports whether weighted shaping is on.
func (p *Pool[T]) Shaping() bool { return !p.unshaped }

// Weight reports a flow's current weight.
func (p *Pool[T]) Weight(id uint32) float64 {
	if f := p.flows[id]; f != nil {
		return f.weight
	}
	return 1
}

// Drain removes and returns every entry, each flow's in pop order.
func (p *Pool[T]) Drain() []Entry[T] {
	out := make([]Entry[T], 0, p.n)
	for _, f := range p.flows {
		out = append(out, p.removeAll(f)...)
	}
	return out
}

// RemoveFlow removes and returns a flow's entries in pop order (the peer is
// gone). The flow's weight is kept.
func (p *Pool[T]) RemoveFlow(id uint32) []Entry[T] {
	f := p.flows[id]
	if f == nil {
		return nil
	}
	return p.removeAll(f)
}

func (p *Pool[T]) removeAll(f *flow[T]) []Entry[T] {
	out := make([]Entry[T], 0, len(f.heap))
	for len(f.heap) > 0 {
		e := f.pop()
		p.bytes -= e.Bytes
		p.n--
		out = append(out, e)
	}
	if f.active {
		p.deactivate(f)
	}
	return out
}

// before orders the heap: higher priority first, then earlier arrival.
func before[T any](a, b *item[T]) bool {
	if a.e.Priority != b.e.Priority {
		return a.e.Priority > b.e.Priority
	}
	return a.seq < b.seq
}

// push and pop are a hand-written binary heap: container/heap would box
// every item in an interface (an allocation per Push).
func (f *flow[T]) push(it item[T]) {
	h := append(f.heap, it)
	i := len(h) - 1
	for i > 0 {
		parent := (i - 1) / 2
		if !before(&h[i], &h[parent]) {
			break
		}
		h[i], h[parent] = h[parent], h[i]
		i = parent
	}
	f.heap = h
}

func (f *flow[T]) pop() Entry[T] {
	h := f.heap
	top := h[0].e
	last := len(h) - 1
	h[0] = h[last]
	h[last] = item[T]{} // drop the reference so Value can be collected
	h = h[:last]
	i := 0
	for {
		l := 2*i + 1
		if l >= len(h) {
			break
		}
		c := l
		if r := l + 1; r < len(h) && before(&h[r], &h[l]) {
			c = r
		}
		if !before(&h[c], &h[i]) {
			break
		}
		h[i], h[c] = h[c], h[i]
		i = c
	}
	f.heap = h
	return top
}

func addSat(a, b int64) int64 {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

func mulSat(a, b int64) int64 {
	if a != 0 && b > math.MaxInt64/a {
		return math.MaxInt64
	}
	return a * b
}
