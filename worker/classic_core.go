package worker

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/fptps/fpt/classic"
	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/node"
)

// The core's half of ps-lite's classic calls: Push, Pull and PushPull over
// keys sliced by range across the servers of the newest layout the worker
// knows (classic.Layout), answered by KVAck, KVData or KVError frames that
// name the request in Aux, or by KVMoved from a server that no longer owns
// the key: the frame goes again, to the owner it names.

type kvDst struct {
	buf []byte
	got uint64
}

// rangePull is a range pull's state: one attempt's answers, asked under
// one layout version; a server with a newer layout has it ask again.
type rangePull struct {
	from, to uint64
	dtype    frame.DType
	maxValue uint64 // FPT_MAX_FRAME_BYTES: no key's value is larger
	version  uint32 // the attempt's layout
	waitFor  uint32 // parked until the worker knows this layout version
	ends     map[node.ID]*rangeEnd
	vals     map[uint64][]byte
	out      *RangeResult
}

// rangeEnd is what one server sent of a range pull's answer.
type rangeEnd struct {
	got, want uint64 // KVData frames landed; its KVRangeEnd's count
	ended     bool
}

// RangeResult is a range pull's answer: the keys found, in order, and
// each one's values (the dtype's bytes).
type RangeResult struct {
	Keys   []uint64
	Values [][]byte
}

// newLayout adopts a newer layout of the classic key ranges; range pulls
// parked until the worker knows it ask again. A server the new layout no
// longer names hears KVDrained: this worker sends it no more requests
// (requests go by the newest layout, and a KVMoved under an older one
// is sent by it too), and the count lets one that leaves in order know
// when it has answered them all.
func (c *core) newLayout(l classic.Layout) effects {
	var t effects
	if l.Version > c.layout.Version || len(c.layout.Servers) == 0 {
		if c.started {
			t.notices = c.drainedOutside(c.layout.Servers, l)
		}
		c.layout = l
	}
	parked := c.parkedRanges[:0]
	for _, req := range c.parkedRanges {
		switch {
		case req.finished:
		case req.rng.waitFor > c.layout.Version:
			parked = append(parked, req)
		default:
			t.resends = append(t.resends, c.askAgain(req))
		}
	}
	c.parkedRanges = parked
	return t
}

// drainedOutside is the KVDrained, as of layout l, for each of servers
// that l leaves out: this worker sends it nothing more. A server leaving
// the job waits for every worker's: a started worker says it to the
// servers of its layout that a new one leaves out (newLayout), and a
// starting one to those of the node table its first layout leaves out.
func (c *core) drainedOutside(servers []node.ID, l classic.Layout) []frame.Message {
	var notices []frame.Message
	for _, id := range servers {
		if l.Index(id) < 0 {
			notices = append(notices, c.drained(id, l.Version))
		}
	}
	return notices
}

// drained is the KVDrained for server id, as of layout version v.
func (c *core) drained(id node.ID, v uint32) frame.Message {
	return frame.Message{Header: frame.Header{
		Type: frame.KVDrained, Sender: uint32(c.self), Recipient: uint32(id), Iteration: uint64(v), Total: c.classicSent[id],
	}}
}

// pullRange asks every server whose range meets [from, to) (to 0: no
// upper bound) for the keys it holds there; out receives them once the
// request completes.
func (c *core) pullRange(from, to uint64, dtype frame.DType, maxValue uint64, out *RangeResult, cl *call) (effects, error) {
	switch {
	case dtype.Size() == 0:
		return effects{}, fmt.Errorf("worker: unknown dtype %d", dtype)
	case to != 0 && to <= from:
		return effects{}, fmt.Errorf("worker: empty key range [%d, %d)", from, to)
	case !c.started:
		return effects{}, errors.New("worker: not started")
	}
	req, err := c.newRequest(cl, 1) // its answer
	if err != nil {
		return effects{}, err
	}
	c.classicUsed = true
	req.rng = &rangePull{from: from, to: to, dtype: dtype, maxValue: maxValue, out: out}
	return effects{req: req, sends: c.askRange(req)}, nil
}

