package worker

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/node"
)

// The core of a worker joining a running job, and of the worker that
// hands it the parameters.

// joinDecision is the LB's decision admitting worker rank 2 to a job of
// workers 0 and 1 at iteration at: the even split over one server, with
// the joiner among the workers.
func joinDecision(version uint32, at uint64) lb.Directive {
	d := lb.Even(version, at, []node.ID{node.ServerID(0)})
	d.Workers = testWorkers(3)
	return lb.Directive{Horizon: at - 1, Decision: &d}
}

// The worker with the lowest id among those before and after the join
// hands the parameters over, once, in its first push of the join
// iteration; no other worker does, and no other push.
func TestCoreJoinDuty(t *testing.T) {
	for _, rank := range []int{0, 1} {
		c := startedCore(t, rank, 1, true)
		mustDeclare(t, c, 7, 64)
		mustDeclare(t, c, 3, 32)
		if _, _, err := c.follow(lb.Directive{Horizon: 2}); err != nil {
			t.Fatal(err)
		}
		if _, _, err := c.follow(joinDecision(1, 3)); err != nil {
			t.Fatal(err)
		}
		if _, _, err := c.follow(lb.Directive{Horizon: 10}); err != nil {
			t.Fatal(err)
		}
		var duties []*paramsDuty
		for it := range 5 {
			for _, key := range []uint64{3, 7} {
				n := map[uint64]int{3: 32, 7: 64}[key]
				td, err := c.push([]uint64{key}, make([]byte, n), []int{n}, frame.Float32, 0, &call{})
				if err != nil {
					t.Fatalf("rank %d iteration %d: %v", rank, it, err)
				}
				if td.duty != nil {
					if it != 3 {
						t.Errorf("rank %d: a duty in iteration %d", rank, it)
					}
					duties = append(duties, td.duty)
				}
			}
		}
		want := 0
		if rank == 0 {
			want = 1
		}
		if len(duties) != want {
			t.Fatalf("rank %d: %d duties, want %d", rank, len(duties), want)
		}
		if want == 1 {
			d := duties[0]
			keys := []uint64{d.keys[0].key, d.keys[1].key}
			if d.iter != 3 || !slices.Equal(d.to, []node.ID{node.WorkerID(2)}) || !slices.Equal(keys, []uint64{3, 7}) {
				t.Errorf("duty: iteration %d to %v keys %v, want 3 to [worker 2] keys [3 7]", d.iter, d.to, keys)
			}
		}
	}
}

// joinerCore is worker 2's core, joining a job of workers 0 and 1 with
// key 5 (64 bytes) declared; it has followed the decisions made before
// it joined (which it ignores) and the one admitting it at iteration 3.
func joinerCore(t *testing.T) *core {
	t.Helper()
	c := newCore(testPartBytes, true)
	c.joining()
	if err := c.start(node.WorkerID(2), []node.ID{node.ServerID(0)}, testWorkers(3)); err != nil {
		t.Fatal(err)
	}
	mustDeclare(t, c, 5, 64)
	before := lb.Even(4, 1, []node.ID{node.ServerID(0)})
	for _, d := range []lb.Directive{{Horizon: 2, Decision: &before}, joinDecision(5, 3), {Horizon: 4, Done: 2}} {
		if _, _, err := c.follow(d); err != nil {
			t.Fatalf("following %+v: %v", d, err)
		}
	}
	return c
}

// paramsFrames are the Params frames worker 0 sends for key 5 at
// iteration iter, in partitions of 16 bytes, with the values of data.
func paramsFrames(iter uint64, data []byte) []frame.Header {
	var hs []frame.Header
	for i, span := range frame.Chunks(uint64(len(data)), testPartBytes, 4) {
		hs = append(hs, frame.Header{
			Type: frame.Params, DType: frame.Float32, Sender: uint32(node.WorkerID(0)), Recipient: uint32(node.WorkerID(2)),
			Key: 5, Partition: i, Iteration: iter, Offset: span[0], Total: uint64(len(data)), Length: span[1] - span[0],
		})
	}
	return hs
}

