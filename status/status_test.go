package status

import (
	"encoding/json"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/node"
)

func TestRing(t *testing.T) {
	for _, tc := range []struct {
		capacity, adds int
		want           []int
	}{
		{3, 0, []int{}},
		{3, 2, []int{0, 1}},
		{3, 3, []int{0, 1, 2}},
		{3, 7, []int{4, 5, 6}},
		{0, 2, []int{1}}, // a capacity below 1 holds one
	} {
		r := NewRing[int](tc.capacity)
		for i := range tc.adds {
			r.Add(i)
		}
		if got := r.Items(); !slices.Equal(got, tc.want) || got == nil {
			t.Errorf("capacity %d, %d added: items %v, want %v", tc.capacity, tc.adds, got, tc.want)
		}
	}
}

func TestNodeName(t *testing.T) {
	for id, want := range map[node.ID]string{
		node.SchedulerID:   "scheduler",
		node.ServerID(0):   "server 0",
		node.WorkerID(1):   "worker 1",
		node.ServerID(12):  "server 12",
		node.ID(3):         "node 3",
		node.WorkerID(100): "worker 100",
	} {
		if got := NodeName(id); got != want {
			t.Errorf("NodeName(%d) = %q, want %q", id, got, want)
		}
	}
}

var table = []node.Info{
	{ID: node.SchedulerID, Role: node.Scheduler, Host: "127.0.0.1", ControlPort: 9000},
	{ID: node.ServerID(0), Role: node.Server, Host: "127.0.0.1", ControlPort: 9100, DataPort: 9101},
	{ID: node.WorkerID(0), Role: node.Worker, Host: "127.0.0.1", ControlPort: 9200, DataPort: 9201},
}

func TestRecorderMembers(t *testing.T) {
	t0 := time.Unix(1000, 0)
	r := NewRecorder(true, 10*time.Second, 0)
	if s := r.Snapshot(t0, nil); s.Phase != "registering" || len(s.Members) != 0 {
		t.Fatalf("before start: phase %q, %d members", s.Phase, len(s.Members))
	}
	r.Started(table, t0)
	seen := map[node.ID]time.Time{node.ServerID(0): t0.Add(20 * time.Second), node.WorkerID(0): t0.Add(5 * time.Second)}
	s := r.Snapshot(t0.Add(21*time.Second), seen)
	want := []Member{
		{Name: "scheduler", Role: "scheduler", Rank: 0, ID: 1, Addr: "127.0.0.1:9000", Alive: true},
		{Name: "server 0", Role: "server", Rank: 0, ID: 8, Addr: "127.0.0.1:9100", Alive: true, SeenAgoSeconds: 1},
		{Name: "worker 0", Role: "worker", Rank: 0, ID: 9, Addr: "127.0.0.1:9200", Alive: false, SeenAgoSeconds: 16},
	}
	if !slices.Equal(s.Members, want) {
		t.Errorf("members:\n got %+v\nwant %+v", s.Members, want)
	}
	r.Stopped()
	for _, m := range r.Snapshot(t0.Add(21*time.Second), seen).Members {
		if m.Alive {
			t.Errorf("stopped, but %s is alive", m.Name)
		}
	}
}

func TestRecorderIterationsAndDecisions(t *testing.T) {
	t0 := time.Unix(1000, 0)
	r := NewRecorder(true, 10*time.Second, 3)
	r.Started(table, t0)
	all := []node.ID{node.ServerID(0), node.WorkerID(0)}
	probe := lb.Even(1, 4, all)
	balanced := lb.Decision{Version: 2, Iteration: 7, Aggregators: all, Shares: []float64{0.75, 0.25}}
	steps := []lb.Directive{
		{}, {},
		{Decision: &probe, Probe: true, Reason: "probe"},
		{}, {},
		{Decision: &balanced, Reason: "balanced"},
	}
	for i, d := range steps {
		r.Directive(d, lb.Balanced, t0.Add(time.Duration(i+1)*time.Second/2))
	}
	r.Measured(map[node.ID]float64{node.ServerID(0): 1e6, node.WorkerID(0): 2e6}, map[node.ID]float64{node.ServerID(0): 3e6}, 1500*time.Millisecond)
	s := r.Snapshot(t0.Add(10*time.Second), nil)
	if want := []Point{{3, 0.5}, {4, 0.5}, {5, 0.5}}; !slices.Equal(s.Iterations, want) {
		t.Errorf("iterations %v, want the last 3: %v", s.Iterations, want)
	}
	if want := []Mark{{1, 4, true}, {2, 7, false}}; !slices.Equal(s.Decisions, want) {
		t.Errorf("decision marks %v, want %v", s.Decisions, want)
	}
	if s.Probes != 1 || s.State != "balanced" || s.BoundSeconds != 1.5 {
		t.Errorf("probes %d, state %q, bound %g s; want 1, balanced, 1.5", s.Probes, s.State, s.BoundSeconds)
	}
	if d := s.Decision; d == nil || d.Version != 2 || d.FromIteration != 7 || d.Probe ||
		!slices.Equal(d.Shares, []Share{{"server 0", 0.75}, {"worker 0", 0.25}}) {
		t.Errorf("decision %+v, want v2 from 7 with server 0 75%%, worker 0 25%%", d)
	}
	wantCap := []Capacity{{"server 0", 8e6, 24e6}, {"worker 0", 16e6, 0}}
	if !slices.Equal(s.Capacities, wantCap) {
		t.Errorf("capacities %+v, want %+v (bits per second; 0 unmeasured)", s.Capacities, wantCap)
	}
}

