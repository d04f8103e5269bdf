package trace

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// ev is a complete event of node pid for the breakdown's input.
func ev(name string, pid int, iter uint64, ts, dur float64) map[string]any {
	return map[string]any{"name": name, "ph": "X", "cat": "fpt", "pid": pid, "tid": 1, "ts": ts, "dur": dur,
		"args": map[string]any{"iteration": iter}}
}

func proc(pid int, role string, nodeID int) map[string]any {
	return map[string]any{"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
		"args": map[string]any{"role": role, "node_id": nodeID, "fpt_clock": Clock}}
}

func file(t *testing.T, evs ...map[string]any) Input {
	t.Helper()
	b, err := json.Marshal(evs)
	if err != nil {
		t.Fatal(err)
	}
	return Input{Name: "t.json", Data: b}
}

// step is one iteration of worker 9 (with server 8 aggregating and worker
// 11 pushing too) at times that make each segment a distinct length.
func step(iter uint64, base float64) []map[string]any {
	return []map[string]any{
		ev("step", 1000009, iter, base, 100),
		ev("call", 9, iter, base+1, 2),       // first call: 1 after the step began
		ev("call", 9, iter, base+4, 3),       // last call returns at 7: 6
		ev("push", 9, iter, base+2, 8),       // own frame written at 10: 3
		ev("push", 11, iter, base+5, 9),      // the other worker's at 14: 4
		ev("aggregate", 8, iter, base+12, 7), // sum at 19: 5
		ev("pull", 9, iter, base+25, 2),      // header at 25: 6, landed at 27: 2
		ev("settle", 9, iter, base+6, 1),     // the push's, early
		ev("settle", 9, iter, base+30, 10),   // found at 30: 3, released at 40: 10
		ev("wait", 9, iter, base+8, 50),      // returned at 58: 18
		// the step ends at 100: 42
	}
}

func TestAnalyzeSegments(t *testing.T) {
	want := []int64{1, 6, 3, 4, 5, 6, 2, 3, 10, 18, 42}
	if len(want) != len(Segment) {
		t.Fatalf("%d segments, the test knows %d", len(Segment), len(want))
	}
	for _, tc := range []struct {
		name   string
		events []map[string]any
		want   []int64 // of iteration 1
		total  int64
		steps  int
	}{
		{"with step spans", slices.Concat([]map[string]any{proc(9, "worker", 9), proc(11, "worker", 11),
			proc(8, "server", 8), proc(1000009, "step", 9)}, step(1, 1000), step(2, 2000),
			[]map[string]any{ev("call", 9, 0, 10, 1)}), want, 100, 2},
		{"without: from the first call to the last wait", slices.Concat([]map[string]any{proc(9, "worker", 9),
			proc(11, "worker", 11), proc(8, "server", 8)}, step(1, 1000)[1:]),
			append(append([]int64{-1}, want[1:len(want)-1]...), -1), 57, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := Analyze([]Input{file(t, tc.events...)}, 0)
			if err != nil {
				t.Fatal(err)
			}
			if b.Worker != 9 || len(b.Steps) != tc.steps {
				t.Fatalf("worker %d, %d steps; want 9, %d", b.Worker, len(b.Steps), tc.steps)
			}
			s := b.Steps[0]
			if s.Iteration != 1 || !slices.Equal(s.Segments, tc.want) || s.Total != tc.total {
				t.Errorf("iteration %d: segments %v total %d; want 1: %v total %d", s.Iteration, s.Segments, s.Total, tc.want, tc.total)
			}
			if !slices.Equal(b.Median, tc.want) {
				t.Errorf("median %v, want %v", b.Median, tc.want)
			}
			var out bytes.Buffer
			b.Print(&out)
			if !strings.Contains(out.String(), fmt.Sprintf("%-28s %8d", "step (total)", tc.total)) {
				t.Errorf("printed:\n%s", out.String())
			}
		})
	}
}

// A segment whose event came before the previous one's counts 0: the
// critical path only moves forward.
func TestAnalyzeOverlapCountsZero(t *testing.T) {
	evs := []map[string]any{proc(9, "worker", 9), proc(8, "server", 8)}
	for _, e := range step(1, 1000)[1:] {
		if e["name"] == "settle" && e["ts"] == 1030.0 {
			e = ev("settle", 9, 1, 1020, 20) // found at 20, before the pull landed at 27
		}
		evs = append(evs, e)
	}
	b, err := Analyze([]Input{file(t, evs...)}, 9)
	if err != nil {
		t.Fatal(err)
	}
	if s := b.Steps[0].Segments; s[7] != 0 || s[8] != 13 {
		t.Errorf("settle found before the pull landed: segments %v, want found 0, release 13", s)
	}
}

func TestAnalyzeRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []Input
		want string
	}{
		{"not a trace", []Input{{Name: "x", Data: []byte("nope")}}, "not a Chrome trace"},
		{"no worker", []Input{file(t, proc(8, "server", 8), ev("aggregate", 8, 1, 1, 1))}, "no worker"},
		{"no calls", []Input{file(t, proc(9, "worker", 9), ev("push", 9, 1, 1, 1))}, "no traced FPTPush"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Analyze(tc.in, 0); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one with %q", err, tc.want)
			}
		})
	}
}

// The recorder writes per-request spans that the breakdown reads back.
func TestRecorderRequestSpans(t *testing.T) {
	r := New(Window{1, 5}, 16)
	r.now = clock(999)
	s := &sink{}
	r.Start(s, Meta{Role: "worker", ID: 9})
	r.Request(Call, 3, 1, 4096, false, r.Now())
	r.Request(Settle, 3, 1, 4096, true, r.Now())
	r.Request(Call, 3, 9, 4096, false, r.Now()) // outside the window
	r.Request(Push, 3, 1, 4096, false, r.Now()) // not a per-request phase
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range decode(t, s.buf.Bytes()) {
		if e.Ph == "X" {
			names = append(names, fmt.Sprintf("%s %v", e.Name, e.Args["op"]))
		}
	}
	if !slices.Equal(names, []string{"call push", "settle pull"}) {
		t.Errorf("spans %v, want the call of the push and the settle of the pull", names)
	}
	if _, err := Analyze([]Input{{Name: "w", Data: s.buf.Bytes()}}, 0); err != nil {
		t.Errorf("the breakdown does not read the recorder's file: %v", err)
	}
}
