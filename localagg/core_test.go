package localagg

import (
	"errors"
	"reflect"
	"testing"

	"github.com/fptps/fpt/node"
)

var (
	w0, w1, w2, w3 = node.WorkerID(0), node.WorkerID(1), node.WorkerID(2), node.WorkerID(3)
	a0             = Slot{Key: 7, Part: 0, Iter: 0}
	b0             = Slot{Key: 7, Part: 1, Iter: 0}
	a1             = Slot{Key: 7, Part: 0, Iter: 1}
	a2             = Slot{Key: 7, Part: 0, Iter: 2}
)

// step is one input to a Core and what it must answer.
type step struct {
	op   string // declare, arrive, result, read, lose, retry, done, join
	m    node.ID
	s    Slot
	n    uint64 // digest, iteration (retry, done, join)
	want Effects
	err  error // errors.Is; nil: none
}

func run(t *testing.T, c *Core, steps []step) {
	t.Helper()
	for i, st := range steps {
		var got Effects
		var err error
		switch st.op {
		case "declare":
			err = c.Declared(st.m, st.n)
		case "arrive":
			got, err = c.Arrived(st.m, st.s)
		case "result":
			got, err = c.ResultIn(st.s)
		case "read":
			got, err = c.Read(st.m, st.s)
		case "lose":
			got, err = c.Lose(st.m)
		case "retry":
			got, err = c.Retry(st.n)
		case "done":
			got = c.Done(st.n)
		case "join":
			err = c.Join(st.m, st.n)
		default:
			t.Fatalf("step %d: unknown op %q", i, st.op)
		}
		switch {
		case st.err == nil && err != nil:
			t.Fatalf("step %d (%s %s %s): %v", i, st.op, st.m, st.s, err)
		case st.err == errAny && err == nil:
			t.Fatalf("step %d (%s %s %s): no error", i, st.op, st.m, st.s)
		case st.err != nil && st.err != errAny && !errors.Is(err, st.err):
			t.Fatalf("step %d (%s %s %s): error %v, want %v", i, st.op, st.m, st.s, err, st.err)
		case st.err == nil && !reflect.DeepEqual(got, st.want):
			t.Fatalf("step %d (%s %s %s):\n got %+v\nwant %+v", i, st.op, st.m, st.s, got, st.want)
		}
	}
}

func declareAll(ms ...node.ID) []step {
	var s []step
	for _, m := range ms {
		s = append(s, step{op: "declare", m: m, n: 42})
	}
	return s
}

func sums(s Slot, first node.ID, rest ...node.ID) []Sum {
	out := []Sum{{Slot: s, From: first, First: true}}
	for _, m := range rest {
		out = append(out, Sum{Slot: s, From: m})
	}
	return out
}

func add(s Slot, m node.ID, first bool) Effects {
	return Effects{Sums: []Sum{{Slot: s, From: m, First: first}}}
}