// askAgain starts a further attempt of range pull req: each of its
// frames' sends is one of req's items (effects.resends).
func (c *core) askAgain(req *request) resend {
	msgs := c.askRange(req)
	req.left += len(msgs)
	return resend{req: req, sends: msgs}
}

// askRange starts an attempt of range pull req under the worker's
// layout, and returns its frames.
func (c *core) askRange(req *request) []frame.Message {
	rng := req.rng
	rng.version, rng.waitFor = c.layout.Version, 0
	rng.ends = make(map[node.ID]*rangeEnd)
	rng.vals = make(map[uint64][]byte)
	var msgs []frame.Message
	for _, id := range c.layout.Servers {
		if !c.layout.Overlaps(id, rng.from, rng.to) {
			continue
		}
		rng.ends[id] = &rangeEnd{}
		msgs = append(msgs, frame.Message{Header: frame.Header{
			Type: frame.KVPullRange, DType: rng.dtype, Sender: uint32(c.self), Recipient: uint32(id),
			Key: rng.from, Total: rng.to, Iteration: uint64(rng.version), Aux: uint32(req.ts),
		}})
	}
	c.countClassic(msgs)
	return msgs
}

// countClassic counts the classic requests made, by server.
func (c *core) countClassic(msgs []frame.Message) {
	if c.classicSent == nil {
		c.classicSent = make(map[node.ID]uint64)
	}
	for i := range msgs {
		c.classicSent[node.ID(msgs[i].Header.Recipient)]++
	}
}

// rangeReply takes a reply to range pull req: KVData returns the span its
// payload goes to; KVRangeEnd and KVMoved settle or restart it.
func (c *core) rangeReply(req *request, h *frame.Header) (span []byte, t effects, err error) {
	rng := req.rng
	from := node.ID(h.Sender)
	if h.Type == frame.KVMoved {
		if h.Iteration <= uint64(rng.version) {
			// Another server's answer to the attempt this one's
			// restarted: it does not say which attempt it answers.
			return nil, effects{}, nil
		}
		if h.Iteration > uint64(c.layout.Version) {
			if rng.waitFor == 0 {
				c.parkedRanges = append(c.parkedRanges, req)
			}
			rng.waitFor = max(rng.waitFor, uint32(h.Iteration))
			return nil, effects{}, nil
		}
		if rng.waitFor != 0 {
			return nil, effects{}, nil // parked: its restart is on its way
		}
		return nil, effects{resends: []resend{c.askAgain(req)}}, nil
	}
	if h.Iteration != uint64(rng.version) || rng.waitFor != 0 {
		return nil, effects{}, nil // an answer to an earlier attempt
	}
	e := rng.ends[from]
	if e == nil {
		return nil, effects{}, fmt.Errorf("range pull %d: %s frame from %s, which was not asked", h.Aux, h.Type, from)
	}
	switch h.Type {
	case frame.KVRangeEnd:
		if e.ended {
			return nil, effects{}, fmt.Errorf("range pull %d: a second end from %s", h.Aux, from)
		}
		e.ended, e.want = true, h.Total
		return nil, c.rangeDone(req), nil
	case frame.KVData:
		if h.DType != rng.dtype || h.Total > rng.maxValue {
			return nil, effects{}, fmt.Errorf("range pull %d: key %d of %d bytes of %s", h.Aux, h.Key, h.Total, h.DType)
		}
		v := rng.vals[h.Key]
		if v == nil {
			v = make([]byte, h.Total)
			rng.vals[h.Key] = v
		}
		if uint64(len(v)) != h.Total {
			return nil, effects{}, fmt.Errorf("range pull %d: key %d of %d bytes, then %d", h.Aux, h.Key, len(v), h.Total)
		}
		return v[h.Offset : h.Offset+h.Length], effects{}, nil
	}
	return nil, effects{}, fmt.Errorf("range pull %d: unexpected %s", h.Aux, h.Type)
}

// rangeLanded counts a range pull's KVData frame whose bytes are in.
func (c *core) rangeLanded(req *request, h *frame.Header) effects {
	rng := req.rng
	if h.Iteration != uint64(rng.version) || rng.waitFor != 0 {
		return effects{}
	}
	if e := rng.ends[node.ID(h.Sender)]; e != nil {
		e.got++
	}
	return c.rangeDone(req)
}

