package aggregator

import (
	"io"
	"log/slog"
	"slices"
	"testing"

	"github.com/fptps/fpt/cluster"
	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/node"
)

// unstarted returns the aggregator of a server of a job with the given
// number of workers that has not joined a cluster: it can send nothing,
// so no round may complete.
func unstarted(workers int) *Aggregator {
	cfg := config.Config{Role: node.Server, NumServers: 1, NumWorkers: workers}
	return New(cluster.New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), cluster.Planes{}), nil)
}

// TestRetryDropsStale: after a retry decision the aggregator forgets the
// partial sums it superseded and drops later pushes cut under an older
// version for the iterations it re-cut, so that no sum mixes two cuts.
// No round completes here (two workers, one push each at most), so the
// aggregator needs no cluster: nothing is sent.
func TestRetryDropsStale(t *testing.T) {
	type op struct {
		retry   bool // Follow a retry directive (version, iter) instead of a push
		worker  int
		local   bool // AddLocal rather than HandlePush
		adopt   bool // the van read it into PayloadBuffer's buffer
		iter    uint64
		version uint32
		pending int // table.Pending() afterwards
	}
	push := func(worker int, iter uint64, version uint32, pending int) op {
		return op{worker: worker, iter: iter, version: version, pending: pending}
	}
	retry := func(version uint32, from uint64, pending int) op {
		return op{retry: true, iter: from, version: version, pending: pending}
	}
	with := func(o op, f func(*op)) op { f(&o); return o }
	adopted := func(o *op) { o.adopt = true }
	cases := []struct {
		name string
		ops  []op
	}{
		{"partial sums from the retry's iteration on under older versions go", []op{
			push(0, 4, 1, 1), push(0, 5, 1, 2), push(0, 6, 1, 3), push(0, 6, 2, 4),
			retry(2, 5, 2), // 5 and 6 under v1
		}},
		{"a late push of a re-cut iteration is dropped", []op{
			push(0, 5, 1, 1),
			retry(2, 5, 0),
			push(1, 5, 1, 0), push(1, 7, 0, 0),
			with(push(1, 6, 1, 0), adopted),
			with(push(0, 5, 1, 0), func(o *op) { o.local = true }),
		}},
		{"pushes before the retry's iteration, or under its version, count", []op{
			retry(2, 5, 0),
			push(1, 4, 1, 1),
			push(1, 5, 2, 2),
			with(push(0, 6, 3, 3), adopted),
			with(push(0, 7, 2, 4), func(o *op) { o.local = true }),
		}},
		{"every retry applies", []op{
			retry(2, 5, 0),
			retry(3, 8, 0),
			push(0, 6, 2, 1), // re-cut at 5 under v2, not at 8
			push(0, 8, 2, 1),
			push(0, 5, 1, 1),
			push(0, 9, 3, 2),
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := unstarted(2)
			// This node follows every version the pushes are cut under
			// (pushes under a later one wait: TestFollowLostWorker).
			a.Follow(lb.Directive{Decision: &lb.Decision{Version: 3}})
			for i, o := range tc.ops {
				h := &frame.Header{Type: frame.Push, DType: frame.Float32, Sender: uint32(node.WorkerID(o.worker)),
					Key: 3, Partition: 1, Iteration: o.iter, Aux: o.version, Total: 64, Length: 8}
				var err error
				before := a.table.Pending()
				switch {
				case o.retry:
					a.Follow(lb.Directive{Retry: true, Decision: &lb.Decision{Version: o.version, Iteration: o.iter}})
				case o.local:
					err = a.AddLocal(h, make([]byte, h.Length))
				case o.adopt:
					buf := a.PayloadBuffer(h)
					err = a.HandlePush(h, buf, true)
					// A dropped push's buffer goes back to the table; a
					// counted one's is the round's sum.
					dropped := a.table.Pending() == before
					again := a.table.Buffer(int(h.Length))
					if reused := &again[0] == &buf[0]; reused != dropped {
						t.Fatalf("op %d (%+v): dropped %v, but its buffer handed out again: %v", i, o, dropped, reused)
					}
					a.table.Recycle(again)
				default:
					err = a.HandlePush(h, make([]byte, h.Length), false)
				}
				if err != nil {
					t.Fatalf("op %d (%+v): %v", i, o, err)
				}
				if got := a.table.Pending(); got != o.pending {
					t.Fatalf("op %d (%+v): %d partitions pending, want %d", i, o, got, o.pending)
				}
			}
		})
	}
}

