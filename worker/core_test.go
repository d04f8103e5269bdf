package worker

import (
	"bytes"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/node"
)

// The core's tests drive it as the shell does, without sockets: calls in,
// todos out, frames made by hand.

const testPartBytes = 16 // small partitions: a 64-byte tensor has 4

func startedCore(t *testing.T, rank, servers int, lbOn bool) *core {
	t.Helper()
	c := newCore(testPartBytes, lbOn)
	var ids []node.ID
	for i := range servers {
		ids = append(ids, node.ServerID(i))
	}
	if err := c.start(node.WorkerID(rank), ids, testWorkers(max(rank+1, 2))); err != nil {
		t.Fatal(err)
	}
	return c
}

// testWorkers is the ids of a job's first n workers.
func testWorkers(n int) []node.ID {
	ids := make([]node.ID, n)
	for r := range ids {
		ids[r] = node.WorkerID(r)
	}
	return ids
}

func mustDeclare(t *testing.T, c *core, key uint64, n int) {
	t.Helper()
	if err := c.declare(key, frame.Float32, uint64(n), 0); err != nil {
		t.Fatal(err)
	}
}

// handOver does what the shell does with a call's effects when every frame
// is written: the hand-over, then each send's Done. It returns the
// timestamps of the requests that finished.
func handOver(c *core, t effects) []int {
	var done []int
	add := func(o effects) {
		for _, r := range o.finished {
			done = append(done, r.ts)
		}
	}
	add(t)
	add(c.handedOver(t.req, nil))
	if t.counted {
		for range t.sends {
			add(c.sent(t.req, nil))
		}
	}
	return done
}

func mustPush(t *testing.T, c *core, key uint64, data []byte) effects {
	t.Helper()
	td, err := c.push([]uint64{key}, data, []int{len(data)}, frame.Float32, 0, &call{})
	if err != nil {
		t.Fatal(err)
	}
	return td
}

// results are the Result frames key's aggregators send this worker for an
// iteration, under the decision in force then.
func results(c *core, key, iter uint64) []frame.Header {
	tn := c.tensors[key]
	_, layout := c.layoutFor(tn, iter)
	var hs []frame.Header
	for _, p := range layout {
		hs = append(hs, frame.Header{
			Type: frame.Result, DType: tn.dtype, Sender: uint32(p.Aggregator), Recipient: uint32(c.self),
			Key: key, Partition: p.Index, Iteration: iter, Offset: p.Offset, Total: tn.bytes, Length: p.Length,
		})
	}
	return hs
}

// receive takes a Result frame the way HandleFrame does.
func receive(c *core, h *frame.Header, payload []byte) (effects, error) {
	l, inPlace, err := c.received(h)
	if err != nil {
		return effects{}, err
	}
	if !inPlace {
		copy(l.span, payload)
	}
	return c.land(l, h.Partition), nil
}

func finishedTS(t effects) []int {
	var ts []int
	for _, r := range t.finished {
		ts = append(ts, r.ts)
	}
	return ts
}

// copyStaged does the shell's part of a delivery: it copies the staged
// partitions into the pull's buffer, then reports it.
func copyStaged(c *core, d delivery) effects {
	for _, p := range d.parts {
		copy(d.pw.dst[p.Offset:p.Offset+p.Length], d.buf[p.Offset:p.Offset+p.Length])
	}
	return c.copied(d)
}

// pattern is a sum to deliver: byte i of iteration iter.
func pattern(n int, iter uint64) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i + 7*int(iter))
	}
	return b
}

