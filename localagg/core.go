package localagg

import (
	"errors"
	"fmt"
	"slices"

	"github.com/fptps/fpt/node"
)

// Slot names one partition of one tensor in one iteration: the unit the
// host sums and sends.
type Slot struct {
	Key  uint64
	Part int
	Iter uint64
}

func (s Slot) String() string {
	return fmt.Sprintf("key %d part %d iteration %d", s.Key, s.Part, s.Iter)
}

// Sum is a local contribution to add into the host's sum of Slot: From's
// partition, copied in if First (the first to arrive), else added with the
// reduce kernels.
type Sum struct {
	Slot  Slot
	From  node.ID
	First bool
}

// Send is a host sum complete: Count contributions, to go to the
// partition's aggregator as one.
type Send struct {
	Slot  Slot
	Count int
}

// Effects is what the shell does after a Core call, in this order: the
// sums (Resums first: the host sums to clear and make again from the
// contributions listed in Sums), the sends, the results to publish to the
// group, and the slots whose memory may be reused.
type Effects struct {
	Resums  []Slot
	Sums    []Sum
	Sends   []Send
	Publish []Slot
	Frees   []Slot
	// Leader is the group's new leader, when it changed (zero: unchanged).
	Leader node.ID
}

func (e *Effects) merge(o Effects) {
	e.Resums = append(e.Resums, o.Resums...)
	e.Sums = append(e.Sums, o.Sums...)
	e.Sends = append(e.Sends, o.Sends...)
	e.Publish = append(e.Publish, o.Publish...)
	e.Frees = append(e.Frees, o.Frees...)
	if o.Leader != 0 {
		e.Leader = o.Leader
	}
}

// Loss is what a lost member costs the group (FPT_ON_WORKER_LOSS).
type Loss int

const (
	// LossFail: the group, and the job, fail.
	LossFail Loss = iota
	// LossContinue (continue and wait alike, for the group): the group
	// goes on without the member, and its host sums of the iterations the
	// LB retries are made again without the member's contributions, which
	// the group keeps until every worker has the iteration's sum.
	LossContinue
)

// Errors a Core call may wrap. ErrDisagree and ErrFailed end local
// aggregation for the group (the shell falls back to the network path,
// or fails, as it logs); the others refuse one bad input.
var (
	ErrDisagree = errors.New("local group members declared different tensors")
	ErrFailed   = errors.New("local group failed")
	ErrMember   = errors.New("not a member of the local group")
	ErrTwice    = errors.New("contribution already in")
	ErrWindow   = errors.New("beyond the iterations the segment holds")
	ErrNotSent  = errors.New("result for a sum not sent")
	ErrNoResult = errors.New("read before the result")
)

// Core is a local group's bookkeeping of its host sums, kept by the
// leader: which contributions are in, when a host sum is complete, when
// every member read the result, what a lost or joining member changes. It
// holds no lock, opens no socket, starts no goroutine and reads no clock;
// each method takes one input and returns the Effects the shell carries
// out on the shared-memory segment and the network.
//
// Contributions are summed as they arrive: the host sum waits only for
// the last member's partition, never for a whole tensor or iteration.
type Core struct {
	loss  Loss
	depth int // iterations the segment holds at once
	// members are the live members, in id order.
	members []node.ID
	// leader sends the group's sums: the first member, until it is lost
	// (a joining member with a lower id does not take the lead).
	leader node.ID
	// from is the first iteration each member contributes to (0 for the
	// members at the start; a joining member's first iteration).
	from   map[node.ID]uint64
	digest map[node.ID]uint64
	slots  map[Slot]*entry
	iters  map[uint64]int // slots held per iteration
	// done is one past the last iteration every worker of the job has
	// the sum of: under LossContinue contributions are kept until then.
	done uint64
	err  error
}

type entry struct {
	in     []node.ID // contributions arrived, in the host sum unless lost
	sent   bool
	result bool
	read   []node.ID
}

// NewCore returns the bookkeeping of a group of the given members, which
// may hold depth iterations at once in its segment.
func NewCore(members []node.ID, depth int, loss Loss) (*Core, error) {
	if len(members) == 0 || depth < 1 {
		return nil, fmt.Errorf("localagg: a group needs a member and a depth of at least 1 (have %d members, depth %d)", len(members), depth)
	}
	ms := slices.Clone(members)
	slices.Sort(ms)
	if len(slices.Compact(slices.Clone(ms))) != len(ms) {
		return nil, fmt.Errorf("localagg: a member named twice in %v", members)
	}
	c := &Core{loss: loss, depth: depth, members: ms, from: map[node.ID]uint64{}, digest: map[node.ID]uint64{},
		slots: map[Slot]*entry{}, iters: map[uint64]int{}}
	for _, m := range ms {
		c.from[m] = 0
	}
	c.leader = ms[0]
	return c, nil
}