// A joining worker starts at the iteration of the decision naming it:
// Init waits for every partition of the parameters, returns them, and the
// first push is of that iteration.
func TestCoreJoiner(t *testing.T) {
	c := joinerCore(t)
	if got := c.startIteration(); got != 3 {
		t.Fatalf("start iteration %d, want 3", got)
	}
	if _, err := c.push([]uint64{5}, make([]byte, 64), []int{64}, frame.Float32, 0, &call{}); err == nil || !strings.Contains(err.Error(), "Init first") {
		t.Fatalf("a push before Init: %v, want the Init-first error", err)
	}
	want := pattern(64, 3)
	hs := paramsFrames(3, want)
	// Half before Init, half after, out of order.
	for _, i := range []int{2, 0} {
		if _, err := c.params(&hs[i], bytes.Clone(want[hs[i].Offset:hs[i].Offset+hs[i].Length]), true); err != nil {
			t.Fatal(err)
		}
	}
	init, err := c.awaitParams([]uint64{5}, &call{})
	if err != nil {
		t.Fatal(err)
	}
	if fin := finishedTS(init); len(fin) != 0 {
		t.Fatalf("Init finished with half its parameters: %v", fin)
	}
	handOver(c, init)
	var last effects
	for _, i := range []int{3, 1} {
		if last, err = c.params(&hs[i], bytes.Clone(want[hs[i].Offset:hs[i].Offset+hs[i].Length]), true); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Contains(finishedTS(last), init.req.ts) {
		t.Fatalf("the last partition finished %v, want Init's %d", finishedTS(last), init.req.ts)
	}
	takeParams(t, c, want)
	push, err := c.push([]uint64{5}, make([]byte, 64), []int{64}, frame.Float32, 0, &call{})
	if err != nil {
		t.Fatal(err)
	}
	if len(push.sends) == 0 || push.sends[0].Header.Iteration != 3 {
		t.Fatalf("first push: %d frames, iteration %d; want iteration 3", len(push.sends), push.sends[0].Header.Iteration)
	}
}

// Parameters that are not exactly what the joiner starts from are an
// error naming what is wrong, never values taken silently.
func TestCoreJoinerRefusesBadParams(t *testing.T) {
	good := paramsFrames(3, make([]byte, 64))[0]
	tests := []struct {
		name   string
		mutate func(h *frame.Header)
		twice  bool
		want   string
	}{
		{"refused", func(h *frame.Header) { h.Flags = frame.FlagRefused }, false, "cannot hand over"},
		{"wrong iteration", func(h *frame.Header) { h.Iteration = 4 }, false, "of iteration 4"},
		{"wrong sender", func(h *frame.Header) { h.Sender = uint32(node.WorkerID(1)) }, false, "not worker"},
		{"wrong size", func(h *frame.Header) { h.Total = 128 }, false, "declared as 64 bytes"},
		{"twice", func(*frame.Header) {}, true, "received twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := joinerCore(t)
			h := good
			tt.mutate(&h)
			_, err := c.params(&h, make([]byte, h.Length), true)
			if tt.twice && err == nil {
				_, err = c.params(&h, make([]byte, h.Length), true)
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error with %q", err, tt.want)
			}
		})
	}
}

// Params frames on a worker that started with the job are an error.
func TestCoreParamsNotJoining(t *testing.T) {
	c := startedCore(t, 1, 1, true)
	mustDeclare(t, c, 5, 64)
	h := paramsFrames(3, make([]byte, 64))[0]
	if _, err := c.params(&h, make([]byte, h.Length), true); err == nil {
		t.Fatal("parameters accepted by a worker that did not join")
	}
}