// An FPTPull's result arrives partition by partition before, after or
// around the pull, through the copy path or read in place (sink): the
// pull completes exactly when the last partition is in, with every byte.
func TestCoreResultAssembly(t *testing.T) {
	// Ops: "pull"; "rN" a result partition N through the copy path; "sN"
	// partition N claimed by the sink (its bytes are read in place
	// later); "lN" partition N, sunk before, now read and handed over;
	// "copy" the shell's copy of the partitions staged before the pull,
	// which it makes outside the lock (at once after "pull" if the ops
	// have no "copy").
	tests := []struct {
		name string
		ops  []string
	}{
		{"results after the pull", []string{"pull", "r0", "r1", "r2", "r3"}},
		{"results before the pull", []string{"r0", "r3", "r1", "r2", "pull"}},
		{"half before, half after", []string{"r2", "r0", "pull", "r3", "r1"}},
		{"read in place after the pull", []string{"pull", "s1", "l1", "s0", "s2", "l2", "l0", "s3", "l3"}},
		{"staged in place, pull while reading", []string{"s0", "s1", "pull", "l0", "r2", "l1", "r3"}},
		{"staged in place before the pull", []string{"s0", "l0", "s1", "s2", "s3", "l3", "l1", "l2", "pull"}},
		{"the rest lands while the staged part is copied", []string{"r2", "r0", "pull", "r3", "r1", "copy"}},
		{"one lands while the staged part is copied", []string{"r2", "r0", "r1", "pull", "r3", "copy"}},
		{"staging finished while the staged part is copied", []string{"s0", "l0", "s1", "pull", "l1", "r2", "r3", "copy"}},
		{"copied before the rest lands", []string{"r1", "pull", "copy", "r0", "r2", "r3"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := startedCore(t, 0, 1, false)
			mustDeclare(t, c, 5, 64)
			handOver(c, mustPush(t, c, 5, make([]byte, 64))) // init round
			handOver(c, mustPush(t, c, 5, make([]byte, 64)))
			const iter = 1
			want := pattern(64, iter)
			hs := results(c, 5, iter)
			if len(hs) != 4 {
				t.Fatalf("%d partitions, want 4", len(hs))
			}
			// The init round's result, so that iteration 1 is the next pull.
			for _, h := range results(c, 5, 0) {
				if _, err := receive(c, &h, make([]byte, h.Length)); err != nil {
					t.Fatal(err)
				}
			}
			pr, err := c.pull([]uint64{5}, make([]byte, 64), []int{64}, frame.Float32, &call{})
			if err != nil {
				t.Fatal(err)
			}
			handOver(c, pr)
			for _, d := range pr.copies {
				copyStaged(c, d)
			}

			dst := make([]byte, 64)
			var pull *request
			sunk := map[uint32][]byte{}
			var copies []delivery
			completed := 0
			note := func(td effects) {
				for _, r := range td.finished {
					if r != pull {
						t.Fatalf("request %d finished, not the pull", r.ts)
					}
					completed++
				}
			}
			for i, op := range tt.ops {
				last := i == len(tt.ops)-1
				if op == "pull" {
					td, err := c.pull([]uint64{5}, dst, []int{64}, frame.Float32, &call{})
					if err != nil {
						t.Fatal(err)
					}
					pull = td.req
					note(c.handedOver(pull, nil))
					copies = td.copies
					if !slices.Contains(tt.ops, "copy") {
						for _, d := range copies {
							note(copyStaged(c, d))
						}
					}
				} else if op == "copy" {
					if len(copies) == 0 {
						t.Fatal("copy: the pull found nothing staged")
					}
					for _, d := range copies {
						// The core hands the copy to the shell, which makes
						// it outside the lock: staging can be gigabytes.
						for _, p := range d.parts {
							if !bytes.Equal(dst[p.Offset:p.Offset+p.Length], make([]byte, p.Length)) {
								t.Fatalf("partition %d was copied by the core, under the lock", p.Index)
							}
						}
						note(copyStaged(c, d))
					}
				} else {
					n, err := strconv.Atoi(op[1:])
					if err != nil {
						t.Fatal(err)
					}
					p := uint32(n)
					h := hs[p]
					payload := want[h.Offset : h.Offset+h.Length]
					switch op[0] {
					case 'r':
						td, err := receive(c, &h, payload)
						if err != nil {
							t.Fatalf("%s: %v", op, err)
						}
						note(td)
					case 's':
						span := c.sink(&h)
						if span == nil || len(span) != int(h.Length) {
							t.Fatalf("%s: sink gave %d bytes, want %d", op, len(span), h.Length)
						}
						if pull != nil && &span[0] != &dst[h.Offset] {
							t.Errorf("%s: the pull waits, yet the span is not its buffer", op)
						}
						sunk[p] = span
					case 'l':
						copy(sunk[p], payload) // the van reads into the span
						td, err := receive(c, &h, nil)
						if err != nil {
							t.Fatalf("%s: %v", op, err)
						}
						note(td)
					}
				}
				if completed > 0 && !last {
					t.Fatalf("the pull completed at %s, before its last partition", op)
				}
			}
			if completed != 1 {
				t.Fatalf("the pull completed %d times, want once", completed)
			}
			if !bytes.Equal(dst, want) {
				t.Errorf("pulled %v\nwant       %v", dst, want)
			}
			if len(c.results) != 0 || len(c.readingInPlace) != 0 {
				t.Errorf("%d results and %d partitions read in place left over", len(c.results), len(c.readingInPlace))
			}
		})
	}
}

