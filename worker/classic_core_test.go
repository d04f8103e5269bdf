package worker

import (
	"bytes"
	"encoding/binary"
	"slices"
	"testing"

	"github.com/fptps/fpt/classic"
	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/node"
)

// answerRange is server from's answer to range pull frame req: a KVData
// frame per key (one chunk each) and the end, under req's layout version.
func answerRange(c *core, t *testing.T, req frame.Message, keys map[uint64][]byte) []effects {
	t.Helper()
	h := req.Header
	var out []effects
	var frames uint64
	for _, k := range slices.Sorted(func(yield func(uint64) bool) {
		for k := range keys {
			if !yield(k) {
				return
			}
		}
	}) {
		d := frame.Header{Type: frame.KVData, DType: h.DType, Sender: h.Recipient, Recipient: h.Sender, Key: k,
			Iteration: h.Iteration, Length: uint64(len(keys[k])), Total: uint64(len(keys[k])), Aux: h.Aux}
		span, td, err := c.kvReply(&d, keys[k])
		if err != nil {
			t.Fatal(err)
		}
		copy(span, keys[k])
		out = append(out, td, c.kvLanded(&d))
		frames++
	}
	end := frame.Header{Type: frame.KVRangeEnd, Sender: h.Recipient, Recipient: h.Sender, Iteration: h.Iteration, Total: frames, Aux: h.Aux}
	_, td, err := c.kvReply(&end, nil)
	if err != nil {
		t.Fatal(err)
	}
	return append(out, td)
}

func finishedIn(tds []effects) int {
	n := 0
	for _, td := range tds {
		n += len(td.finished)
	}
	return n
}

func recipients(ms []frame.Message) []node.ID {
	var ids []node.ID
	for _, m := range ms {
		ids = append(ids, node.ID(m.Header.Recipient))
	}
	return ids
}

// TestCoreRangePull: a range pull asks every server whose range meets it,
// and completes with every key found, in order, once each has sent all it
// announced. A server under a newer layout has it ask again: at once if
// the worker knows that layout, else once it learns it; answers to the
// attempt before are dropped.
func TestCoreRangePull(t *testing.T) {
	s0, s1, s2 := node.ServerID(0), node.ServerID(1), node.ServerID(2)
	v0 := classic.Initial([]node.ID{s0, s1})
	v1 := v0.With(s2)
	val := func(x uint32) []byte { return binary.LittleEndian.AppendUint32(nil, x) }
	high := uint64(1) << 63 // server 1's in v0, server 2's in v1

	for _, tt := range []struct {
		name       string
		from, to   uint64
		asked      []node.ID
		knowsFirst bool // the worker learns v1 before the server's moved reply
	}{
		{"the whole key space", 0, 0, []node.ID{s0, s1}, false},
		{"within one server's range", 5, 100, []node.ID{s0}, false},
		{"moved: the layout is known", 0, 0, []node.ID{s0, s1}, true},
		{"moved: the layout comes later", 0, 0, []node.ID{s0, s1}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := startedCore(t, 0, 2, false)
			var out RangeResult
			td, err := c.pullRange(tt.from, tt.to, frame.Float32, 1<<20, &out, &call{})
			if err != nil {
				t.Fatal(err)
			}
			if got := recipients(td.sends); !slices.Equal(got, tt.asked) {
				t.Fatalf("asked %v, want %v", got, tt.asked)
			}
			c.handedOver(td.req, nil)
			if tt.name[:5] != "moved" {
				var tds []effects
				for _, m := range td.sends {
					keys := map[uint64][]byte{7: val(1), 1 << 40: val(2)}
					if node.ID(m.Header.Recipient) == s1 {
						keys = map[uint64][]byte{high: val(3)}
					}
					tds = append(tds, answerRange(c, t, m, keys)...)
				}
				if n := finishedIn(tds); n != 1 || td.req.err != nil {
					t.Fatalf("finished %d times, err %v", n, td.req.err)
				}
				want := []uint64{7, 1 << 40, high}[:len(tt.asked)+1]
				if !slices.Equal(out.Keys, want) || !bytes.Equal(out.Values[0], val(1)) {
					t.Fatalf("found %v %v, want keys %v", out.Keys, out.Values, want)
				}
				return
			}
			// Server 0 answers under v0; server 1 has v1 already.
			old := answerRange(c, t, td.sends[0], map[uint64][]byte{7: val(1)})
			if tt.knowsFirst {
				c.newLayout(v1)
			}
			moved := frame.Header{Type: frame.KVMoved, Sender: uint32(s1), Recipient: uint32(c.self), Iteration: 1, Length: 4, Aux: td.sends[1].Header.Aux}
			_, again, err := c.kvReply(&moved, val(0))
			if err != nil {
				t.Fatal(err)
			}
			if !tt.knowsFirst {
				if len(again.resends) != 0 {
					t.Fatal("asked again under a layout the worker does not know")
				}
				again = c.newLayout(v1)
			}
			if len(again.resends) != 1 || !slices.Equal(recipients(again.resends[0].sends), []node.ID{s0, s1, s2}) {
				t.Fatalf("asked again: %+v, want every server of v1", again.resends)
			}
			// Another server of the first attempt moved on too: its answer
			// asks nothing more.
			second := moved
			second.Sender = uint32(s0)
			if _, more, err := c.kvReply(&second, val(0)); err != nil || len(more.resends) != 0 {
				t.Fatalf("a second moved answer to the first attempt: %v, asked again %d times", err, len(more.resends))
			}
			for _, m := range again.resends[0].sends {
				if m.Header.Iteration != 1 {
					t.Fatalf("asked again under layout v%d", m.Header.Iteration)
				}
				c.sent(td.req, nil)
			}
			// A late answer of the first attempt counts for nothing.
			late := answerRange(c, t, td.sends[1], map[uint64][]byte{high: val(9)})
			var tds []effects
			for _, m := range again.resends[0].sends {
				keys := map[uint64][]byte{}
				switch node.ID(m.Header.Recipient) {
				case s0:
					keys[7] = val(1)
				case s2:
					keys[high] = val(3)
				}
				tds = append(tds, answerRange(c, t, m, keys)...)
			}
			if n := finishedIn(append(append(old, late...), tds...)); n != 1 || td.req.err != nil {
				t.Fatalf("finished %d times, err %v", n, td.req.err)
			}
			if !slices.Equal(out.Keys, []uint64{7, high}) || !bytes.Equal(out.Values[1], val(3)) {
				t.Fatalf("found %v %v", out.Keys, out.Values)
			}
		})
	}
}

