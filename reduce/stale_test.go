package reduce

import (
	"slices"
	"testing"

	"github.com/fptps/fpt/frame"
)

// TestTableDropStale: a retry drops exactly the pending partitions of its
// iterations cut under older versions; their buffers go back to the free
// list, and what is kept still completes.
func TestTableDropStale(t *testing.T) {
	const workers = 3
	// Pending partitions, each with worker 0's contribution; distinct
	// sizes so that PendingBytes tells which went.
	parts := []PartID{
		{Key: 1, Iteration: 4, Version: 1},
		{Key: 2, Iteration: 5, Version: 1},
		{Key: 3, Iteration: 6, Version: 1},
		{Key: 3, Iteration: 6, Version: 2}, // the same partition, cut again
		{Key: 4, Partition: 1, Iteration: 7, Version: 3},
	}
	size := func(i int) int { return 4 * (i + 1) }
	cases := []struct {
		name    string
		version uint32
		from    uint64
		dropped []int // indexes into parts
	}{
		{"retry at 5 under v2", 2, 5, []int{1, 2}},
		{"retry at 4 under v2", 2, 4, []int{0, 1, 2}},
		{"retry at 0 under v3", 3, 0, []int{0, 1, 2, 3}},
		{"retry at 7 under v4", 4, 7, []int{4}},
		{"nothing older than v1", 1, 0, nil},
		{"nothing from 8 on", 9, 8, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tb := NewTable()
			for i, id := range parts {
				c := Contribution{PartID: id, Workers: workers, Worker: 0, DType: frame.Float32, Total: 64, Data: f32(make([]float64, size(i)/4)...)}
				if s, err := tb.Add(c); err != nil || s != nil {
					t.Fatalf("%+v: %v, %v", id, s, err)
				}
			}
			if n := tb.DropStale(tc.version, tc.from); n != len(tc.dropped) {
				t.Fatalf("DropStale(%d, %d) = %d, want %d", tc.version, tc.from, n, len(tc.dropped))
			}
			var keptBytes, droppedBytes int64
			for i := range parts {
				if slices.Contains(tc.dropped, i) {
					droppedBytes += int64(size(i))
				} else {
					keptBytes += int64(size(i))
				}
			}
			if tb.Pending() != len(parts)-len(tc.dropped) || tb.PendingBytes() != keptBytes {
				t.Fatalf("pending %d (%d bytes), want %d (%d bytes)", tb.Pending(), tb.PendingBytes(), len(parts)-len(tc.dropped), keptBytes)
			}
			if tb.idleBytes != droppedBytes {
				t.Fatalf("%d idle bytes, want the dropped buffers' %d", tb.idleBytes, droppedBytes)
			}
			// A kept partition completes with the other workers' values;
			// a dropped one starts over, so worker 0 may contribute again
			// and the round needs all three.
			for i, id := range parts {
				dropped := slices.Contains(tc.dropped, i)
				vals := make([]float64, size(i)/4)
				for w := 1; w < workers; w++ {
					for j := range vals {
						vals[j] = float64(w)
					}
					s, err := tb.Add(Contribution{PartID: id, Workers: workers, Worker: w, DType: frame.Float32, Total: 64, Data: f32(vals...)})
					if err != nil {
						t.Fatalf("%+v worker %d: %v", id, w, err)
					}
					if last := w == workers-1; (s != nil) != (last && !dropped) {
						t.Fatalf("%+v (dropped %v) worker %d: sum %v", id, dropped, w, s)
					}
					if s != nil {
						if got := decode(frame.Float32, s.Data); got[0] != 3 {
							t.Fatalf("%+v: sum %v, want 0+1+2", id, got)
						}
						tb.Release(s)
					}
				}
				if dropped {
					s, err := tb.Add(Contribution{PartID: id, Workers: workers, Worker: 0, DType: frame.Float32, Total: 64, Data: f32(make([]float64, size(i)/4)...)})
					if err != nil || s == nil {
						t.Fatalf("%+v: worker 0 again after the drop: %v, %v", id, s, err)
					}
					tb.Release(s)
				}
			}
			if tb.Pending() != 0 || tb.PendingBytes() != 0 {
				t.Fatalf("pending %d (%d bytes) at the end", tb.Pending(), tb.PendingBytes())
			}
		})
	}
}

