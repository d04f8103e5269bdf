package bench

import (
	"io"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/netem"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/scheduler"
)

func TestLBScenarioLayout(t *testing.T) {
	fast := netem.HostSpec{Up: "400mbit", Down: "400mbit"}
	slow := netem.HostSpec{Up: "100mbit", Down: "100mbit"}
	for _, tc := range []struct {
		name                     string
		servers, workers         []int // hosts by rank
		scheduler                int
		slowHosts                []int
		serverRates, workerRates []string
	}{
		{scenarioSlowServer, []int{0, 1}, []int{2, 3}, 4, []int{1},
			[]string{"400mbit", "100mbit"}, []string{"400mbit", "400mbit"}},
		{scenarioEqual, []int{0, 1, 2, 3}, []int{4, 5, 6, 7}, 8, nil,
			[]string{"400mbit", "400mbit", "400mbit", "400mbit"}, []string{"400mbit", "400mbit", "400mbit", "400mbit"}},
		{scenarioSlowWorker, []int{0, 1}, []int{2, 3, 4, 5}, 6, []int{5},
			[]string{"400mbit", "400mbit"}, []string{"400mbit", "400mbit", "400mbit", "100mbit"}},
	} {
		l, err := lbScenarioLayout(tc.name, fast, slow)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !slices.Equal(l.serverHosts, tc.servers) || !slices.Equal(l.workerHosts, tc.workers) || l.schedulerHost != tc.scheduler {
			t.Errorf("%s: servers on %v, workers on %v, scheduler on %d; want %v, %v, %d",
				tc.name, l.serverHosts, l.workerHosts, l.schedulerHost, tc.servers, tc.workers, tc.scheduler)
		}
		if len(l.hosts) != tc.scheduler+1 || l.hosts[tc.scheduler] != (netem.HostSpec{}) {
			t.Errorf("%s: hosts %v: want the scheduler's last and unlimited", tc.name, l.hosts)
		}
		for i, h := range l.hosts[:tc.scheduler] {
			want := fast
			if slices.Contains(tc.slowHosts, i) {
				want = slow
			}
			if h != want {
				t.Errorf("%s: host %d is %v, want %v", tc.name, i, h, want)
			}
		}
		if got := l.rates(l.serverHosts); !slices.Equal(got, tc.serverRates) {
			t.Errorf("%s: server rates %v, want %v", tc.name, got, tc.serverRates)
		}
		if got := l.rates(l.workerHosts); !slices.Equal(got, tc.workerRates) {
			t.Errorf("%s: worker rates %v, want %v", tc.name, got, tc.workerRates)
		}
		// Every process has a host of its role, each its own.
		seen := map[int]string{}
		for proc, h := range l.procHost {
			if other, ok := seen[h]; ok {
				t.Errorf("%s: %s and %s share host %d", tc.name, proc, other, h)
			}
			seen[h] = proc
			role := strings.TrimRight(proc, "0123456789")
			if ok := (role == "server" && slices.Contains(l.serverHosts, h)) || (role == "worker" && slices.Contains(l.workerHosts, h)) ||
				(role == "scheduler" && h == l.schedulerHost); !ok {
				t.Errorf("%s: %s on host %d", tc.name, proc, h)
			}
		}
		if len(l.procHost) != len(l.hosts) {
			t.Errorf("%s: %d processes on %d hosts", tc.name, len(l.procHost), len(l.hosts))
		}
	}
	if _, err := lbScenarioLayout("shaping", fast, slow); err == nil {
		t.Error("shaping: no error")
	}
}

