package bench

import (
	"bytes"
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/netem"
)

func TestElasticLayout(t *testing.T) {
	fast := netem.HostSpec{Up: "400mbit", Down: "400mbit"}
	slow := netem.HostSpec{Up: "100mbit", Down: "100mbit"}
	for _, tc := range []struct {
		name        string
		workers     int
		hosts       int
		serverRates []string
		joiner      string
		joinerHost  int // -1: none
	}{
		{scenarioServerLoss, 2, 5, []string{"400mbit", "400mbit"}, elasticJoiner, -1},
		{scenarioServerJoin, 2, 6, []string{"400mbit", "100mbit"}, elasticJoiner, 5},
		{scenarioWorkerWait, 3, 7, []string{"400mbit", "400mbit"}, "worker3", 6},
	} {
		l := elasticLayout(tc.name, tc.workers, fast, slow)
		if len(l.hosts) != tc.hosts {
			t.Errorf("%s: %d hosts, want %d", tc.name, len(l.hosts), tc.hosts)
		}
		if got := l.rates(l.serverHosts); strings.Join(got, ",") != strings.Join(tc.serverRates, ",") {
			t.Errorf("%s: server rates %v, want %v", tc.name, got, tc.serverRates)
		}
		if tc.name == scenarioWorkerWait && (l.procHost[waitVictim] != l.workerHosts[2] || l.hosts[l.procHost[waitVictim]] != fast) {
			t.Errorf("%s: %s on host %d, want worker rank 2's, %d, at %v", tc.name, waitVictim, l.procHost[waitVictim], l.workerHosts[2], fast)
		}
		h, ok := l.procHost[tc.joiner]
		switch {
		case tc.joinerHost < 0 && ok:
			t.Errorf("%s: a joiner's host %d, want none", tc.name, h)
		case tc.joinerHost >= 0 && (!ok || h != tc.joinerHost || l.hosts[h] != fast):
			t.Errorf("%s: joiner on host %d (%v, known %v), want host %d at %v", tc.name, h, l.hosts[h], ok, tc.joinerHost, fast)
		}
	}
}

// The bounds move the way the LB's model says: with 2 workers, a
// worker's link carries the model each way whatever the servers (workers
// aggregate too), so neither the loss of an equal server nor a fast
// joiner moves the bound; with 3, servers take load off the workers, so
// the loss raises it and the join lowers it.
func TestElasticBounds(t *testing.T) {
	fast := netem.HostSpec{Up: "400mbit", Down: "400mbit"}
	slow := netem.HostSpec{Up: "100mbit", Down: "100mbit"}
	const model = 16 << 20
	// M over a worker's 50 MB/s.
	perWorker := time.Duration(float64(model) / 50e6 * float64(time.Second))
	near := func(a, b time.Duration) bool { return a-b > -time.Millisecond && a-b < time.Millisecond }
	for _, tc := range []struct {
		name    string
		workers int
		check   func(before, after time.Duration) bool
	}{
		{scenarioServerLoss, 2, func(b, a time.Duration) bool { return near(b, perWorker) && near(a, perWorker) }},
		{scenarioServerJoin, 2, func(b, a time.Duration) bool { return near(b, perWorker) && near(a, perWorker) }},
		{scenarioServerLoss, 3, func(b, a time.Duration) bool { return b > perWorker && a > b }},
		{scenarioServerJoin, 3, func(b, a time.Duration) bool { return a > perWorker && a < b }},
		// A replacement at the same rate as the worker lost: the same
		// bound.
		{scenarioWorkerWait, 3, func(b, a time.Duration) bool { return b > perWorker && near(a, b) }},
	} {
		before, after, err := elasticBounds(elasticLayout(tc.name, tc.workers, fast, slow), tc.name, model)
		if err != nil {
			t.Fatalf("%s, %d workers: %v", tc.name, tc.workers, err)
		}
		if !tc.check(before, after) {
			t.Errorf("%s, %d workers: bounds %v before and %v after (a worker's link alone: %v)", tc.name, tc.workers, before, after, perWorker)
		}
	}
	if _, _, err := elasticBounds(lbLayout{hosts: []netem.HostSpec{{Up: "x"}}, serverHosts: []int{0}}, scenarioServerLoss, model); err == nil {
		t.Error("a bad rate: no error")
	}
}