// rangeDone completes range pull req once every server asked has sent
// all it announced.
func (c *core) rangeDone(req *request) effects {
	rng := req.rng
	for id, e := range rng.ends {
		switch {
		case e.ended && e.got > e.want:
			return c.settle(req, 0, fmt.Errorf("worker: range pull: %s sent more than the %d frames it announced", id, e.want))
		case !e.ended || e.got < e.want:
			return effects{}
		}
	}
	rng.out.Keys = slices.Sorted(maps.Keys(rng.vals))
	rng.out.Values = make([][]byte, len(rng.out.Keys))
	for i, k := range rng.out.Keys {
		rng.out.Values[i] = rng.vals[k]
	}
	return c.settle(req, 1, nil)
}

// checkClassic checks a classic call's arguments, which need no state.
func checkClassic(keys []uint64, data, out []byte, byteLens []int, dtype frame.DType) error {
	if dtype.Size() == 0 {
		return fmt.Errorf("worker: unknown dtype %d", dtype)
	}
	for i := 1; i < len(keys); i++ {
		if keys[i] <= keys[i-1] {
			return fmt.Errorf("worker: keys must be sorted and unique, as in ps-lite (key %d after %d)", keys[i], keys[i-1])
		}
	}
	if len(byteLens) != len(keys) {
		return fmt.Errorf("worker: %d lengths for %d keys", len(byteLens), len(keys))
	}
	total := 0
	for i, n := range byteLens {
		if n < 0 || n%dtype.Size() != 0 {
			return fmt.Errorf("worker: key %d: %d bytes is not a whole number of %s", keys[i], n, dtype)
		}
		total += n
	}
	if total != len(data) || (out != nil && len(out) != len(data)) {
		return fmt.Errorf("worker: lengths add up to %d bytes, the values have %d", total, len(data))
	}
	return nil
}

// kvRequest makes a classic request: one frame per partition-sized chunk
// of every key (a pull sends one empty frame per key). With out set (Pull,
// PushPull) it waits for each key's complete reply, else for one ack per
// frame.
func (c *core) kvRequest(typ frame.Type, keys []uint64, data, out []byte, byteLens []int, dtype frame.DType, cl *call) (effects, error) {
	if err := checkClassic(keys, data, out, byteLens, dtype); err != nil {
		return effects{}, err
	}
	if !c.started {
		return effects{}, errors.New("worker: not started")
	}
	req, err := c.newRequest(cl, 0)
	if err != nil {
		return effects{}, err
	}
	c.classicUsed = true
	var msgs []frame.Message
	if out != nil {
		req.dst = make(map[uint64]*kvDst, len(keys))
	}
	off := 0
	for i, k := range keys {
		n := uint64(byteLens[i])
		if out != nil {
			req.dst[k] = &kvDst{buf: out[off : off+int(n)]}
		}
		base := frame.Header{
			Type: typ, DType: dtype, Sender: uint32(c.self), Recipient: uint32(c.layout.Owner(k)),
			Key: k, Iteration: uint64(c.layout.Version), Total: n, Aux: uint32(req.ts),
		}
		val := data[off : off+int(n)]
		off += int(n)
		if typ == frame.KVPull {
			msgs = append(msgs, frame.Message{Header: base})
			continue
		}
		for part, ch := range frame.Chunks(n, c.partBytes, dtype.Size()) {
			m := frame.Message{Header: base, Payload: val[ch[0]:ch[1]]}
			m.Header.Offset, m.Header.Partition = ch[0], part
			msgs = append(msgs, m)
		}
	}
	if out != nil {
		req.left += len(keys) // one per key's complete reply
	} else {
		req.left += len(msgs) // one ack per frame
	}
	req.frames = msgs
	c.countClassic(msgs)
	return effects{req: req, sends: msgs}, nil
}