// A result frame that is not exactly the partition the layout expects
// from its aggregator is refused, by sink and by received alike, and
// changes nothing: the right frame is still accepted after it.
func TestCoreRejectsBadResults(t *testing.T) {
	tests := []struct {
		name  string
		bad   func(h *frame.Header)
		error string
	}{
		{"wrong aggregator", func(h *frame.Header) { h.Sender = uint32(node.ServerID(1)) }, "belongs to"},
		{"wrong offset", func(h *frame.Header) { h.Offset += 4 }, "is ["},
		{"wrong length", func(h *frame.Header) { h.Length -= 4 }, "is ["},
		{"partition out of range", func(h *frame.Header) { h.Partition = 9 }, "partition 9 of 4"},
		{"wrong dtype", func(h *frame.Header) { h.DType = frame.Float64 }, "bytes of"},
		{"wrong total", func(h *frame.Header) { h.Total = 128 }, "bytes of"},
		{"iteration not pushed", func(h *frame.Header) { h.Iteration = 3 }, "pushed 2"},
		{"iteration already pulled", func(h *frame.Header) { h.Iteration = 0 }, "pulled 1"},
		{"undeclared key", func(h *frame.Header) { h.Key = 99 }, "undeclared"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := startedCore(t, 0, 2, false)
			mustDeclare(t, c, 5, 64)
			for range 2 {
				handOver(c, mustPush(t, c, 5, make([]byte, 64)))
			}
			for _, h := range results(c, 5, 0) {
				if _, err := receive(c, &h, make([]byte, h.Length)); err != nil {
					t.Fatal(err)
				}
			}
			pr, err := c.pull([]uint64{5}, make([]byte, 64), []int{64}, frame.Float32, &call{})
			if err != nil || len(pr.copies) != 1 {
				t.Fatalf("init pull: %v, %d copies", err, len(pr.copies))
			}
			copyStaged(c, pr.copies[0])

			good := results(c, 5, 1)[0]
			if node.ID(good.Sender) == node.ServerID(1) {
				good.Sender = uint32(node.ServerID(1))
				tt.bad = func(h *frame.Header) { h.Sender = uint32(node.ServerID(0)) }
			}
			bad := good
			tt.bad(&bad)
			if span := c.sink(&bad); span != nil {
				t.Errorf("sink took the bad frame")
			}
			_, err = receive(c, &bad, make([]byte, bad.Length))
			if err == nil || !strings.Contains(err.Error(), tt.error) {
				t.Errorf("received: %v, want an error with %q", err, tt.error)
			}
			if _, err := receive(c, &good, make([]byte, good.Length)); err != nil {
				t.Errorf("the right frame after the bad one: %v", err)
			}
		})
	}
}

// A partition received twice is refused, whether the first copy came
// through the van's buffer or was read in place.
func TestCoreRejectsDuplicates(t *testing.T) {
	for _, inPlace := range []bool{false, true} {
		c := startedCore(t, 0, 1, false)
		mustDeclare(t, c, 5, 64)
		handOver(c, mustPush(t, c, 5, make([]byte, 64)))
		h := results(c, 5, 0)[1]
		if inPlace {
			if c.sink(&h) == nil {
				t.Fatal("sink refused the first copy")
			}
			if c.sink(&h) != nil {
				t.Error("sink took a second copy")
			}
		}
		if _, err := receive(c, &h, make([]byte, h.Length)); err != nil {
			t.Fatal(err)
		}
		_, err := receive(c, &h, make([]byte, h.Length))
		if err == nil || !strings.Contains(err.Error(), "received twice") {
			t.Errorf("in place %v: second copy: %v, want received twice", inPlace, err)
		}
	}
}