// MXNet initialises one key per call: a joiner's Init calls each take
// their own keys' parameters, and a key is pushed only once its Init
// took them.
func TestCoreJoinerInitPerKey(t *testing.T) {
	c := joinerCore(t)
	mustDeclare(t, c, 6, 32)
	for _, h := range paramsFrames(3, pattern(64, 3)) {
		if _, err := c.params(&h, make([]byte, h.Length), true); err != nil {
			t.Fatal(err)
		}
	}
	first, err := c.awaitParams([]uint64{5}, &call{})
	if err != nil {
		t.Fatal(err)
	}
	if fin := handOver(c, first); !slices.Contains(fin, first.req.ts) {
		t.Fatalf("Init of key 5, whose parameters are all here, finished %v", fin)
	}
	if _, _, err := c.paramsTake([]uint64{5}, make([]byte, 64), []int{64}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.push([]uint64{5}, make([]byte, 64), []int{64}, frame.Float32, 0, &call{}); err != nil {
		t.Fatalf("push of key 5 after its Init: %v", err)
	}
	if _, err := c.push([]uint64{6}, make([]byte, 32), []int{32}, frame.Float32, 0, &call{}); err == nil {
		t.Fatal("push of key 6 before its Init accepted")
	}
	if _, err := c.awaitParams([]uint64{5}, &call{}); err == nil {
		t.Fatal("a second Init of key 5 accepted")
	}
	second, err := c.awaitParams([]uint64{6}, &call{})
	if err != nil {
		t.Fatal(err)
	}
	if fin := handOver(c, second); len(fin) != 0 {
		t.Fatalf("Init of key 6 finished %v with none of its parameters", fin)
	}
}

// An Init whose context ends gives up its wait: its request settles with
// that error, and the keys may be waited for again.
func TestCoreJoinerInitCancelled(t *testing.T) {
	c := joinerCore(t)
	init, err := c.awaitParams([]uint64{5}, &call{})
	if err != nil {
		t.Fatal(err)
	}
	handOver(c, init)
	gone := errors.New("context canceled")
	out := c.cancelParams(init.req.ts, gone)
	if !slices.Contains(finishedTS(out), init.req.ts) || !errors.Is(init.req.err, gone) {
		t.Fatalf("cancel finished %v with %v, want Init's request with its error", finishedTS(out), init.req.err)
	}
	if _, err := c.awaitParams([]uint64{5}, &call{}); err != nil {
		t.Fatalf("Init again after a cancelled one: %v", err)
	}
}

// A joining worker reads its parameters in place, into a receive buffer
// per key that it asks the shell for on the key's first frame, and keeps
// that buffer as the key's value after Init: its values are copied once,
// into Init's buffer, never out of the van's buffer and never again to be
// kept. A frame for a key not declared yet has no buffer (copied instead).
func TestCoreJoinerReadsParamsInPlace(t *testing.T) {
	c := joinerCore(t)
	want := pattern(64, 3)
	hs := paramsFrames(3, want)
	var buf []byte
	for n, i := range []int{1, 3, 0, 2} {
		h := &hs[i]
		span, need := c.paramsSink(h)
		if n == 0 {
			if span != nil || need != 64 {
				t.Fatalf("first frame: a span of %d bytes, need %d; want none yet, need 64", len(span), need)
			}
			buf = make([]byte, need)
			var unwanted []byte
			if span, unwanted = c.paramsBuffer(h, buf); unwanted != nil {
				t.Fatal("the receive buffer was refused")
			}
		} else if need != 0 {
			t.Fatalf("frame %d: need %d after the buffer was given", i, need)
		}
		if !overlaps(span, buf) || uint64(len(span)) != h.Length {
			t.Fatalf("frame %d: a span of %d bytes outside the receive buffer", i, len(span))
		}
		copy(span, want[h.Offset:h.Offset+h.Length]) // the van's read
		if _, err := c.params(h, span, false); err != nil {
			t.Fatal(err)
		}
	}
	undeclared := hs[0]
	undeclared.Key = 6
	if span, need := c.paramsSink(&undeclared); span != nil || need != 0 {
		t.Errorf("a frame of an undeclared key: a span of %d bytes, need %d; want neither", len(span), need)
	}
	init, err := c.awaitParams([]uint64{5}, &call{})
	if err != nil {
		t.Fatal(err)
	}
	if fin := handOver(c, init); !slices.Contains(fin, init.req.ts) {
		t.Fatalf("Init did not finish with every partition in: %v", fin)
	}
	kept := takeParams(t, c, want)
	if len(kept) != 1 || kept[0].key != 5 || !overlaps(kept[0].mem, buf) || !kept[0].keep {
		t.Fatalf("kept %v, want key 5's receive buffer", kept)
	}
	c.keepInitial([]uint64{5}, kept[0].mem, []int{64})
	if tn := c.tensors[5]; !overlaps(tn.initial, buf) || !bytes.Equal(tn.initial, want) {
		t.Fatal("the value kept after Init is not the receive buffer's")
	}
	if c.join.cloned != 0 || c.join.kept != 64 {
		t.Errorf("cloned %d, kept %d bytes; want 0 and 64", c.join.cloned, c.join.kept)
	}
	if span, need := c.paramsSink(&hs[0]); span != nil || need != 0 {
		t.Error("a frame after Init took the key was given a span")
	}
}

// A key whose values are not all in its receive buffer (a frame came
// before the buffer, copied out of the van's) is copied into Init's
// buffer from where each frame lies, and its receive buffer is handed
// back to be unmapped rather than kept, or left mapped.
func TestCoreJoinerHandsBackPartialBuffer(t *testing.T) {
	c := joinerCore(t)
	want := pattern(64, 3)
	hs := paramsFrames(3, want)
	if _, err := c.params(&hs[0], bytes.Clone(want[hs[0].Offset:hs[0].Offset+hs[0].Length]), true); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	for n, h := range hs[1:] {
		span, need := c.paramsSink(&h)
		if n == 0 {
			if span, _ = c.paramsBuffer(&h, buf); need != 64 || span == nil {
				t.Fatalf("the receive buffer: need %d, span %d bytes", need, len(span))
			}
		}
		copy(span, want[h.Offset:h.Offset+h.Length])
		if _, err := c.params(&h, span, false); err != nil {
			t.Fatal(err)
		}
	}
	init, err := c.awaitParams([]uint64{5}, &call{})
	if err != nil {
		t.Fatal(err)
	}
	handOver(c, init)
	kept := takeParams(t, c, want)
	if len(kept) != 1 || !overlaps(kept[0].mem, buf) || kept[0].keep {
		t.Fatalf("receive buffers handed over %+v, want key 5's, not to keep", kept)
	}
	if left := c.paramsBufs(); len(left) != 0 {
		t.Errorf("%d receive buffers still the core's after Init took their keys", len(left))
	}
}

// takeParams takes key 5's 64 bytes of parameters as Init hands them to
// the caller (its copies made), checks them against want, and returns the
// receive buffers handed over.
func takeParams(t *testing.T, c *core, want []byte) []paramsKept {
	t.Helper()
	data := make([]byte, 64)
	copies, kept, err := c.paramsTake([]uint64{5}, data, []int{64})
	if err != nil {
		t.Fatal(err)
	}
	for _, cp := range copies {
		copy(cp.dst, cp.src)
	}
	if !bytes.Equal(data, want) {
		t.Fatalf("parameters %v, want %v", data, want)
	}
	return kept
}
