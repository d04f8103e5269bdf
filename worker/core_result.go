package worker

// The core's results: FPTPull's waits, and the Result frames claimed,
// landed (copied or read in place) and delivered into the pull's buffer.

import (
	"errors"
	"fmt"
	"slices"
	"unsafe"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/node"
)

type resultKey struct{ key, iter uint64 }

// inPlaceKey names a result frame being read in place: the sender's
// partition of one key's iteration.
type inPlaceKey struct {
	sender    node.ID
	key, iter uint64
	part      uint32
}

func inPlaceKeyOf(h *frame.Header) inPlaceKey {
	return inPlaceKey{node.ID(h.Sender), h.Key, h.Iteration, h.Partition}
}

// result gathers the partitions of one key's sum for one iteration. Once
// an FPTPull waits for it, partitions land straight in the caller's buffer;
// those that arrive before are staged in buf (taken from the tensor's
// spares only when needed) and copied over when the pull comes.
type result struct {
	t        *tensor
	iter     uint64
	buf      []byte // staging; nil until a partition arrives with no waiter
	parts    []lb.Partition
	seen     []bool // partition claimed by an arriving frame
	staged   []bool // partition complete in buf, not yet in the waiter's buffer
	left     int
	complete bool
	waiter   *pullWait // the FPTPull waiting for it, if it was called first
	// gen counts re-cuts by retries: a landing claimed before one no
	// longer counts. writing counts this gen's landings claimed and not
	// yet landed, stale those of older gens: their bytes are still being
	// written (the van reads a frame in place across many reads, and the
	// shell copies outside the lock). restage: re-cut while its pull copied
	// from staging or a stale landing was still being written into the
	// pull's buffer; new partitions are staged in a fresh buffer until
	// both end, since the new layout's partitions may overlap those bytes.
	gen     int
	writing int
	stale   int
	restage bool
	// held: complete, but its pull waits until every worker has the sum
	// (sumsAgainOnWorkerLoss); the pull stays its waiter.
	held bool
	// gate: the waiter's buffer holds an in-place FPTPushPull's values
	// that the sender still reads; the partitions it closes are staged.
	gate *gatedPull
}

type pullWait struct {
	req *request
	dst []byte
	// copying counts the deliveries the shell is copying from staging
	// into dst, outside the lock (a tensor's staging can be gigabytes); the
	// result completes only once every one is reported (copied).
	copying int
}

// landing is where a claimed result partition's bytes go.
type landing struct {
	r       *result
	gen     int    // r.gen when claimed
	staging bool   // span is in r's staging buffer, not the waiter's
	span    []byte // exactly the partition's bytes
}

// delivery is the part of a result staged before its FPTPull came: the
// shell copies those partitions from staging into the pull's buffer
// outside the lock, then reports it with copied.
type delivery struct {
	r     *result
	pw    *pullWait
	buf   []byte // the staging buffer copied from
	parts []lb.Partition
}

// pull is FPTPull on bytes: each key's next iteration's sum goes to its
// slice of data. Results already complete come back as copies to make.
func (c *core) pull(keys []uint64, data []byte, byteLens []int, dtype frame.DType, cl *call) (effects, error) {
	ts, parts, err := c.split(keys, data, byteLens, dtype)
	if err != nil {
		return effects{}, err
	}
	if slices.ContainsFunc(ts, func(t *tensor) bool { return t.pulled >= t.pushed }) {
		return c.pullInitial(ts, parts, cl)
	}
	req, err := c.newRequest(cl, 0) // await adds the keys
	if err != nil {
		return effects{}, err
	}
	req.bytes, req.fpt = uint64(len(data)), true
	if len(ts) > 0 { // a pull of no keys is a request that settles at once
		req.key, req.iter = ts[0].key, ts[0].pulled
	}
	out := effects{req: req}
	out.merge(c.await(ts, parts, req))
	return out, nil
}