// TestCoreRangePullRefuses bad arguments and answers that do not fit.
func TestCoreRangePullRefuses(t *testing.T) {
	c := startedCore(t, 0, 2, false)
	var out RangeResult
	if _, err := c.pullRange(10, 10, frame.Float32, 1<<20, &out, &call{}); err == nil {
		t.Error("an empty range accepted")
	}
	if _, err := c.pullRange(0, 0, 0, 1<<20, &out, &call{}); err == nil {
		t.Error("an unknown dtype accepted")
	}
	for _, tt := range []struct {
		name string
		h    frame.Header
	}{
		{"data from a server not asked", frame.Header{Type: frame.KVData, DType: frame.Float32, Sender: uint32(node.ServerID(5)), Key: 1, Length: 4, Total: 4}},
		{"a value larger than allowed", frame.Header{Type: frame.KVData, DType: frame.Float32, Sender: uint32(node.ServerID(0)), Key: 1, Length: 4, Total: 1 << 21}},
		{"a value of another dtype", frame.Header{Type: frame.KVData, DType: frame.Float64, Sender: uint32(node.ServerID(0)), Key: 1, Length: 8, Total: 8}},
		{"an ack", frame.Header{Type: frame.KVAck, Sender: uint32(node.ServerID(0))}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			td, err := c.pullRange(0, 0, frame.Float32, 1<<20, &out, &call{})
			if err != nil {
				t.Fatal(err)
			}
			tt.h.Aux = uint32(td.req.ts)
			if _, _, err := c.kvReply(&tt.h, make([]byte, tt.h.Length)); err == nil {
				t.Error("accepted")
			}
		})
	}
	t.Run("a second end", func(t *testing.T) {
		td, err := c.pullRange(0, 0, frame.Float32, 1<<20, &out, &call{})
		if err != nil {
			t.Fatal(err)
		}
		end := frame.Header{Type: frame.KVRangeEnd, Sender: uint32(node.ServerID(0)), Total: 1, Aux: uint32(td.req.ts)}
		if _, _, err := c.kvReply(&end, nil); err != nil {
			t.Fatal(err)
		}
		if _, _, err := c.kvReply(&end, nil); err == nil {
			t.Error("accepted")
		}
	})
}