// Iteration 0 is the init round: only worker 0 sends, flagged init; from
// iteration 1 every worker sends. A request with nothing to send finishes
// on its hand-over; one that sends finishes with its last frame written.
func TestCorePushRounds(t *testing.T) {
	tests := []struct {
		rank        int
		iter        uint64
		sends       int
		flags       uint8
		finishEarly bool // finished by the hand-over alone
	}{
		{0, 0, 4, frame.FlagInit, false},
		{1, 0, 0, 0, true},
		{0, 1, 4, 0, false},
		{1, 1, 4, 0, false},
	}
	for _, tt := range tests {
		c := startedCore(t, tt.rank, 1, false)
		mustDeclare(t, c, 5, 64)
		for range tt.iter {
			handOver(c, mustPush(t, c, 5, make([]byte, 64)))
		}
		data := pattern(64, tt.iter)
		td := mustPush(t, c, 5, data)
		if len(td.sends) != tt.sends || len(td.locals) != 0 {
			t.Fatalf("rank %d iteration %d: %d sends, %d locals; want %d, 0", tt.rank, tt.iter, len(td.sends), len(td.locals), tt.sends)
		}
		if td.began == nil || td.began.iter != tt.iter || td.began.modelBytes != 64 {
			t.Errorf("rank %d iteration %d: began %+v", tt.rank, tt.iter, td.began)
		}
		var got []byte
		for _, m := range td.sends {
			h := m.Header
			if h.Type != frame.Push || h.Flags != tt.flags || h.Iteration != tt.iter || node.ID(h.Recipient) != node.ServerID(0) ||
				node.ID(h.Sender) != node.WorkerID(tt.rank) || h.Length != uint64(len(m.Payload)) {
				t.Errorf("rank %d iteration %d: frame %s", tt.rank, tt.iter, &h)
			}
			got = append(got, m.Payload...)
		}
		if tt.sends > 0 && !bytes.Equal(got, data) {
			t.Errorf("rank %d iteration %d: the frames carry %v, want %v", tt.rank, tt.iter, got, data)
		}
		early := finishedTS(c.handedOver(td.req, nil))
		if (len(early) == 1) != tt.finishEarly {
			t.Fatalf("rank %d iteration %d: finished on hand-over: %v, want %v", tt.rank, tt.iter, early, tt.finishEarly)
		}
		for i := range td.sends {
			fin := finishedTS(c.sent(td.req, nil))
			if last := i == len(td.sends)-1; (len(fin) == 1) != last {
				t.Fatalf("frame %d of %d written: finished %v", i+1, len(td.sends), fin)
			}
		}
	}
}

// A frame lost on the way fails its push; later news of the request
// changes nothing.
func TestCorePushSendFailure(t *testing.T) {
	c := startedCore(t, 0, 1, false)
	mustDeclare(t, c, 5, 64)
	td := mustPush(t, c, 5, make([]byte, 64))
	if fin := c.handedOver(td.req, nil).finished; len(fin) != 0 {
		t.Fatal("finished before its frames were written")
	}
	fin := c.sent(td.req, errors.New("peer gone")).finished
	if len(fin) != 1 || fin[0].err == nil || !strings.Contains(fin[0].err.Error(), "peer gone") {
		t.Fatalf("finished %v", fin)
	}
	for range 3 {
		if fin := c.sent(td.req, nil).finished; len(fin) != 0 {
			t.Fatal("a finished request finished again")
		}
	}
}

// With the LB on nothing is pushed beyond the horizon; a push beyond it
// changes nothing, and goes through once a directive raises it.
func TestCoreHorizon(t *testing.T) {
	c := startedCore(t, 0, 1, true)
	mustDeclare(t, c, 5, 64)
	handOver(c, mustPush(t, c, 5, make([]byte, 64))) // iteration 0 is within horizon 0
	ts := c.lastTS
	if _, err := c.push([]uint64{5}, make([]byte, 64), []int{64}, frame.Float32, 0, &call{}); !errors.Is(err, errHorizon) {
		t.Fatalf("push of iteration 1 with horizon 0: %v", err)
	}
	if c.tensors[5].pushed != 1 || c.lastTS != ts {
		t.Fatal("a push beyond the horizon changed the state")
	}
	for _, tt := range []struct {
		horizon uint64
		moved   bool
	}{{1, true}, {1, false}, {0, false}, {3, true}} {
		_, moved, err := c.follow(lb.Directive{Horizon: tt.horizon})
		if err != nil || moved != tt.moved {
			t.Errorf("horizon %d: moved %v, %v; want %v", tt.horizon, moved, err, tt.moved)
		}
	}
	for iter := 1; iter <= 3; iter++ {
		handOver(c, mustPush(t, c, 5, make([]byte, 64)))
	}
	if _, err := c.push([]uint64{5}, make([]byte, 64), []int{64}, frame.Float32, 0, &call{}); !errors.Is(err, errHorizon) {
		t.Fatalf("push of iteration 4 with horizon 3: %v", err)
	}
}