// Leader is the member that sends the group's sums.
func (c *Core) Leader() node.ID { return c.leader }

// Members lists the live members in id order.
func (c *Core) Members() []node.ID { return slices.Clone(c.members) }

// Err is the group's failure, if any.
func (c *Core) Err() error { return c.err }

// Declared records a member's digest of its declared tensors (keys, sizes,
// dtypes). Members that disagree would sum different things into one
// partition: the group fails with ErrDisagree, and no sum is made.
func (c *Core) Declared(m node.ID, digest uint64) error {
	if err := c.check(m); err != nil {
		return err
	}
	c.digest[m] = digest
	for _, o := range c.members {
		if d, ok := c.digest[o]; ok && d != digest {
			c.err = fmt.Errorf("localagg: %s and %s: %w", o, m, ErrDisagree)
			return c.err
		}
	}
	return nil
}

func (c *Core) check(m node.ID) error {
	if c.err != nil {
		return fmt.Errorf("localagg: %w: %w", ErrFailed, c.err)
	}
	if !slices.Contains(c.members, m) {
		return fmt.Errorf("localagg: %s: %w", m, ErrMember)
	}
	return nil
}

// expected lists the live members that contribute to iteration iter.
func (c *Core) expected(iter uint64) []node.ID {
	var e []node.ID
	for _, m := range c.members {
		if c.from[m] <= iter {
			e = append(e, m)
		}
	}
	return e
}

// Arrived takes member m's contribution to s, written into its slot of
// the segment: it is summed at once, and the host sum is sent once every
// member's is in.
func (c *Core) Arrived(m node.ID, s Slot) (Effects, error) {
	if err := c.check(m); err != nil {
		return Effects{}, err
	}
	if len(c.digest) < len(c.members) {
		return Effects{}, fmt.Errorf("localagg: %s: %s before every member declared its tensors", m, s)
	}
	if s.Iter < c.from[m] {
		return Effects{}, fmt.Errorf("localagg: %s contributes from iteration %d, not %d: %w", m, c.from[m], s.Iter, ErrMember)
	}
	e := c.slots[s]
	if e == nil {
		if c.iters[s.Iter] == 0 && len(c.iters) >= c.depth {
			return Effects{}, fmt.Errorf("localagg: %s from %s: %w (%d)", s, m, ErrWindow, c.depth)
		}
		e = &entry{}
		c.slots[s] = e
		c.iters[s.Iter]++
	}
	if slices.Contains(e.in, m) {
		return Effects{}, fmt.Errorf("localagg: %s from %s: %w", s, m, ErrTwice)
	}
	if e.sent {
		return Effects{}, fmt.Errorf("localagg: %s from %s: the host sum was sent without it", s, m)
	}
	e.in = append(e.in, m)
	out := Effects{Sums: []Sum{{Slot: s, From: m, First: len(e.in) == 1}}}
	out.merge(c.maybeSend(s, e))
	return out, nil
}

// maybeSend sends s's host sum once every expected member's contribution
// is in it.
func (c *Core) maybeSend(s Slot, e *entry) Effects {
	want := c.expected(s.Iter)
	if e.sent || len(want) == 0 {
		return Effects{}
	}
	for _, m := range want {
		if !slices.Contains(e.in, m) {
			return Effects{}
		}
	}
	e.sent = true
	return Effects{Sends: []Send{{Slot: s, Count: len(e.in)}}}
}

// ResultIn takes the aggregator's result for s, which the leader received
// once for the host: it is published to every member through the segment.
// A result for a sum not sent (or sent and answered already) is refused:
// it comes from the network and must not reach the members.
func (c *Core) ResultIn(s Slot) (Effects, error) {
	if c.err != nil {
		return Effects{}, fmt.Errorf("localagg: %w: %w", ErrFailed, c.err)
	}
	e := c.slots[s]
	if e == nil || !e.sent || e.result {
		return Effects{}, fmt.Errorf("localagg: %s: %w", s, ErrNotSent)
	}
	e.result = true
	return Effects{Publish: []Slot{s}}, nil
}

// Read takes member m's word that it copied s's result out of the
// segment.
func (c *Core) Read(m node.ID, s Slot) (Effects, error) {
	if err := c.check(m); err != nil {
		return Effects{}, err
	}
	e := c.slots[s]
	if e == nil || !e.result {
		return Effects{}, fmt.Errorf("localagg: %s by %s: %w", s, m, ErrNoResult)
	}
	if slices.Contains(e.read, m) {
		return Effects{}, fmt.Errorf("localagg: %s read twice by %s", s, m)
	}
	e.read = append(e.read, m)
	return c.maybeFree(s, e), nil
}