// pushPull is FPTPushPull on bytes: push's data, then pull's outs, as one
// request made in one step, so that every key's result has its waiter
// before any frame of the push can leave: none of its partitions is
// staged and copied again. outs is data itself (in place) or apart from
// it. In place, a result partition lands in outs only once the push frame
// of the same bytes is written (sentFrame): until then the sender still
// reads them, and a partition that comes first is staged and copied when
// its frame is written. Where the push's frames are not the result's
// partitions, the key's last frame written opens them all.
func (c *core) pushPull(keys []uint64, data, outs []byte, byteLens []int, dtype frame.DType, priority int32, cl *call) (effects, error) {
	if len(outs) != len(data) {
		return effects{}, fmt.Errorf("worker: FPTPushPull: %d bytes for the sums, %d of values: %w", len(outs), len(data), ErrSizeMismatch)
	}
	inPlace := len(data) > 0 && unsafe.SliceData(outs) == unsafe.SliceData(data)
	if !inPlace && overlaps(outs, data) {
		return effects{}, errors.New("worker: FPTPushPull: the sums' buffer overlaps the values' without being the same buffer")
	}
	out, err := c.push(keys, data, byteLens, dtype, priority, cl)
	if err != nil {
		return effects{}, err
	}
	// The keys and lengths passed push's checks, and outs is data's size.
	ts, parts, err := c.split(keys, outs, byteLens, dtype)
	if err != nil {
		return effects{}, err
	}
	if !inPlace {
		out.merge(c.await(ts, parts, out.req))
		return out, nil
	}
	unsent := make(map[uint64]int)
	for i := range out.sends {
		unsent[out.sends[i].Header.Key]++
	}
	req := out.req
	req.left += len(ts)
	for i, t := range ts {
		iter := t.pulled
		t.pulled++
		r := c.resultFor(t, iter)
		pw := &pullWait{req: req, dst: parts[i]}
		switch {
		case iter >= c.done && c.aliasesHeld(t, iter, parts[i]):
			c.deferred = append(c.deferred, deferredPull{r, pw})
		case unsent[t.key] > 0 && iter == t.pushed-1:
			g := &gatedPull{r: r, req: req, unsent: unsent[t.key], closed: framedParts(r, out.sends, t.key)}
			c.gated[resultKey{t.key, iter}] = g
			r.gate = g
			out.merge(c.waitFor(r, pw))
		default:
			out.merge(c.waitFor(r, pw))
		}
	}
	return out, nil
}

// gatedPull is the pull half of an in-place FPTPushPull whose push has
// frames of the key not yet written: their bytes are still the sender's.
type gatedPull struct {
	r      *result
	req    *request
	unsent int // the push's frames of the key not yet written
	// closed marks the result's partitions whose push frame is not yet
	// written; nil: every partition, until the key's last frame is.
	closed []bool
}

// framedParts marks the partitions of r that the key's frames among
// sends carry, or returns nil unless each frame is exactly one of them
// (then the pull waits for the key's last frame).
func framedParts(r *result, sends []frame.Message, key uint64) []bool {
	closed := make([]bool, len(r.parts))
	for i := range sends {
		h := &sends[i].Header
		if h.Key != key {
			continue
		}
		if int(h.Partition) >= len(r.parts) || r.iter != h.Iteration {
			return nil
		}
		p := r.parts[h.Partition]
		if p.Offset != h.Offset || p.Length != h.Length || closed[h.Partition] {
			return nil
		}
		closed[h.Partition] = true
	}
	return closed
}

// closed reports whether partition part's bytes in the waiter's buffer
// are still an in-place push's values being sent.
func (r *result) closed(part uint32) bool {
	g := r.gate
	return g != nil && (g.closed == nil || int(part) >= len(g.closed) || g.closed[part])
}

// sentFrame is sent for a frame h of r: an in-place FPTPushPull's frame
// written opens its partition (or, the last of the key's, every one) to
// the pull, and what was staged there is copied over.
func (c *core) sentFrame(r *request, h *frame.Header, err error) effects {
	var out effects
	k := resultKey{h.Key, h.Iteration}
	if g := c.gated[k]; g != nil && g.req == r && h.Type == frame.Push {
		out.merge(c.open(k, g, h.Partition))
	}
	out.merge(c.sent(r, err))
	return out
}

// open records that g's push frame of partition part is written.
func (c *core) open(k resultKey, g *gatedPull, part uint32) effects {
	r := g.r
	g.unsent--
	switch {
	case g.unsent == 0:
		delete(c.gated, k)
		r.gate = nil
	case g.closed != nil && int(part) < len(g.closed):
		g.closed[part] = false
	default:
		return effects{}
	}
	if r.waiter == nil || r.restage {
		return effects{} // unstage copies what is staged
	}
	if d, ok := r.wait(r.waiter); ok {
		return effects{copies: []delivery{d}}
	}
	if r.complete && r.gate == nil && r.waiter.copying == 0 {
		return c.finish(r, r.waiter)
	}
	return effects{}
}