// Decisions join the schedule in version order, beyond the granted
// horizon; a missing or late one is refused and changes nothing.
func TestCoreFollowDecisions(t *testing.T) {
	s0 := []node.ID{node.ServerID(0)}
	tests := []struct {
		name    string
		lbOn    bool
		d       lb.Decision
		horizon uint64
		error   string
	}{
		{"next version beyond the horizon", true, lb.Even(1, 5, s0), 4, ""},
		{"a version skipped", true, lb.Even(2, 5, s0), 4, "one is missing"},
		{"a version repeated", true, lb.Even(0, 5, s0), 4, "one is missing"},
		{"within the granted horizon", true, lb.Even(1, 4, s0), 4, "within the horizon"},
		{"LB off: any iteration", false, lb.Even(1, 0, s0), 0, ""},
		{"invalid decision", true, lb.Decision{Version: 1, Iteration: 9}, 4, "worker: lb"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := startedCore(t, 0, 1, tt.lbOn)
			if tt.lbOn {
				if _, _, err := c.follow(lb.Directive{Horizon: tt.horizon}); err != nil {
					t.Fatal(err)
				}
			}
			_, _, err := c.follow(lb.Directive{Decision: &tt.d, Horizon: 10})
			if tt.error == "" {
				if err != nil || c.decisionVersion() != tt.d.Version {
					t.Fatalf("%v; version %d", err, c.decisionVersion())
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.error) {
				t.Fatalf("%v, want an error with %q", err, tt.error)
			}
			if c.decisionVersion() != 0 || (tt.lbOn && c.horizon != tt.horizon) {
				t.Errorf("a refused directive changed the state: version %d, horizon %d", c.decisionVersion(), c.horizon)
			}
		})
	}
	// Before start a decision waits for it (TestCoreDirectivesBeforeStart);
	// one out of order fails the start.
	c := newCore(testPartBytes, false)
	d := lb.Even(2, 5, s0)
	if _, _, err := c.follow(lb.Directive{Decision: &d}); err != nil {
		t.Fatalf("a decision before start: %v", err)
	}
	if err := c.start(node.WorkerID(0), s0, testWorkers(1)); err == nil {
		t.Error("a decision out of order before start accepted")
	}
}

// A decision that makes this worker an aggregator from iteration 2: its
// own contributions are added locally from then on, earlier iterations
// keep their old layout, and a result of iteration 2 from the server that
// owned the key before is refused.
func TestCoreDecisionSwitch(t *testing.T) {
	c := startedCore(t, 0, 1, false)
	mustDeclare(t, c, 5, 64)
	self := node.WorkerID(0)
	d := lb.Decision{Version: 1, Iteration: 2, Aggregators: []node.ID{self}, Shares: []float64{1}}
	if _, _, err := c.follow(lb.Directive{Decision: &d}); err != nil {
		t.Fatal(err)
	}
	for iter, wantLocal := range []bool{false, false, true, true} {
		td := mustPush(t, c, 5, make([]byte, 64))
		if wantLocal != (len(td.locals) == 4 && len(td.sends) == 0) {
			t.Errorf("iteration %d: %d locals, %d sends", iter, len(td.locals), len(td.sends))
		}
		for _, m := range td.locals {
			if node.ID(m.Header.Recipient) != self || m.Header.Aux != 1 {
				t.Errorf("iteration %d: local %s", iter, &m.Header)
			}
		}
		handOver(c, td)
	}
	old := results(c, 5, 1)[0]
	if node.ID(old.Sender) != node.ServerID(0) {
		t.Fatalf("iteration 1's result comes from %s", node.ID(old.Sender))
	}
	if _, err := receive(c, &old, make([]byte, old.Length)); err != nil {
		t.Errorf("iteration 1 from the server: %v", err)
	}
	stale := results(c, 5, 2)[0]
	stale.Sender = uint32(node.ServerID(0))
	if _, err := receive(c, &stale, make([]byte, stale.Length)); err == nil {
		t.Error("iteration 2 from the server that no longer owns it accepted")
	}
}