func TestElasticAggregate(t *testing.T) {
	iters := []float64{900, 400, 410, 420, 1000, 800, 300, 310, 320, 330}
	for _, tc := range []struct {
		name          string
		at, from      int
		before, after float64
		err           string
	}{
		// Before: iterations max(2, at-tail) to at-1; after: the last 3.
		{"loss in 5", 5, 5, 410, 320, ""},
		{"share from 7", 5, 7, 410, 320, ""},
		{"event too early", 2, 4, 0, 0, "want 3 or later"},
		{"share inside the tail", 5, 8, 0, 0, "raise --iters"},
		{"from before the event", 5, 4, 0, 0, "want 5 to 7"},
	} {
		r := elasticResult{Iterations: len(iters), Tail: 3}
		err := r.aggregate(iters, tc.at, tc.from, 100*time.Millisecond, 200*time.Millisecond)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: error %v, want one saying %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if r.BeforeIterMs != tc.before || r.AfterIterMs != tc.after || r.BoundBeforeMs != 100 || r.BoundAfterMs != 200 {
			t.Errorf("%s: before %v, after %v, bounds %v and %v; want %v, %v, 100, 200", tc.name, r.BeforeIterMs, r.AfterIterMs,
				r.BoundBeforeMs, r.BoundAfterMs, tc.before, tc.after)
		}
		if r.AfterOverBound != round3(tc.after/200) || r.AfterOverBefore != round3(tc.after/tc.before) {
			t.Errorf("%s: ratios %v and %v", tc.name, r.AfterOverBound, r.AfterOverBefore)
		}
	}
	r := elasticResult{Iterations: 3, Tail: 1}
	if err := r.aggregate([]float64{1, 2}, 3, 3, time.Millisecond, time.Millisecond); err == nil {
		t.Error("too few times: no error")
	}
}