// await claims each tensor's next iteration's result for req, into its
// slice of parts: each adds an item to req, settled once the sum is there.
// Results already complete come back as copies to make.
func (c *core) await(ts []*tensor, parts [][]byte, req *request) effects {
	var out effects
	req.left += len(ts)
	for i, t := range ts {
		iter := t.pulled
		t.pulled++
		r := c.resultFor(t, iter)
		pw := &pullWait{req: req, dst: parts[i]}
		if iter >= c.done && c.aliasesHeld(t, iter, parts[i]) {
			c.deferred = append(c.deferred, deferredPull{r, pw})
			continue
		}
		out.merge(c.waitFor(r, pw))
	}
	return out
}

// waitFor makes pw r's waiter: the partitions staged are copies to make,
// and a result complete with none completes the pull now.
func (c *core) waitFor(r *result, pw *pullWait) effects {
	var out effects
	if d, ok := r.wait(pw); ok {
		out.copies = append(out.copies, d)
	} else if r.complete && r.gate == nil {
		out.merge(c.finish(r, r.waiter))
	}
	return out
}

// resultFor finds or creates the result of t's iteration.
func (c *core) resultFor(t *tensor, iter uint64) *result {
	k := resultKey{t.key, iter}
	if r := c.results[k]; r != nil {
		return r
	}
	_, layout := c.layoutFor(t, iter)
	r := &result{t: t, iter: iter, parts: layout, seen: make([]bool, len(layout)),
		staged: make([]bool, len(layout)), left: len(layout)}
	c.results[k] = r
	return r
}

// stage returns r's staging buffer, taking a spare if it has none.
func (r *result) stage() []byte {
	if r.buf == nil {
		if n := len(r.t.spare); n > 0 {
			r.buf, r.t.spare = r.t.spare[n-1], r.t.spare[:n-1]
		} else {
			r.buf = make([]byte, r.t.bytes)
		}
	}
	return r.buf
}

// wait makes an FPTPull's buffer the destination of r's partitions still
// to come, and hands the shell those already staged to copy over (ok),
// but those an in-place push still sends from.
func (r *result) wait(pw *pullWait) (d delivery, ok bool) {
	r.waiter = pw
	for i, staged := range r.staged {
		if staged && !r.closed(uint32(i)) {
			d.parts = append(d.parts, r.parts[i])
			r.staged[i] = false
		}
	}
	if len(d.parts) == 0 {
		return delivery{}, false
	}
	pw.copying++
	return delivery{r: r, pw: pw, buf: r.buf, parts: d.parts}, true
}

// copied reports that the shell has copied d's staged partitions: the
// result completes now if its last partition has already landed and
// nothing else is to be copied.
func (c *core) copied(d delivery) effects {
	d.pw.copying--
	for _, p := range d.parts {
		c.restaged += p.Length
	}
	r := d.r
	if r.restage {
		// A retry re-cut r during the copy: what landed since was staged
		// apart, and is copied now (or once stale landings end).
		return c.unstage(r)
	}
	if !r.complete || d.pw.copying > 0 || r.gate != nil {
		return effects{} // land, the last copy or open completes it
	}
	return c.finish(r, d.pw)
}

// delivered completes an FPTPull's share of a result once its bytes are in
// the caller's buffer, and recycles the result's staging buffer.
func (c *core) delivered(r *result, req *request) effects {
	delete(c.results, resultKey{r.t.key, r.iter})
	if r.buf != nil && len(r.t.spare) < 2 {
		r.t.spare = append(r.t.spare, r.buf)
	}
	return c.settle(req, 1, nil)
}

// finish completes pull pw of result r, whose bytes are all in its
// buffer. With sumsAgainOnWorkerLoss the pull completes only once every worker has the
// iteration's sum: until then it stays r's waiter, so that a retry lands
// the new sum in its buffer.
func (c *core) finish(r *result, pw *pullWait) effects {
	if c.sumsAgainOnWorkerLoss && r.iter >= c.done {
		r.waiter, r.held = pw, true
		c.heldPulls = append(c.heldPulls, r)
		return effects{}
	}
	r.waiter = nil
	return c.delivered(r, pw.req)
}

// sink is the van.Sink half for Result frames: the span a partition is
// read into in place (the FPTPull's buffer or staging), or nil when the
// frame is wrong (received reports why).
func (c *core) sink(h *frame.Header) []byte {
	l, err := c.claim(h)
	if err != nil {
		return nil
	}
	c.readingInPlace[inPlaceKeyOf(h)] = l
	return l.span
}