// Calls the core refuses, before any request is made.
func TestCoreRefusesBadCalls(t *testing.T) {
	c := startedCore(t, 0, 1, false)
	mustDeclare(t, c, 1, 16)
	mustDeclare(t, c, 2, 8)
	buf := make([]byte, 24)
	tests := []struct {
		name  string
		call  func() error
		error error
	}{
		{"undeclared key", func() error {
			_, err := c.push([]uint64{9}, buf[:16], []int{16}, frame.Float32, 0, &call{})
			return err
		}, ErrNotDeclared},
		{"wrong size", func() error {
			_, err := c.push([]uint64{1}, buf[:12], []int{12}, frame.Float32, 0, &call{})
			return err
		}, ErrSizeMismatch},
		{"lengths and data disagree", func() error {
			_, err := c.push([]uint64{1, 2}, buf[:20], []int{16, 8}, frame.Float32, 0, &call{})
			return err
		}, ErrSizeMismatch},
		{"pull before push", func() error { _, err := c.pull([]uint64{1}, buf[:16], []int{16}, frame.Float32, &call{}); return err }, ErrPullBeforePush},
		{"redeclared with another size", func() error { return c.declare(1, frame.Float32, 32, 0) }, ErrSizeMismatch},
		{"key twice", func() error {
			_, err := c.push([]uint64{1, 1}, make([]byte, 32), []int{16, 16}, frame.Float32, 0, &call{})
			return err
		}, nil},
		{"wrong dtype", func() error {
			_, err := c.push([]uint64{1}, buf[:16], []int{16}, frame.Float64, 0, &call{})
			return err
		}, nil},
		{"more tensors than announced", func() error {
			if err := c.setTensorsPerIteration(2); err != nil {
				return nil
			}
			return c.declare(3, frame.Float32, 4, 0)
		}, nil},
	}
	for _, tt := range tests {
		err := tt.call()
		if err == nil || (tt.error != nil && !errors.Is(err, tt.error)) {
			t.Errorf("%s: %v, want %v", tt.name, err, tt.error)
		}
	}
	if c.lastTS != 0 || c.tensors[1].pushed != 0 {
		t.Errorf("refused calls left requests (%d) or pushes (%d)", c.lastTS, c.tensors[1].pushed)
	}
	if _, err := newCore(testPartBytes, false).push(nil, nil, nil, frame.Float32, 0, &call{}); err == nil {
		t.Error("a push before start accepted")
	}
}