// The scheduler ranks by address string: past nine hosts, 198.18.0.10
// sorts before 198.18.0.2.
func TestByAddress(t *testing.T) {
	for _, tc := range []struct{ in, want []int }{
		{[]int{0, 1, 2}, []int{0, 1, 2}},
		{[]int{8, 9, 10, 11}, []int{9, 10, 11, 8}}, // .10 .11 .12 before .9
		{[]int{1, 9, 0}, []int{0, 9, 1}},           // .1 .10 .2
		{nil, nil},
	} {
		if got := byAddress(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("byAddress(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestModelTimes(t *testing.T) {
	fast := netem.HostSpec{Up: "400mbit", Down: "400mbit"} // 50 MB/s
	slow := netem.HostSpec{Up: "100mbit", Down: "100mbit"} // 12.5 MB/s
	const m = 10e6
	for _, tc := range []struct {
		name        string
		bound, even time.Duration
	}{
		// Even: server 1 moves W·M/2 = 10 MB at 12.5 MB/s. W = 2: the
		// workers aggregate everything, M/c = 10 MB at 50 MB/s.
		{scenarioSlowServer, 200 * time.Millisecond, 800 * time.Millisecond},
		// All equal: a worker moves M at 50 MB/s, and the even split
		// reaches it (a server moves W·M/4 = M).
		{scenarioEqual, 200 * time.Millisecond, 200 * time.Millisecond},
		// The slow worker moves at least M, whatever the split: 800 ms.
		{scenarioSlowWorker, 800 * time.Millisecond, 800 * time.Millisecond},
	} {
		l, err := lbScenarioLayout(tc.name, fast, slow)
		if err != nil {
			t.Fatal(err)
		}
		bound, even, err := l.modelTimes(m)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		near := func(a, b time.Duration) bool { return math.Abs(float64(a-b)) <= float64(time.Millisecond) }
		if !near(bound, tc.bound) || !near(even, tc.even) {
			t.Errorf("%s: bound %v, even %v; want %v, %v", tc.name, bound, even, tc.bound, tc.even)
		}
		if bound > even {
			t.Errorf("%s: bound %v above the even split's %v", tc.name, bound, even)
		}
	}
	// An unlimited host has no capacity: no bound.
	if l, _ := lbScenarioLayout(scenarioEqual, netem.HostSpec{}, slow); l.hosts != nil {
		if _, _, err := l.modelTimes(m); err == nil {
			t.Error("unlimited hosts: no error")
		}
	}
}

func TestTailMedian(t *testing.T) {
	for _, tc := range []struct {
		xs      []float64
		k       int
		want    float64
		wantErr bool
	}{
		{[]float64{100, 1, 2, 3}, 3, 2, false},
		{[]float64{100, 4, 1, 3, 2}, 4, 2.5, false},
		{[]float64{7}, 1, 7, false},
		{[]float64{9, 1, 1, 1, 5, 6, 7, 8, 2, 3, 4}, 8, 4.5, false},
		{[]float64{1, 2}, 3, 0, true},
		{[]float64{1, 2}, 0, 0, true},
		{nil, 1, 0, true},
	} {
		got, err := tailMedian(tc.xs, tc.k)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("tailMedian(%v, %d) = %v, %v; want %v (error %v)", tc.xs, tc.k, got, err, tc.want, tc.wantErr)
		}
	}
	// The input is not reordered.
	xs := []float64{3, 1, 2}
	tailMedian(xs, 3)
	if !slices.Equal(xs, []float64{3, 1, 2}) {
		t.Errorf("tailMedian sorted its input: %v", xs)
	}
}

func TestAggregate(t *testing.T) {
	r := lbResult{Tail: 3}
	even := []float64{900, 800, 820, 810, 805}
	lb := []float64{900, 700, 410, 400, 390}
	if err := r.aggregate(even, lb, 200*time.Millisecond, 400*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if r.EvenIterMs != 810 || r.LBIterMs != 400 || r.BoundIterMs != 200 || r.EvenModelIterMs != 400 {
		t.Errorf("times: %+v", r)
	}
	if r.LBOverBound != 2 || r.EvenOverLB != 2.025 {
		t.Errorf("ratios: lb/bound %v, even/lb %v", r.LBOverBound, r.EvenOverLB)
	}
	if !slices.Equal(r.EvenItersMs, even) || !slices.Equal(r.LBItersMs, lb) {
		t.Errorf("per-iteration times not kept: %+v", r)
	}
	for _, bad := range []struct {
		even, lb []float64
		bound    time.Duration
	}{
		{even[:2], lb, time.Second},
		{even, lb[:1], time.Second},
		{even, lb, 0},
	} {
		r := lbResult{Tail: 3}
		if err := r.aggregate(bad.even, bad.lb, bad.bound, time.Second); err == nil {
			t.Errorf("aggregate(%v, %v, %v): no error", bad.even, bad.lb, bad.bound)
		}
	}
}

// Decisions are counted from the scheduler's decision lines on its
// stdout, written as scheduler.DecisionLine writes them; log lines that
// mention a decision are not decisions.
func TestDecisionMarks(t *testing.T) {
	dec := func(v uint32, it uint64, reason string) string {
		return scheduler.DecisionLine(lb.Directive{Decision: &lb.Decision{Version: v, Iteration: it,
			Aggregators: []node.ID{node.ServerID(0), node.WorkerID(1)}, Shares: []float64{0.8, 0.2}}, Shaping: true, Reason: reason})
	}
	for _, tc := range []struct {
		name   string
		stdout string
		want   []lbDecisionMark
	}{
		{"three versions, one repeated", strings.Join([]string{
			dec(1, 3, "warm-up done"),
			"something else the scheduler printed",
			dec(2, 5, "probe done"),
			dec(2, 5, "again"),
			dec(13, 40, "probe every 3"),
		}, "\n") + "\n", []lbDecisionMark{{1, 3}, {2, 5}, {13, 40}}},
		{"last line without a newline", dec(1, 3, "") + "\n" + dec(2, 9, ""), []lbDecisionMark{{1, 3}, {2, 9}}},
		{"log text is not a decision", `time=2026-01-01T00:00:00Z level=INFO msg="lb decision" role=scheduler version=1 from_iteration=3` + "\n", nil},
		{"nothing", "", nil},
	} {
		if got := decisionMarks(tc.stdout); !slices.Equal(got, tc.want) {
			t.Errorf("%s: decisionMarks = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestIsLBScenario(t *testing.T) {
	for name, want := range map[string]bool{
		"slow-server": true, "equal": true, "slow-worker": true, "slow-server,equal,slow-worker": true,
		"shaping": false, "priority": false, "": false, "equal,shaping": false, "equal,": false,
	} {
		if got := isLBScenario(name); got != want {
			t.Errorf("isLBScenario(%q) = %v, want %v", name, got, want)
		}
	}
}

// Flags the LB scenarios reject before they need root.
func TestLBScenarioUsage(t *testing.T) {
	for _, args := range [][]string{
		{"--rate", "none"},
		{"--slow-rate", "fast"},
		{"--iters", "4", "--tail", "5"},
		{"--tail", "0"},
		{"--tensors", "0"},
		{"--min-bytes", "100", "--max-bytes", "10"},
	} {
		f := newFlags(io.Discard)
		if err := f.fs.Parse(append([]string{"--scenario", scenarioEqual}, args...)); err != nil {
			t.Fatal(err)
		}
		if code := lbScenarioMain(f); code != 2 {
			t.Errorf("%v: exit %d, want 2 (usage)", args, code)
		}
	}
}