// The output: the window and the summary as tables, or one JSON line
// that --from reads back as the same result.
func TestWriteElastic(t *testing.T) {
	res := elasticResult{Scenario: scenarioServerLoss, Rate: "400mbit", Servers: 2, Workers: 2, Iterations: 10, Tail: 3,
		KillAt: 5, LostNode: "server1(10)@198.18.0.2:1", RetryFrom: 5, RetriedIterMs: 1000, Exits: map[string]int{"server1": -1}}
	iters := []float64{900, 400, 410, 420, 1000, 800, 300, 310, 320, 330}
	if err := res.aggregate(iters, 5, 5, 300*time.Millisecond, 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := writeElastic(&out, res, false, ""); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	// Header, iterations 2 to 10 (3 before the kill, up to 10 after the
	// retry), a blank line, the summary's header and row.
	if len(lines) != 1+9+1+2 || !strings.HasPrefix(lines[0], "iteration") || !strings.Contains(lines[4], noteRetried) ||
		!strings.HasPrefix(lines[12], scenarioServerLoss) {
		t.Fatalf("output:\n%s", out.String())
	}
	if got, header := readBackElastic(t, res); got.AfterIterMs != res.AfterIterMs || got.Exits["server1"] != -1 || header[5] != elasticHeader[5] {
		t.Errorf("read back %+v under %v", got, header)
	}
	if c := res.chart(); len(c.Series) != 2 || len(c.Marks) != 2 {
		t.Errorf("chart %+v", c)
	}
}

// Bad settings are usage errors, before any network is built.
func TestElasticUsage(t *testing.T) {
	for _, args := range [][]string{
		{"--scenario", scenarioServerLoss, "--kill-at", "2"},
		{"--scenario", scenarioServerLoss, "--iters", "12", "--kill-at", "10", "--tail", "3"},
		{"--scenario", scenarioServerJoin, "--join-at", "38"},
		{"--scenario", scenarioServerJoin, "--workers", "0"},
		{"--scenario", scenarioServerLoss, "--workers", "7"},
		{"--scenario", scenarioServerJoin, "--rate", "none"},
		{"--scenario", scenarioServerLoss, "--iters", "4", "--tail", "5"},
		{"--scenario", scenarioWorkerWait, "--workers", "2"},
		{"--scenario", scenarioWorkerWait, "--kill-at", "2"},
		{"--scenario", scenarioWorkerWait, "--iters", "12", "--kill-at", "10", "--tail", "3"},
	} {
		f := newFlags(io.Discard)
		if err := f.fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		if code := elasticMain(f); code != 2 {
			t.Errorf("%v: exit %d, want 2 (usage)", args, code)
		}
	}
}

// worker-wait's output: the window marks the kill, the hold and the
// replacement's first iteration; the summary table has its own header.
func TestWriteWorkerWait(t *testing.T) {
	res := elasticResult{Scenario: scenarioWorkerWait, Rate: "400mbit", Servers: 2, Workers: 3, Iterations: 12, Tail: 3,
		KillAt: 4, LostNode: "worker2(13)@198.18.0.5:1", RetryFrom: 4, HoldIteration: 6, JoinedNode: "worker3(15)@198.18.0.7:1",
		JoinedFrom: 7, WaitedMs: 240, JoinIterMs: 1000, Checksum: "0x0123456789abcdef", ChecksumRanks: []int{0, 1, 3}}
	iters := []float64{900, 400, 410, 420, 300, 310, 1000, 320, 330, 340, 350, 360}
	if err := res.aggregate(iters, 4, 7, 300*time.Millisecond, 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := writeElastic(&out, res, false, ""); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	// Header, iterations 1 to 12 (3 before the kill, up to 10 after the
	// replacement's first), a blank line, the summary's header and row.
	if len(lines) != 1+12+1+2 || !strings.Contains(lines[4], noteWorkerKilled) || !strings.Contains(lines[4], noteWorkersLeft) ||
		!strings.Contains(lines[6], noteHold) || !strings.Contains(lines[7], noteReplacement) ||
		!strings.HasPrefix(lines[14], "scenario") || !strings.Contains(lines[14], "waited ms") ||
		!strings.Contains(lines[15], "0x0123456789abcdef on ranks [0 1 3]") {
		t.Fatalf("output:\n%s", out.String())
	}
	if got, header := readBackElastic(t, res); got.HoldIteration != 6 || got.JoinedFrom != 7 || got.WaitedMs != 240 || header[5] != waitHeader[5] {
		t.Errorf("read back %+v under %v", got, header)
	}
	if c := res.chart(); len(c.Marks) != 2 || c.Marks[1].X != 7 {
		t.Errorf("chart %+v", c)
	}
}

// readBackElastic prints res as one JSON line and reads it back as
// --from does: the one result, and its table's header.
func readBackElastic(t *testing.T, res elasticResult) (elasticResult, []string) {
	t.Helper()
	var out bytes.Buffer
	if err := writeElastic(&out, res, true, ""); err != nil {
		t.Fatal(err)
	}
	rs, err := readResults(&out)
	if err != nil {
		t.Fatal(err)
	}
	got, ok := rs[0].(elasticResult)
	if len(rs) != 1 || !ok {
		t.Fatalf("read back %+v", rs)
	}
	return got, headerOf(rs)
}

func TestParseHold(t *testing.T) {
	log := `time=... level=WARN msg="membership change: worker left; the iterations not every worker has the sums of are summed again over the workers left" role=scheduler node=worker2(13)@198.18.0.5:1 retry_from_iteration=10
time=... level=WARN msg="no further iteration starts until a worker joins (FPT_ON_WORKER_LOSS=wait)" role=scheduler lost=worker2(13)@198.18.0.5:1 last_iteration=12 timeout=5m0s
`
	if hold, err := parseHold(log); err != nil || hold != 12 {
		t.Errorf("parseHold = %d, %v; want 12", hold, err)
	}
	if _, err := parseHold(strings.SplitN(log, "\n", 2)[0]); err == nil {
		t.Error("no hold: no error")
	}
}

// Every worker that ended the job printed one checksum, and the
// replacement the iteration the scheduler counts it from.
func TestSameChecksums(t *testing.T) {
	const joined = "worker 3: joined the running job at iteration 13 with worker 0's parameters; sums now over 3 workers [0 1 3]\n"
	sum := func(rank int, x string) string {
		return "fpt-bench-progress: worker " + strconv.Itoa(rank) + ": parameters checksum " + x + "\nworker: PASS\n"
	}
	const a, b = "0x221e3de23026742f", "0x221e3de23026742e"
	for _, tc := range []struct {
		name string
		logs map[string]string
		from int
		err  string // "": none
	}{
		{"the same", map[string]string{"worker0": sum(0, a), "worker1": sum(1, a), "worker3": joined + sum(3, a)}, 13, ""},
		{"one differs", map[string]string{"worker0": sum(0, a), "worker1": sum(1, b), "worker3": joined + sum(3, a)}, 13, "parameters differ"},
		{"one missing", map[string]string{"worker0": sum(0, a), "worker1": "worker 1: iteration 30 failed\n", "worker3": joined + sum(3, a)}, 13, "worker1 printed no"},
		{"the replacement elsewhere", map[string]string{"worker0": sum(0, a), "worker1": sum(1, a), "worker3": joined + sum(3, a)}, 14, "the scheduler counts it from 14"},
		{"no join line", map[string]string{"worker0": sum(0, a), "worker1": sum(1, a), "worker3": sum(3, a)}, 13, "no line saying it joined"},
		{"no worker", map[string]string{}, 13, "no worker"},
	} {
		got, ranks, err := sameChecksums(tc.logs, "worker3", tc.from)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: error %v, want one saying %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil || got != a || !slices.Equal(ranks, []int{0, 1, 3}) {
			t.Errorf("%s: %s on %v, %v; want %s on [0 1 3]", tc.name, got, ranks, err, a)
		}
	}
}