func TestCore(t *testing.T) {
	type tc struct {
		name    string
		members []node.ID
		depth   int
		loss    Loss
		steps   []step
	}
	cat := func(parts ...[]step) []step {
		var s []step
		for _, p := range parts {
			s = append(s, p...)
		}
		return s
	}
	tests := []tc{
		{"one member sends its own contribution", []node.ID{w0}, 2, LossFail, cat(declareAll(w0), []step{
			{op: "arrive", m: w0, s: a0, want: Effects{Sums: sums(a0, w0), Sends: []Send{{a0, 1}}}},
			{op: "result", s: a0, want: Effects{Publish: []Slot{a0}}},
			{op: "read", m: w0, s: a0, want: Effects{Frees: []Slot{a0}}},
		})},
		{"summed as they arrive, sent at the last", []node.ID{w2, w0, w1}, 2, LossFail, cat(declareAll(w0, w1, w2), []step{
			{op: "arrive", m: w1, s: a0, want: add(a0, w1, true)},
			{op: "arrive", m: w1, s: b0, want: add(b0, w1, true)},
			{op: "arrive", m: w2, s: a0, want: add(a0, w2, false)},
			{op: "arrive", m: w0, s: a0, want: Effects{Sums: []Sum{{a0, w0, false}}, Sends: []Send{{a0, 3}}}},
			{op: "result", s: a0, want: Effects{Publish: []Slot{a0}}},
			{op: "read", m: w0, s: a0},
			{op: "read", m: w2, s: a0},
			{op: "read", m: w1, s: a0, want: Effects{Frees: []Slot{a0}}},
		})},
		{"no sum before every member declared", []node.ID{w0, w1}, 2, LossFail, []step{
			{op: "declare", m: w0, n: 1},
			{op: "arrive", m: w0, s: a0, err: errAny},
		}},
		{"members that disagree fail the group", []node.ID{w0, w1}, 2, LossFail, []step{
			{op: "declare", m: w0, n: 1},
			{op: "declare", m: w1, n: 2, err: ErrDisagree},
			{op: "arrive", m: w0, s: a0, err: ErrFailed},
			{op: "result", s: a0, err: ErrFailed},
		}},
		{"bad input is refused", []node.ID{w0, w1}, 2, LossFail, cat(declareAll(w0, w1), []step{
			{op: "arrive", m: w3, s: a0, err: ErrMember},
			{op: "arrive", m: w0, s: a0, want: add(a0, w0, true)},
			{op: "arrive", m: w0, s: a0, err: ErrTwice},
			{op: "result", s: a0, err: ErrNotSent},
			{op: "result", s: b0, err: ErrNotSent},
			{op: "read", m: w0, s: a0, err: ErrNoResult},
			{op: "arrive", m: w1, s: a0, want: Effects{Sums: []Sum{{a0, w1, false}}, Sends: []Send{{a0, 2}}}},
			{op: "result", s: a0, want: Effects{Publish: []Slot{a0}}},
			{op: "result", s: a0, err: ErrNotSent},
		})},
		{"the segment holds depth iterations", []node.ID{w0, w1}, 2, LossFail, cat(declareAll(w0, w1), []step{
			{op: "arrive", m: w0, s: a0, want: add(a0, w0, true)},
			{op: "arrive", m: w0, s: a1, want: add(a1, w0, true)},
			{op: "arrive", m: w0, s: a2, err: ErrWindow},
			{op: "arrive", m: w1, s: a0, want: Effects{Sums: []Sum{{a0, w1, false}}, Sends: []Send{{a0, 2}}}},
			{op: "result", s: a0, want: Effects{Publish: []Slot{a0}}},
			{op: "read", m: w0, s: a0},
			{op: "read", m: w1, s: a0, want: Effects{Frees: []Slot{a0}}},
			{op: "arrive", m: w0, s: a2, want: add(a2, w0, true)},
		})},
		{"a lost member fails the group under fail", []node.ID{w0, w1}, 2, LossFail, cat(declareAll(w0, w1), []step{
			{op: "arrive", m: w0, s: a0, want: add(a0, w0, true)},
			{op: "lose", m: w1, err: errAny},
			{op: "arrive", m: w1, s: a0, err: ErrFailed},
		})},
		{"continue: a lost member's unsent contribution is summed out", []node.ID{w0, w1, w2}, 2, LossContinue, cat(declareAll(w0, w1, w2), []step{
			{op: "arrive", m: w0, s: a0, want: add(a0, w0, true)},
			{op: "arrive", m: w2, s: a0, want: add(a0, w2, false)},
			{op: "arrive", m: w2, s: b0, want: add(b0, w2, true)},
			// w2 lost: a0 summed again from w0 alone; b0 held w2 only.
			{op: "lose", m: w2, want: Effects{Resums: []Slot{a0, b0}, Sums: sums(a0, w0)}},
			{op: "arrive", m: w1, s: a0, want: Effects{Sums: []Sum{{a0, w1, false}}, Sends: []Send{{a0, 2}}}},
		})},
		{"continue: the last missing member lost sends the sum", []node.ID{w0, w1}, 2, LossContinue, cat(declareAll(w0, w1), []step{
			{op: "arrive", m: w0, s: a0, want: add(a0, w0, true)},
			{op: "lose", m: w1, want: Effects{Sends: []Send{{a0, 1}}}},
		})},
		{"continue: a lost leader hands the lead on, the retry sums again", []node.ID{w0, w1, w2}, 2, LossContinue, cat(declareAll(w0, w1, w2), []step{
			{op: "arrive", m: w0, s: a0, want: add(a0, w0, true)},
			{op: "arrive", m: w1, s: a0, want: add(a0, w1, false)},
			{op: "arrive", m: w2, s: a0, want: Effects{Sums: []Sum{{a0, w2, false}}, Sends: []Send{{a0, 3}}}},
			{op: "lose", m: w0, want: Effects{Leader: w1}},
			{op: "retry", n: 0, want: Effects{Resums: []Slot{a0}, Sums: sums(a0, w1, w2), Sends: []Send{{a0, 2}}}},
			{op: "result", s: a0, want: Effects{Publish: []Slot{a0}}},
			{op: "read", m: w1, s: a0},
			// Kept until every worker has the sum: a retry may need it.
			{op: "read", m: w2, s: a0},
			{op: "done", n: 1, want: Effects{Frees: []Slot{a0}}},
		})},
		{"continue: a published result is published again after a retry", []node.ID{w0, w1}, 2, LossContinue, cat(declareAll(w0, w1), []step{
			{op: "arrive", m: w0, s: a0, want: add(a0, w0, true)},
			{op: "arrive", m: w1, s: a0, want: Effects{Sums: []Sum{{a0, w1, false}}, Sends: []Send{{a0, 2}}}},
			{op: "result", s: a0, want: Effects{Publish: []Slot{a0}}},
			{op: "read", m: w0, s: a0},
			{op: "retry", n: 0, want: Effects{Resums: []Slot{a0}, Sums: sums(a0, w0, w1), Sends: []Send{{a0, 2}}}},
			{op: "result", s: a0, want: Effects{Publish: []Slot{a0}}},
			{op: "read", m: w0, s: a0},
			{op: "read", m: w1, s: a0},
			{op: "done", n: 1, want: Effects{Frees: []Slot{a0}}},
		})},
		{"the last member lost fails the group", []node.ID{w0}, 2, LossContinue, cat(declareAll(w0), []step{
			{op: "lose", m: w0, err: errAny},
		})},
		{"a joining member contributes from its first iteration", []node.ID{w0}, 3, LossContinue, cat(declareAll(w0), []step{
			{op: "arrive", m: w0, s: a0, want: Effects{Sums: sums(a0, w0), Sends: []Send{{a0, 1}}}},
			{op: "join", m: w1, n: 0, err: errAny}, // iteration 0 has begun
			{op: "join", m: w1, n: 1},
			{op: "arrive", m: w1, s: a1, err: errAny}, // not declared yet
			{op: "declare", m: w1, n: 42},
			{op: "arrive", m: w1, s: a0, err: ErrMember},
			{op: "arrive", m: w0, s: a1, want: add(a1, w0, true)},
			{op: "arrive", m: w1, s: a1, want: Effects{Sums: []Sum{{a1, w1, false}}, Sends: []Send{{a1, 2}}}},
			{op: "result", s: a0, want: Effects{Publish: []Slot{a0}}},
			{op: "read", m: w0, s: a0}, // w1 need not read iteration 0, kept until done
			{op: "done", n: 1, want: Effects{Frees: []Slot{a0}}},
		})},
		{"a joining member with a lower id does not take the lead", []node.ID{w2}, 2, LossContinue, cat(declareAll(w2), []step{
			{op: "join", m: w0, n: 0},
			{op: "declare", m: w0, n: 42},
			{op: "lose", m: w2, want: Effects{Leader: w0}},
		})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := NewCore(tt.members, tt.depth, tt.loss)
			if err != nil {
				t.Fatal(err)
			}
			run(t, c, tt.steps)
		})
	}
}

// errAny stands for any error, where the error wraps no sentinel.
var errAny = errors.New("any error")

func TestNewCoreRefuses(t *testing.T) {
	for _, tc := range []struct {
		ms    []node.ID
		depth int
	}{{nil, 1}, {[]node.ID{w0}, 0}, {[]node.ID{w0, w0}, 1}} {
		if _, err := NewCore(tc.ms, tc.depth, LossFail); err == nil {
			t.Errorf("NewCore(%v, %d): no error", tc.ms, tc.depth)
		}
	}
}