// kvReply takes a server's reply. KVAck and KVError settle their request
// at once; for KVData it returns the span of the caller's buffer the
// payload goes to, which the shell fills and reports with kvLanded.
func (c *core) kvReply(h *frame.Header, payload []byte) (span []byte, t effects, err error) {
	req := c.requests[int(h.Aux)]
	if req == nil {
		return nil, effects{}, fmt.Errorf("reply to request %d, which is not outstanding", h.Aux)
	}
	if req.rng != nil && h.Type != frame.KVError {
		return c.rangeReply(req, h)
	}
	switch h.Type {
	case frame.KVError:
		return nil, c.settle(req, 0, fmt.Errorf("worker: %s refused key %d: %s", node.ID(h.Sender), h.Key, payload)), nil
	case frame.KVAck:
		if req.dst != nil {
			return nil, effects{}, errors.New("ack for a request that expects data")
		}
		return nil, c.settle(req, 1, nil), nil
	case frame.KVMoved:
		t, err := c.kvMoved(req, h, payload)
		return nil, t, err
	}
	var d *kvDst
	if req.dst != nil {
		d = req.dst[h.Key]
	}
	if d == nil || uint64(len(d.buf)) != h.Total || h.Offset+h.Length > h.Total {
		return nil, effects{}, fmt.Errorf("data for key %d that request %d does not expect at that size", h.Key, h.Aux)
	}
	return d.buf[h.Offset : h.Offset+h.Length], effects{}, nil
}

// kvMoved sends a request's frame again, to the server a KVMoved reply
// names as its key's owner in layout h.Iteration: the chunk's values are
// still the caller's (a request holds its buffers until it completes).
func (c *core) kvMoved(req *request, h *frame.Header, payload []byte) (effects, error) {
	if req.frames == nil || len(payload) != 4 {
		return effects{}, fmt.Errorf("a moved reply (%d bytes) to request %d, which is not a classic one", len(payload), h.Aux)
	}
	owner := node.ID(binary.LittleEndian.Uint32(payload))
	if r, ok := owner.Role(); !ok || r != node.Server || owner == node.ID(h.Sender) {
		return effects{}, fmt.Errorf("key %d moved to %s, which is not another server", h.Key, owner)
	}
	// The request's frames are in key order, each key's chunks in offset
	// order.
	i, found := slices.BinarySearchFunc(req.frames, h, func(m frame.Message, h *frame.Header) int {
		return cmp.Or(cmp.Compare(m.Header.Key, h.Key), cmp.Compare(m.Header.Offset, h.Offset))
	})
	if !found || req.frames[i].Header.Total != h.Total || req.frames[i].Header.Partition != h.Partition {
		return effects{}, fmt.Errorf("key %d moved: request %d sent no chunk %d at offset %d of %d bytes", h.Key, h.Aux, h.Partition, h.Offset, h.Total)
	}
	version := uint32(h.Iteration)
	if c.layout.Version > version {
		// The worker knows a newer layout than the server's: its owner
		// there (a server leaving the job is owner in neither's).
		owner, version = c.layout.Owner(h.Key), c.layout.Version
	}
	m := frame.Message{Header: req.frames[i].Header, Payload: req.frames[i].Payload}
	m.Header.Recipient, m.Header.Iteration = uint32(owner), uint64(version)
	req.left++ // the hand-over of the frame sent again, as at the request's start
	sends := []frame.Message{m}
	c.countClassic(sends)
	return effects{req: req, sends: sends}, nil
}

// kvLanded accounts for a KVData frame whose bytes are in the caller's
// buffer; a key's last one settles its share of the request.
func (c *core) kvLanded(h *frame.Header) effects {
	req := c.requests[int(h.Aux)]
	if req != nil && req.rng != nil {
		return c.rangeLanded(req, h)
	}
	if req == nil || req.dst[h.Key] == nil {
		return effects{} // failed and released meanwhile
	}
	d := req.dst[h.Key]
	d.got += h.Length
	switch {
	case d.got == h.Total:
		return c.settle(req, 1, nil)
	case d.got > h.Total:
		return c.settle(req, 0, fmt.Errorf("worker: key %d: more data than its %d bytes", h.Key, h.Total))
	}
	return effects{}
}
