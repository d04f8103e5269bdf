package worker

import (
	"errors"
	"fmt"
	"math"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/van"
)

// The core's half of ps-lite's classic calls: Push, Pull and PushPull over
// keys sliced by range across the servers, answered by KVAck, KVData or
// KVError frames that name the request in Aux.

type kvDst struct {
	buf []byte
	got uint64
}

// ServerFor returns the server owning key under ps-lite's range slicing:
// the key space is cut into NumServers equal ranges.
func ServerFor(key uint64, servers int) int {
	span := math.MaxUint64 / uint64(servers)
	return int(min(key/span, uint64(servers-1)))
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
func (c *core) kvRequest(typ frame.Type, keys []uint64, data, out []byte, byteLens []int, dtype frame.DType, cl *call) (todo, error) {
	if err := checkClassic(keys, data, out, byteLens, dtype); err != nil {
		return todo{}, err
	}
	if !c.started {
		return todo{}, errors.New("worker: not started")
	}
	req, err := c.newRequest(cl, 0)
	if err != nil {
		return todo{}, err
	}
	c.classicUsed = true
	var msgs []van.Message
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
			Type: typ, DType: dtype, Sender: uint32(c.self), Recipient: uint32(c.servers[ServerFor(k, len(c.servers))]),
			Key: k, Total: n, Aux: uint32(req.ts),
		}
		val := data[off : off+int(n)]
		off += int(n)
		if typ == frame.KVPull {
			msgs = append(msgs, van.Message{Header: base})
			continue
		}
		for part, ch := range frame.Chunks(n, c.partBytes, dtype.Size()) {
			m := van.Message{Header: base, Payload: val[ch[0]:ch[1]]}
			m.Header.Offset, m.Header.Partition = ch[0], part
			msgs = append(msgs, m)
		}
	}
	if out != nil {
		req.left += len(keys) // one per key's complete reply
	} else {
		req.left += len(msgs) // one ack per frame
	}
	return todo{req: req, sends: msgs}, nil
}

// kvReply takes a server's reply. KVAck and KVError settle their request
// at once; for KVData it returns the span of the caller's buffer the
// payload goes to, which the shell fills and reports with kvLanded.
func (c *core) kvReply(h *frame.Header, payload []byte) (span []byte, t todo, err error) {
	req := c.requests[int(h.Aux)]
	if req == nil {
		return nil, todo{}, fmt.Errorf("reply to request %d, which is not outstanding", h.Aux)
	}
	switch h.Type {
	case frame.KVError:
		return nil, c.settle(req, 0, fmt.Errorf("worker: %s refused key %d: %s", node.ID(h.Sender), h.Key, payload)), nil
	case frame.KVAck:
		if req.dst != nil {
			return nil, todo{}, errors.New("ack for a request that expects data")
		}
		return nil, c.settle(req, 1, nil), nil
	}
	var d *kvDst
	if req.dst != nil {
		d = req.dst[h.Key]
	}
	if d == nil || uint64(len(d.buf)) != h.Total || h.Offset+h.Length > h.Total {
		return nil, todo{}, fmt.Errorf("data for key %d that request %d does not expect at that size", h.Key, h.Aux)
	}
	return d.buf[h.Offset : h.Offset+h.Length], todo{}, nil
}

// kvLanded accounts for a KVData frame whose bytes are in the caller's
// buffer; a key's last one settles its share of the request.
func (c *core) kvLanded(h *frame.Header) todo {
	req := c.requests[int(h.Aux)]
	if req == nil || req.dst[h.Key] == nil {
		return todo{} // failed and released meanwhile
	}
	d := req.dst[h.Key]
	d.got += h.Length
	switch {
	case d.got == h.Total:
		return c.settle(req, 1, nil)
	case d.got > h.Total:
		return c.settle(req, 0, fmt.Errorf("worker: key %d: more data than its %d bytes", h.Key, h.Total))
	}
	return todo{}
}