// maybeFree frees s once every expected member read its result and, when
// a lost member could make the LB retry it, every worker has its sum.
func (c *Core) maybeFree(s Slot, e *entry) Effects {
	if !e.result {
		return Effects{}
	}
	for _, m := range c.expected(s.Iter) {
		if !slices.Contains(e.read, m) {
			return Effects{}
		}
	}
	if c.loss == LossContinue && s.Iter >= c.done {
		return Effects{}
	}
	delete(c.slots, s)
	if c.iters[s.Iter]--; c.iters[s.Iter] == 0 {
		delete(c.iters, s.Iter)
	}
	return Effects{Frees: []Slot{s}}
}

// Done takes the LB's word that every worker has the sums of the
// iterations before done: under LossContinue their contributions may go.
func (c *Core) Done(done uint64) Effects {
	if done <= c.done {
		return Effects{}
	}
	c.done = done
	return c.sweep()
}

// sweep frees every slot that may go, in a stable order.
func (c *Core) sweep() Effects {
	var out Effects
	for _, s := range c.sorted() {
		out.merge(c.maybeFree(s, c.slots[s]))
	}
	return out
}

func (c *Core) sorted() []Slot {
	ss := make([]Slot, 0, len(c.slots))
	for s := range c.slots {
		ss = append(ss, s)
	}
	slices.SortFunc(ss, func(a, b Slot) int {
		switch {
		case a.Iter != b.Iter:
			return cmpU(a.Iter, b.Iter)
		case a.Key != b.Key:
			return cmpU(a.Key, b.Key)
		}
		return a.Part - b.Part
	})
	return ss
}

func cmpU(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Lose takes member m's loss. Under LossFail the group fails. Under
// LossContinue it goes on without m: a host sum not sent yet is made again
// without m's contribution (and sent if m was the last one missing); a
// lost leader hands the lead to the next member. The sums already sent
// are the LB's retry's to redo (Retry).
func (c *Core) Lose(m node.ID) (Effects, error) {
	if err := c.check(m); err != nil {
		return Effects{}, err
	}
	if c.loss == LossFail {
		c.err = fmt.Errorf("localagg: %s lost (FPT_ON_WORKER_LOSS=fail)", m)
		return Effects{}, c.err
	}
	if len(c.members) == 1 {
		c.err = fmt.Errorf("localagg: %s, the group's last member, lost", m)
		return Effects{}, c.err
	}
	var out Effects
	c.members = slices.DeleteFunc(c.members, func(o node.ID) bool { return o == m })
	if c.leader == m {
		c.leader = c.members[0]
		out.Leader = c.leader
	}
	delete(c.from, m)
	delete(c.digest, m)
	for _, s := range c.sorted() {
		e := c.slots[s]
		if e.sent || !slices.Contains(e.in, m) {
			if !e.sent {
				out.merge(c.maybeSend(s, e)) // m may have been the last one missing
			}
			continue
		}
		out.merge(c.resum(s, e))
		out.merge(c.maybeSend(s, e))
	}
	out.merge(c.sweep())
	return out, nil
}

// resum makes s's host sum again from the live members' contributions.
func (c *Core) resum(s Slot, e *entry) Effects {
	e.in = slices.DeleteFunc(e.in, func(o node.ID) bool { return !slices.Contains(c.members, o) })
	out := Effects{Resums: []Slot{s}}
	for i, o := range e.in {
		out.Sums = append(out.Sums, Sum{Slot: s, From: o, First: i == 0})
	}
	return out
}

// Retry takes the LB's retry of the iterations from from on, after a lost
// worker (of this group or another): every host sum of them already sent
// is made again from the live members' contributions and sent again, and
// its result, if in, is published again when it comes.
func (c *Core) Retry(from uint64) (Effects, error) {
	if c.err != nil {
		return Effects{}, fmt.Errorf("localagg: %w: %w", ErrFailed, c.err)
	}
	var out Effects
	for _, s := range c.sorted() {
		e := c.slots[s]
		if s.Iter < from || !e.sent {
			continue
		}
		e.sent, e.result, e.read = false, false, nil
		out.merge(c.resum(s, e))
		out.merge(c.maybeSend(s, e))
	}
	return out, nil
}

// Join adds member m, which contributes from iteration from on (the
// iteration of the LB decision naming it). It declares its tensors before
// its first contribution, as the others did.
func (c *Core) Join(m node.ID, from uint64) error {
	if c.err != nil {
		return fmt.Errorf("localagg: %w: %w", ErrFailed, c.err)
	}
	if slices.Contains(c.members, m) {
		return fmt.Errorf("localagg: %s joins twice", m)
	}
	for s := range c.slots {
		if s.Iter >= from {
			return fmt.Errorf("localagg: %s joins at iteration %d, which the group has begun (%s)", m, from, s)
		}
	}
	c.members = append(c.members, m)
	slices.Sort(c.members)
	c.from[m] = from
	return nil
}

// Held is how many slots the group holds (for tests and metrics).
func (c *Core) Held() int { return len(c.slots) }
