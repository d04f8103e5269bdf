package lbagent

import (
	"testing"
	"time"

	"github.com/fptps/fpt/lb"
)

// Which iterations a node reports: with iterations shorter than
// ReportEvery, one report per ReportEvery, but every iteration during a
// probe, on a newer retry version, and past half a worker's lookahead.
func TestPace(t *testing.T) {
	const every = 10 * time.Millisecond
	type begin struct {
		iter    uint64
		at      time.Duration // since the start
		version uint32
	}
	// iters begins iterations from..to, one every step.
	iters := func(from, to uint64, step time.Duration) []begin {
		var out []begin
		for i := from; i <= to; i++ {
			out = append(out, begin{iter: i, at: time.Duration(i-from) * step})
		}
		return out
	}
	grant := func(done, horizon uint64) *lb.Directive {
		return &lb.Directive{Done: done, Horizon: horizon, Shaping: true}
	}
	tests := []struct {
		name   string
		every  time.Duration
		worker bool
		follow *lb.Directive // before the first begin
		begins []begin
		want   []uint64 // the iterations begun whose report is sent
	}{
		{"1 ms iterations: one report per 10 ms", every, false, nil, iters(1, 25, time.Millisecond), []uint64{1, 11, 21}},
		{"20 ms iterations: every one", every, false, nil, iters(1, 4, 20*time.Millisecond), []uint64{1, 2, 3, 4}},
		{"probing: every one", every, false, &lb.Directive{Shaping: false}, iters(1, 5, time.Millisecond), []uint64{1, 2, 3, 4, 5}},
		{"server, 4 ms iterations: one report per ServerReportEvery", ServerReportEvery, false, nil,
			iters(1, 130, 4*time.Millisecond), []uint64{1, 64, 127}},
		{"server probing: every one", ServerReportEvery, false, &lb.Directive{Shaping: false},
			iters(1, 4, 4*time.Millisecond), []uint64{1, 2, 3, 4}},
		{"every 0: every one", 0, true, nil, iters(1, 3, 0), []uint64{1, 2, 3}},
		{"a newer retry version reports at once", every, false, nil,
			[]begin{{1, 0, 0}, {2, time.Millisecond, 0}, {2, 2 * time.Millisecond, 1}, {3, 3 * time.Millisecond, 1}}, []uint64{1, 2}},
		{"worker: past half its lookahead, every one", every, true, grant(10, 30),
			iters(15, 24, 100*time.Microsecond), []uint64{15, 20, 21, 22, 23, 24}},
		{"worker: lookahead of 2 iterations, every one", every, true, grant(5, 7),
			iters(6, 7, 100*time.Microsecond), []uint64{6, 7}},
		{"server: a grant does not count", every, false, grant(10, 12),
			iters(11, 13, 100*time.Microsecond), []uint64{11}},
		{"the clock going back reports", every, false, nil,
			[]begin{{1, 5 * time.Millisecond, 0}, {2, 0, 0}, {3, time.Millisecond, 0}}, []uint64{1, 2}},
	}
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := NewPace(tt.every)
			if tt.follow != nil {
				p.Follow(*tt.follow)
			}
			var got []uint64
			for _, b := range tt.begins {
				if p.Due(b.iter, b.version, tt.worker, t0.Add(b.at)) {
					got = append(got, b.iter)
				}
			}
			if len(got) != len(tt.want) {
				t.Fatalf("reports at %v, want %v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Fatalf("reports at %v, want %v", got, tt.want)
				}
			}
		})
	}
}

// A report the pace skipped falls due ReportEvery after the latest one
// sent, and is sent then unless a later report went first: a node that
// stops beginning iterations (it waits, or its job ends) still reports
// the last one it finished.
func TestPaceFlush(t *testing.T) {
	const every = 10 * time.Millisecond
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	tests := []struct {
		name    string
		begins  []int // iteration i+1 begins at begins[i] ms
		flushAt int   // ms
		pending bool  // after the begins
		due     int   // ms, when pending
		flushed bool
	}{
		{"nothing skipped", []int{0}, 50, false, 0, false},
		{"skipped, flushed when due", []int{0, 1, 2}, 10, true, 10, true},
		{"skipped, not yet due", []int{0, 1, 2}, 9, true, 10, false},
		{"a later report went first", []int{0, 1, 12}, 30, false, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := NewPace(every)
			for i, at := range tt.begins {
				p.Due(uint64(i+1), 0, false, ms(at))
			}
			at, ok := p.Pending()
			if ok != tt.pending || ok && !at.Equal(ms(tt.due)) {
				t.Fatalf("Pending() = %v, %v; want %v at %d ms", at.Sub(t0), ok, tt.pending, tt.due)
			}
			if got := p.Flush(ms(tt.flushAt)); got != tt.flushed {
				t.Fatalf("Flush at %d ms = %v; want %v", tt.flushAt, got, tt.flushed)
			}
			if _, ok := p.Pending(); tt.flushed && ok {
				t.Fatal("still pending after the flush")
			}
		})
	}
}