// abandon releases the landing of a frame its sender's connection was
// reading in place when it ended: the partition never lands, so a retry
// (or the job's failure) follows, but its bytes are no longer written.
func (c *core) abandon(peer node.ID) effects {
	var out effects
	for k, l := range c.readingInPlace {
		if k.sender != peer {
			continue
		}
		delete(c.readingInPlace, k)
		r := l.r
		if l.gen != r.gen {
			r.stale--
			out.merge(c.unstage(r))
			continue
		}
		r.writing--
	}
	return out
}

// received takes a Result frame: its landing, and whether sink already
// put its bytes there (else the shell copies the payload into l.span).
func (c *core) received(h *frame.Header) (l landing, inPlace bool, err error) {
	k := inPlaceKeyOf(h)
	if l, ok := c.readingInPlace[k]; ok {
		delete(c.readingInPlace, k)
		return l, true, nil
	}
	l, err = c.claim(h)
	return l, false, err
}

// claim validates a result frame (or this worker's own copy of a sum it
// aggregated) and reserves its partition.
func (c *core) claim(h *frame.Header) (landing, error) {
	if !c.started {
		return landing{}, errors.New("result before the worker started")
	}
	t := c.tensors[h.Key]
	if t == nil {
		return landing{}, errors.New("result for an undeclared key (declare every key on every worker before the first push)")
	}
	if c.superseded(h) {
		return landing{}, errStale
	}
	r := c.results[resultKey{h.Key, h.Iteration}]
	if r == nil {
		if h.Iteration < t.pulled && c.retriedAt(h.Iteration) {
			return landing{}, errStale // pulled before the retry re-sent it
		}
		if h.Iteration < t.pulled || h.Iteration > t.pushed {
			return landing{}, fmt.Errorf("result for iteration %d, but this worker pushed %d and pulled %d", h.Iteration, t.pushed, t.pulled)
		}
		r = c.resultFor(t, h.Iteration)
	}
	if r.complete && c.retriedAt(h.Iteration) {
		return landing{}, errStale // complete here before the retry
	}
	if err := r.check(h); err != nil {
		return landing{}, err
	}
	r.seen[h.Partition] = true
	r.writing++
	l := landing{r: r, gen: r.gen, staging: r.waiter == nil || r.restage || r.closed(h.Partition)}
	var into []byte
	if l.staging {
		into = r.stage()
	} else {
		into = r.waiter.dst
	}
	l.span = into[h.Offset : h.Offset+h.Length]
	return l, nil
}

// land accounts for a partition whose bytes are in place, and completes
// the result (and the FPTPull waiting for it) with its last partition.
func (c *core) land(l landing, part uint32) effects {
	r := l.r
	if l.gen != r.gen {
		// Claimed before a retry re-cut r: it no longer counts, but the
		// new cut's partitions may now go where its bytes went.
		r.stale--
		return c.unstage(r)
	}
	r.writing--
	if l.staging {
		if r.waiter != nil && !r.restage && !r.closed(part) {
			// The pull came, or its push frame was written, while this
			// partition was being staged.
			p := r.parts[part]
			copy(r.waiter.dst[p.Offset:p.Offset+p.Length], l.span)
			c.restaged += p.Length
		} else {
			r.staged[part] = true
		}
	}
	r.left--
	if r.left > 0 {
		return effects{}
	}
	r.complete = true
	out := c.sumIn(r.t, r.iter)
	wait := r.waiter
	if wait == nil || wait.copying > 0 || r.restage || r.gate != nil {
		return out // its pull, copied, unstage or open completes it
	}
	out.merge(c.finish(r, wait))
	return out
}

// check verifies that a result frame is the partition the layout expects
// from the aggregator that owns it: a misrouted or stale partition is a
// protocol error, never a silently wrong value.
func (r *result) check(h *frame.Header) error {
	if int(h.Partition) >= len(r.parts) {
		return fmt.Errorf("partition %d of %d", h.Partition, len(r.parts))
	}
	p := r.parts[h.Partition]
	switch {
	case h.DType != r.t.dtype || h.Total != r.t.bytes:
		return fmt.Errorf("key is %d bytes of %s", r.t.bytes, r.t.dtype)
	case p.Offset != h.Offset || p.Length != h.Length:
		return fmt.Errorf("partition %d is [%d,+%d)", p.Index, p.Offset, p.Length)
	case p.Aggregator != node.ID(h.Sender):
		return fmt.Errorf("partition %d belongs to %s", p.Index, node.ID(p.Aggregator))
	case r.seen[h.Partition]:
		return fmt.Errorf("partition %d received twice", h.Partition)
	}
	return nil
}