// TestCoreClassicMoved: a classic frame a server answers with KVMoved goes
// again, the same chunk of the caller's values, to the owner it names,
// under the server's layout; the request completes with the new owner's
// answer. A moved reply that names no other server fails it.
func TestCoreClassicMoved(t *testing.T) {
	c := startedCore(t, 0, 2, false)
	keys, lens := []uint64{1 << 63}, []int{40} // server 1's in v0; chunks of 16, 16, 8
	data := pattern(40, 0)
	td, err := c.kvRequest(frame.KVPush, keys, data, nil, lens, frame.Float32, &call{})
	if err != nil {
		t.Fatal(err)
	}
	c.handedOver(td.req, nil)
	owner := binary.LittleEndian.AppendUint32(nil, uint32(node.ServerID(2)))
	var acks []effects
	for _, m := range td.sends {
		moved := m.Header
		moved.Type, moved.Sender, moved.Recipient, moved.Iteration, moved.Length = frame.KVMoved, m.Header.Recipient, m.Header.Sender, 1, 4
		_, again, err := c.kvReply(&moved, owner)
		if err != nil {
			t.Fatal(err)
		}
		if len(again.sends) != 1 {
			t.Fatalf("moved %s: sent again %d frames", &m.Header, len(again.sends))
		}
		r := again.sends[0]
		if node.ID(r.Header.Recipient) != node.ServerID(2) || r.Header.Iteration != 1 || r.Header.Offset != m.Header.Offset ||
			r.Header.Partition != m.Header.Partition || !bytes.Equal(r.Payload, m.Payload) {
			t.Fatalf("sent again %s with %d bytes, want %s's chunk to %s under v1", &r.Header, len(r.Payload), &m.Header, node.ServerID(2))
		}
		c.handedOver(td.req, nil)
		ack := r.Header
		ack.Type, ack.Sender, ack.Recipient = frame.KVAck, r.Header.Recipient, r.Header.Sender
		_, rt, err := c.kvReply(&ack, nil)
		if err != nil {
			t.Fatal(err)
		}
		acks = append(acks, rt)
	}
	if n := finishedIn(acks); n != 1 || td.req.err != nil {
		t.Fatalf("finished %d times, err %v", n, td.req.err)
	}

	td, err = c.kvRequest(frame.KVPush, keys, data, nil, lens, frame.Float32, &call{})
	if err != nil {
		t.Fatal(err)
	}
	moved := td.sends[0].Header
	moved.Type, moved.Sender, moved.Length = frame.KVMoved, uint32(node.ServerID(1)), 4
	if _, _, err := c.kvReply(&moved, binary.LittleEndian.AppendUint32(nil, uint32(node.WorkerID(3)))); err == nil {
		t.Error("a move to a worker accepted")
	}
}

// TestCoreClassicDrained: a layout that leaves a server out has the
// worker tell it, with KVDrained, how many classic requests it sent it in
// all (frames of pushes, pulls, moved chunks sent again, range pulls), so
// that a server leaving the job knows when it has answered them all. A
// KVMoved under an older layout than the worker's goes by the worker's:
// never to a server it said KVDrained to. At the start, the table's
// servers the layout leaves out hear it too.
func TestCoreClassicDrained(t *testing.T) {
	s0, s1, s2 := node.ServerID(0), node.ServerID(1), node.ServerID(2)
	c := startedCore(t, 0, 3, false)
	v0 := c.layout
	key := uint64(1) << 63 // server 1's in v0
	if v0.Owner(key) != s1 {
		t.Fatalf("key %d is %s's in %v", key, v0.Owner(key), v0)
	}
	push, err := c.kvRequest(frame.KVPush, []uint64{key}, pattern(40, 0), nil, []int{40}, frame.Float32, &call{}) // 3 chunks
	if err != nil {
		t.Fatal(err)
	}
	out := make([]byte, 40)
	if _, err := c.kvRequest(frame.KVPull, []uint64{key}, out, out, []int{40}, frame.Float32, &call{}); err != nil {
		t.Fatal(err)
	}
	rng, err := c.pullRange(0, 0, frame.Float32, 1<<20, &RangeResult{}, &call{}) // one frame to each server
	if err != nil {
		t.Fatal(err)
	}
	if got := recipients(rng.sends); !slices.Equal(got, []node.ID{s0, s1, s2}) {
		t.Fatalf("range pull asked %v", got)
	}
	const sentToS1 = 3 + 1 + 1

	v1 := v0.Without(s1)
	td := c.newLayout(v1)
	if len(td.notices) != 1 {
		t.Fatalf("notices %v, want one KVDrained to %s", td.notices, s1)
	}
	if h := td.notices[0].Header; h.Type != frame.KVDrained || node.ID(h.Recipient) != s1 || h.Total != sentToS1 || h.Iteration != uint64(v1.Version) {
		t.Fatalf("notice %s, want KVDrained to %s with Total %d under v%d", &h, s1, sentToS1, v1.Version)
	}

	// A server still at v0 names s1 as the pushed key's owner: the chunk
	// goes to its owner in v1 instead, under v1.
	moved := push.sends[0].Header
	moved.Type, moved.Sender, moved.Recipient, moved.Iteration, moved.Length = frame.KVMoved, uint32(s0), moved.Sender, uint64(v0.Version), 4
	_, again, err := c.kvReply(&moved, binary.LittleEndian.AppendUint32(nil, uint32(s1)))
	if err != nil {
		t.Fatal(err)
	}
	if r := again.sends[0].Header; node.ID(r.Recipient) != v1.Owner(key) || r.Iteration != uint64(v1.Version) {
		t.Fatalf("sent again %s, want it to %s under v%d", &r, v1.Owner(key), v1.Version)
	}

	// At the start (a joiner's table names a server its layout does not).
	td = effects{notices: c.drainedOutside([]node.ID{s0, s1, s2}, c.layout)}
	if len(td.notices) != 1 || node.ID(td.notices[0].Header.Recipient) != s1 || td.notices[0].Header.Total != sentToS1 {
		t.Fatalf("at the start: notices %v, want one KVDrained to %s with Total %d", td.notices, s1, sentToS1)
	}
}