// Classic requests: one frame per chunk to the key's server; a push
// finishes with its last ack, a pull with the last byte of every key, a
// refusal at once with the server's reason; replies that do not fit are
// protocol errors.
func TestCoreClassic(t *testing.T) {
	c := startedCore(t, 0, 2, false)
	keys := []uint64{1, 1 << 63}
	lens := []int{40, 8} // 40 bytes: chunks of 16, 16, 8
	data := pattern(48, 0)

	td, err := c.kvRequest(frame.KVPush, keys, data, nil, lens, frame.Float32, &call{})
	if err != nil {
		t.Fatal(err)
	}
	var to []node.ID
	for _, m := range td.sends {
		to = append(to, node.ID(m.Header.Recipient))
		if m.Header.Aux != uint32(td.req.ts) {
			t.Errorf("frame %s does not name request %d", &m.Header, td.req.ts)
		}
	}
	if want := []node.ID{node.ServerID(0), node.ServerID(0), node.ServerID(0), node.ServerID(1)}; !slices.Equal(to, want) {
		t.Fatalf("push frames go to %v, want %v", to, want)
	}
	c.handedOver(td.req, nil)
	for i, m := range td.sends {
		ack := m.Header
		ack.Type, ack.Sender, ack.Recipient = frame.KVAck, ack.Recipient, ack.Sender
		_, rt, err := c.kvReply(&ack, nil)
		if err != nil {
			t.Fatal(err)
		}
		if last := i == len(td.sends)-1; (len(rt.finished) == 1) != last {
			t.Fatalf("ack %d of %d: finished %v", i+1, len(td.sends), finishedTS(rt))
		}
	}

	out := make([]byte, 48)
	pull, err := c.kvRequest(frame.KVPull, keys, out, out, lens, frame.Float32, &call{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pull.sends) != 2 {
		t.Fatalf("a pull of 2 keys sends %d frames", len(pull.sends))
	}
	c.handedOver(pull.req, nil)
	reply := func(key uint64, off, n, total uint64) frame.Header {
		return frame.Header{Type: frame.KVData, DType: frame.Float32, Sender: uint32(node.ServerID(0)), Key: key,
			Offset: off, Length: n, Total: total, Aux: uint32(pull.req.ts)}
	}
	finished := 0
	for _, h := range []frame.Header{reply(1, 16, 24, 40), reply(1<<63, 0, 8, 8), reply(1, 0, 16, 40)} {
		span, _, err := c.kvReply(&h, nil)
		if err != nil {
			t.Fatal(err)
		}
		base := 0
		if h.Key != 1 {
			base = 40
		}
		copy(span, data[base+int(h.Offset):base+int(h.Offset+h.Length)])
		finished += len(c.kvLanded(&h).finished)
	}
	if finished != 1 || !bytes.Equal(out, data) {
		t.Fatalf("pull finished %d times, got %v", finished, out)
	}

	bad := []struct {
		name string
		h    frame.Header
	}{
		{"data of a key the request lacks", frame.Header{Type: frame.KVData, Key: 7, Length: 4, Total: 4}},
		{"data of the wrong size", frame.Header{Type: frame.KVData, Key: 1, Length: 4, Total: 44}},
		{"data beyond the key", frame.Header{Type: frame.KVData, Key: 1, Offset: 40, Length: 4, Total: 40}},
		{"an ack for a pull", frame.Header{Type: frame.KVAck, Key: 1}},
	}
	for _, b := range bad {
		again, err := c.kvRequest(frame.KVPull, keys, out, out, lens, frame.Float32, &call{})
		if err != nil {
			t.Fatal(err)
		}
		b.h.Aux = uint32(again.req.ts)
		if _, _, err := c.kvReply(&b.h, nil); err == nil {
			t.Errorf("%s accepted", b.name)
		}
	}
	unknown := frame.Header{Type: frame.KVAck, Aux: 999}
	if _, _, err := c.kvReply(&unknown, nil); err == nil {
		t.Error("a reply to no request accepted")
	}

	refused, err := c.kvRequest(frame.KVPull, keys, out, out, lens, frame.Float32, &call{})
	if err != nil {
		t.Fatal(err)
	}
	h := frame.Header{Type: frame.KVError, Sender: uint32(node.ServerID(1)), Key: 1 << 63, Aux: uint32(refused.req.ts)}
	_, rt, err := c.kvReply(&h, []byte("never pushed"))
	if err != nil || len(rt.finished) != 1 || !strings.Contains(rt.finished[0].err.Error(), "never pushed") {
		t.Fatalf("refusal: %v, finished %v", err, finishedTS(rt))
	}

	if _, err := c.kvRequest(frame.KVPush, []uint64{5, 3}, make([]byte, 8), nil, []int{4, 4}, frame.Float32, &call{}); err == nil {
		t.Error("unsorted keys accepted")
	}
}

// A failure settles every outstanding request with it, each once and in
// the order they were made, whatever they waited for; new requests are
// refused; Wait's bookkeeping hands each error to the first Wait only.
func TestCoreFailure(t *testing.T) {
	c := startedCore(t, 0, 1, false)
	mustDeclare(t, c, 5, 64)
	init := mustPush(t, c, 5, make([]byte, 64))
	handOver(c, init)
	c.release(init.req)
	push := mustPush(t, c, 5, make([]byte, 64)) // frames not written
	c.handedOver(push.req, nil)
	pull, err := c.pull([]uint64{5}, make([]byte, 64), []int{64}, frame.Float32, &call{}) // no result yet
	if err != nil {
		t.Fatal(err)
	}
	c.handedOver(pull.req, nil)
	classic, err := c.kvRequest(frame.KVPull, []uint64{1}, make([]byte, 4), make([]byte, 4), []int{4}, frame.Float32, &call{})
	if err != nil {
		t.Fatal(err)
	}

	cause := errors.New("node lost")
	ft := c.fail(cause)
	if got, want := finishedTS(ft), []int{push.req.ts, pull.req.ts, classic.req.ts}; !slices.Equal(got, want) {
		t.Fatalf("failure finished %v, want %v", got, want)
	}
	for _, r := range ft.finished {
		if !errors.Is(r.err, cause) {
			t.Errorf("request %d: %v", r.ts, r.err)
		}
	}
	if len(c.fail(cause).finished) != 0 || len(c.handedOver(classic.req, nil).finished) != 0 || len(c.sent(push.req, nil).finished) != 0 {
		t.Error("a request finished twice")
	}
	if _, err := c.push([]uint64{5}, make([]byte, 64), []int{64}, frame.Float32, 0, &call{}); !errors.Is(err, cause) {
		t.Errorf("push after the failure: %v", err)
	}

	// Released (their callbacks returned), their errors wait for Wait.
	for _, r := range ft.finished {
		if r, err := c.lookup(r.ts); r == nil || err != nil {
			t.Fatalf("request still outstanding until released: %v, %v", r, err)
		}
		c.release(r)
	}
	for _, tt := range []struct {
		ts  int
		err error
	}{
		{push.req.ts, cause},
		{push.req.ts, nil}, // the first Wait took it
		{init.req.ts, nil}, // succeeded
		{0, ErrNoRequest},
		{99, ErrNoRequest},
	} {
		r, err := c.lookup(tt.ts)
		if r != nil || (tt.err == nil) != (err == nil) || (tt.err != nil && !errors.Is(err, tt.err)) {
			t.Errorf("Wait(%d): %v, %v; want %v", tt.ts, r, err, tt.err)
		}
	}
	// A Wait that was blocked collects once the request is released.
	if err := c.collect(pull.req.ts); !errors.Is(err, cause) {
		t.Errorf("collect: %v", err)
	}
	if err := c.collect(pull.req.ts); err != nil {
		t.Errorf("second collect: %v", err)
	}
}

// The memory Init's values are kept in goes back to the shell exactly once,
// and only when no key refers to it and no pull is copying out of it.
func TestCoreKeptInitial(t *testing.T) {
	const n = 64
	mem := func() []byte { return bytes.Repeat([]byte{7}, 2*n) }
	keep := func(c *core, m []byte) effects {
		return c.keepInitial([]uint64{1, 2}, m, []int{n, n})
	}
	pull := func(t *testing.T, c *core, key uint64) effects {
		t.Helper()
		dst := make([]byte, n)
		td, err := c.pull([]uint64{key}, dst, []int{n}, frame.Float32, newCall(nil, true))
		if err != nil {
			t.Fatal(err)
		}
		if len(td.initials) != 1 || !bytes.Equal(td.initials[0].src, mem()[:n]) {
			t.Fatalf("pull after Init: initials %v, want one copy of the kept values", td.initials)
		}
		return td
	}
	unmapped := func(t *testing.T, step string, td effects, want int) {
		t.Helper()
		if len(td.unmap) != want {
			t.Fatalf("%s: %d regions to unmap, want %d", step, len(td.unmap), want)
		}
	}
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, c *core)
	}{
		{"freed when the last key is pushed", func(t *testing.T, c *core) {
			unmapped(t, "keep", keep(c, mem()), 0)
			unmapped(t, "push key 1", mustPush(t, c, 1, pattern(n, 0)), 0)
			unmapped(t, "push key 2", mustPush(t, c, 2, pattern(n, 0)), 1)
		}},
		{"a pull copying out holds it past the push", func(t *testing.T, c *core) {
			keep(c, mem())
			cp := pull(t, c, 1)
			mustPush(t, c, 2, pattern(n, 0))
			unmapped(t, "push key 1 while its pull copies", mustPush(t, c, 1, pattern(n, 0)), 0)
			unmapped(t, "copied", c.initialCopied(cp.initials), 1)
		}},
		{"a second Init replaces the first", func(t *testing.T, c *core) {
			keep(c, mem())
			unmapped(t, "second keep", keep(c, mem()), 1)
		}},
		{"failure frees it, and a later keep at once", func(t *testing.T, c *core) {
			keep(c, mem())
			unmapped(t, "fail", c.fail(errors.New("boom")), 1)
			unmapped(t, "keep after the failure", keep(c, mem()), 1)
		}},
		{"not kept for a key pushed since", func(t *testing.T, c *core) {
			mustPush(t, c, 1, pattern(n, 0))
			mustPush(t, c, 2, pattern(n, 0))
			unmapped(t, "keep after pushes", keep(c, mem()), 1)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := startedCore(t, 0, 2, false)
			mustDeclare(t, c, 1, n)
			mustDeclare(t, c, 2, n)
			tc.run(t, c)
		})
	}
}