// The first iteration counts from the start; a clock that went backwards
// gives 0, never a negative time.
func TestRecorderFirstIterationAndClock(t *testing.T) {
	t0 := time.Unix(1000, 0)
	r := NewRecorder(true, time.Second, 0)
	r.Started(table, t0)
	r.Directive(lb.Directive{}, lb.Default, t0.Add(2*time.Second))
	r.Directive(lb.Directive{}, lb.Default, t0.Add(time.Second))
	if got, want := r.Snapshot(t0, nil).Iterations, []Point{{0, 2}, {1, 0}}; !slices.Equal(got, want) {
		t.Errorf("iterations %v, want %v", got, want)
	}
}

// The JSON always has arrays, never null, so that the page needs no
// checks; an empty Board says "registering".
func TestSnapshotJSON(t *testing.T) {
	var b Board
	for name, s := range map[string]Snapshot{
		"empty board": b.Latest(),
		"lb off":      NewRecorder(false, time.Second, 0).Snapshot(time.Unix(0, 0), nil),
	} {
		js, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(js, &m); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"members", "capacities", "iterations", "decisions"} {
			if _, ok := m[k].([]any); !ok {
				t.Errorf("%s: %q is %v, want an array: %s", name, k, m[k], js)
			}
		}
		if m["phase"] != "registering" {
			t.Errorf("%s: phase %v, want registering", name, m["phase"])
		}
	}
	r := NewRecorder(true, time.Second, 0)
	r.Started(table, time.Unix(0, 0))
	b.Publish(r.Snapshot(time.Unix(1, 0), nil))
	if got := b.Latest(); got.Phase != "running" || len(got.Members) != 3 {
		t.Errorf("published snapshot: phase %q, %d members", got.Phase, len(got.Members))
	}
	if math.IsNaN(b.Latest().BoundSeconds) {
		t.Error("NaN bound")
	}
}

// A membership change replaces the members shown and marks its decision,
// without counting an iteration as finished.
func TestRecorderMembershipChange(t *testing.T) {
	t0 := time.Unix(1000, 0)
	r := NewRecorder(true, 10*time.Second, 0)
	r.Started(table, t0)
	r.Directive(lb.Directive{}, lb.Default, t0.Add(time.Second))
	joined := node.Info{ID: node.ServerID(1), Role: node.Server, Host: "127.0.0.1", ControlPort: 9300, DataPort: 9301}
	after := []node.Info{table[0], table[2], joined} // server 0 left, server 1 joined
	retry := lb.Even(3, 1, []node.ID{joined.ID})
	r.Changed(after, lb.Directive{Decision: &retry, Retry: true, Reason: "server 0 lost"}, lb.Default)
	r.Changed(after, lb.Directive{}, lb.Default) // a join with the LB on: no decision yet
	s := r.Snapshot(t0.Add(2*time.Second), nil)
	var names []string
	for _, m := range s.Members {
		names = append(names, m.Name)
	}
	if want := []string{"scheduler", "worker 0", "server 1"}; !slices.Equal(names, want) {
		t.Errorf("members %v, want %v", names, want)
	}
	if len(s.Iterations) != 1 {
		t.Errorf("%d iterations recorded, want 1: a membership change finishes none", len(s.Iterations))
	}
	if want := []Mark{{3, 1, false}}; !slices.Equal(s.Decisions, want) {
		t.Errorf("decision marks %v, want %v", s.Decisions, want)
	}
	if d := s.Decision; d == nil || d.Version != 3 || !slices.Equal(d.Shares, []Share{{"server 1", 1}}) {
		t.Errorf("decision %+v, want v3 with server 1 100%%", d)
	}
}