// TestFollowWorkerSets: a decision naming workers sets them from its
// iteration on, replacing the sets taking effect there or later; one that
// names none leaves them. A push from a worker of an earlier set only is
// a lost worker's, dropped; from one that joins later, an error.
func TestFollowWorkerSets(t *testing.T) {
	w := node.WorkerID
	type want struct {
		iter    uint64
		workers []node.ID
	}
	cases := []struct {
		name    string
		follow  []lb.Decision // Version is set in order
		want    []want
		dropped []want // pushes from these workers of this iteration are dropped without error
		refused []want // and these are errors
	}{
		{"the job's workers at first", nil,
			[]want{{0, []node.ID{w(0), w(1), w(2)}}, {1 << 40, []node.ID{w(0), w(1), w(2)}}},
			nil, []want{{0, []node.ID{w(3), node.ServerID(0)}}}},
		{"a lost worker", []lb.Decision{{Iteration: 5, Workers: []node.ID{w(0), w(2)}}, {Iteration: 8}},
			[]want{{4, []node.ID{w(0), w(1), w(2)}}, {5, []node.ID{w(0), w(2)}}, {9, []node.ID{w(0), w(2)}}},
			[]want{{5, []node.ID{w(1)}}, {100, []node.ID{w(1)}}}, nil},
		{"a joining worker", []lb.Decision{{Iteration: 5, Workers: []node.ID{w(0), w(1), w(2), w(3)}}},
			[]want{{4, []node.ID{w(0), w(1), w(2)}}, {5, []node.ID{w(0), w(1), w(2), w(3)}}},
			nil, []want{{4, []node.ID{w(3)}}}},
		{"a later decision replaces those from its iteration on", []lb.Decision{
			{Iteration: 5, Workers: []node.ID{w(0), w(2)}},
			{Iteration: 10, Workers: []node.ID{w(0), w(2), w(3)}},
			{Iteration: 7, Workers: []node.ID{w(2)}},
		},
			[]want{{4, []node.ID{w(0), w(1), w(2)}}, {6, []node.ID{w(0), w(2)}}, {7, []node.ID{w(2)}}, {12, []node.ID{w(2)}}},
			[]want{{6, []node.ID{w(1)}}, {12, []node.ID{w(0), w(1)}}}, []want{{12, []node.ID{w(3)}}}},
		{"from iteration 0", []lb.Decision{{Iteration: 0, Workers: []node.ID{w(1)}}},
			[]want{{0, []node.ID{w(1)}}, {3, []node.ID{w(1)}}},
			nil, []want{{0, []node.ID{w(0)}}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := unstarted(3)
			for i, d := range tc.follow {
				d.Version = uint32(i + 1)
				a.Follow(lb.Directive{Decision: &d})
			}
			for _, wt := range tc.want {
				a.mu.Lock()
				got, _ := a.workersAt(wt.iter)
				a.mu.Unlock()
				if !slices.Equal(got, wt.workers) {
					t.Errorf("workers of iteration %d: %v, want %v", wt.iter, got, wt.workers)
				}
			}
			push := func(from node.ID, iter uint64) error {
				h := &frame.Header{Type: frame.Push, DType: frame.Float32, Sender: uint32(from),
					Key: 3, Iteration: iter, Total: 64, Length: 8}
				return a.HandlePush(h, make([]byte, h.Length), false)
			}
			for _, wt := range tc.dropped {
				for _, id := range wt.workers {
					if err := push(id, wt.iter); err != nil {
						t.Errorf("push from %s of iteration %d: %v", id, wt.iter, err)
					}
				}
			}
			for _, wt := range tc.refused {
				for _, id := range wt.workers {
					if err := push(id, wt.iter); err == nil {
						t.Errorf("push from %s of iteration %d accepted", id, wt.iter)
					}
				}
			}
			if a.table.Pending() != 0 {
				t.Errorf("%d partitions pending: a dropped push was counted", a.table.Pending())
			}
		})
	}
}