// TestTableCutsNeverMix: after a retry the same partition of the same
// iteration is aggregated under the new version on its own; a worker's
// push under the old cut neither adds into it nor completes it.
func TestTableCutsNeverMix(t *testing.T) {
	old := PartID{Key: 7, Iteration: 5, Version: 1}
	cut := old
	cut.Version = 2
	c := func(id PartID, w int, v float64) Contribution {
		return Contribution{PartID: id, Workers: 2, Worker: w, DType: frame.Float32, Total: 64, Data: f32(v)}
	}
	cases := []struct {
		name string
		drop bool // the aggregator drops the stale round first
	}{{"old round dropped", true}, {"old round still pending", false}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tb := NewTable()
			if s, err := tb.Add(c(old, 0, 1000)); err != nil || s != nil {
				t.Fatalf("old: %v, %v", s, err)
			}
			if tc.drop {
				if n := tb.DropStale(cut.Version, cut.Iteration); n != 1 {
					t.Fatalf("dropped %d", n)
				}
			}
			// Worker 1's push under the new cut does not complete the old
			// round, which lacks it.
			if s, err := tb.Add(c(cut, 1, 20)); err != nil || s != nil {
				t.Fatalf("worker 1 under v2: %v, %v: mixed with v1", s, err)
			}
			s, err := tb.Add(c(cut, 0, 10))
			if err != nil || s == nil {
				t.Fatalf("worker 0 under v2: %v, %v", s, err)
			}
			if got := decode(frame.Float32, s.Data); got[0] != 30 || s.PartID != cut {
				t.Fatalf("sum %v of %+v, want 30 of %+v", got, s.PartID, cut)
			}
			tb.Release(s)
			if want := map[bool]int{true: 0, false: 1}[tc.drop]; tb.Pending() != want {
				t.Fatalf("pending %d, want %d", tb.Pending(), want)
			}
			// A Sum handed out before a retry is not the table's to drop.
			if _, err := tb.Add(c(cut, 0, 1)); err != nil {
				t.Fatal(err)
			}
			done, err := tb.Add(c(cut, 1, 2))
			if err != nil || done == nil {
				t.Fatalf("%v, %v", done, err)
			}
			if n := tb.DropStale(cut.Version+1, 0); n != map[bool]int{true: 0, false: 1}[tc.drop] {
				t.Fatalf("dropped %d", n)
			}
			if got := decode(frame.Float32, done.Data); got[0] != 3 {
				t.Fatalf("sum handed out changed to %v by DropStale", got)
			}
			tb.Release(done)
			if tb.Pending() != 0 || tb.PendingBytes() != 0 {
				t.Fatalf("pending %d (%d bytes)", tb.Pending(), tb.PendingBytes())
			}
		})
	}
}

// TestTableDropStaleReuses: dropped rounds' buffers and records are
// reused, so a job retrying again and again allocates nothing once warm;
// a buffer that Recycle takes back is handed out again.
func TestTableDropStaleReuses(t *testing.T) {
	tb := NewTable()
	data := make([]byte, 4096)
	id := PartID{Key: 3}
	round := func() {
		id.Version++
		for p := range uint32(8) {
			id.Partition = p
			if _, err := tb.Add(Contribution{PartID: id, Workers: 2, Worker: 1, DType: frame.Float32, Total: 1 << 20, Data: data}); err != nil {
				t.Fatal(err)
			}
		}
		if n := tb.DropStale(id.Version+1, id.Iteration); n != 8 {
			t.Fatalf("dropped %d", n)
		}
	}
	for range 3 {
		round()
	}
	if n := testing.AllocsPerRun(100, round); n != 0 {
		t.Fatalf("%v allocations per retried round", n)
	}
	buf := tb.Buffer(4096)
	tb.Recycle(buf)
	if again := tb.Buffer(4096); &again[0] != &buf[0] {
		t.Fatal("recycled buffer not handed out again")
	}
}
