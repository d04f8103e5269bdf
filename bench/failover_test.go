package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/node"
)

// The scenario end to end, short: real processes of the fpt binary on
// loopback, 24 iterations of a small model, server1 killed in iteration
// 5, a new server started in iteration 10. Checked: the loss happened
// (the scheduler took a server out and retried from an iteration at or
// past the kill), the join happened (the scheduler admitted a server new
// to the job, and an LB decision gave it a share from an iteration at or
// past the join), both runs reported every iteration, and the output has
// its shape, as tables and as JSON. Times are printed, not asserted.
func TestFailoverScenario(t *testing.T) {
	dir := t.TempDir()
	fpt := filepath.Join(dir, "fpt")
	build := exec.Command("go", "build", "-o", fpt, "./cmd/fpt")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building fpt: %v\n%s", err, out)
	}
	// 50 ms of compute per iteration: the LB probes a joined server's links
	// only once it has been measured for lb.Config.JoinSettle (500 ms).
	const iters, killAt, joinAt = 24, 5, 10
	fo := failoverOptions{killAt: killAt, joinAt: joinAt, lbOptions: lbOptions{iters: iters, tensors: 4, minBytes: 16 << 10, maxBytes: 1 << 20,
		compute: 50 * time.Millisecond}}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := runFailover(ctx, fpt, fo, newProgress(io.Discard))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(res.LostNode, "server") || res.RetryFrom < killAt || res.RetryFrom >= iters {
		t.Errorf("lost %q, retry from iteration %d: want a server, from %d to %d", res.LostNode, res.RetryFrom, killAt, iters-1)
	}
	// The new server's id: the next after the two the job started with.
	if !strings.HasPrefix(res.JoinedNode, "server2(") || res.JoinFrom < joinAt || res.JoinFrom >= iters {
		t.Errorf("joined %q, its share from iteration %d: want server2, from %d to %d", res.JoinedNode, res.JoinFrom, joinAt, iters-1)
	}
	if len(res.BaselineItersMs) != iters || len(res.RetryItersMs) != iters {
		t.Errorf("%d and %d iteration times, want %d each", len(res.BaselineItersMs), len(res.RetryItersMs), iters)
	}
	for _, x := range []float64{res.BaselineBeforeMs, res.BaselineAfterMs, res.BaselineJoinedMs, res.RetryBeforeMs, res.RetryAfterMs,
		res.RetryJoinedMs, res.RetriedIterMs, res.BeforeRatio, res.AfterRatio, res.JoinedRatio} {
		if !(x > 0) {
			t.Errorf("a time or ratio is %v, want positive: %+v", x, res)
		}
	}

	var out bytes.Buffer
	if err := writeFailover(&out, res, false, filepath.Join(dir, "failover.svg")); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", out.String())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	// The loss's window (header, up to 3 iterations before the retried
	// one and 10 after, within the run), a blank line, the join's (from 3
	// before the new server's start to 10 after its first share), a blank
	// line, the summary (header, row).
	loss := min(res.RetryFrom-1, failoverBefore) + 1 + min(iters-res.RetryFrom, failoverAfter)
	join := min(joinAt-1, failoverBefore) + 1 + res.JoinFrom - joinAt + min(iters-res.JoinFrom, failoverAfter)
	if len(lines) != 1+loss+1+1+join+1+2 {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), 1+loss+1+1+join+1+2, out.String())
	}
	for _, l := range []struct {
		i      int
		prefix string
	}{{0, "iteration"}, {loss + 2, "iteration"}, {loss + join + 4, "scenario"}, {loss + join + 5, "failover"}} {
		if !strings.HasPrefix(lines[l.i], l.prefix) {
			t.Errorf("line %d is %q, want it to start with %q", l.i, lines[l.i], l.prefix)
		}
	}
	for _, note := range []string{noteRetried, noteStarted, noteShare} {
		if !strings.Contains(out.String(), note) {
			t.Errorf("no %q in the tables:\n%s", note, out.String())
		}
	}

	out.Reset()
	if err := writeFailover(&out, res, true, ""); err != nil {
		t.Fatal(err)
	}
	rs, err := readResults(&out)
	if err != nil {
		t.Fatal(err)
	}
	if back, ok := rs[0].(failoverResult); len(rs) != 1 || !ok || back.RetryFrom != res.RetryFrom || back.JoinFrom != res.JoinFrom || len(back.RetryItersMs) != iters {
		t.Errorf("--json read back as %+v", rs)
	}
}

func TestFailoverAggregate(t *testing.T) {
	base := []float64{50, 10, 10, 10, 10, 20, 20, 20, 5, 30, 30}
	retry := []float64{60, 20, 20, 20, 80, 40, 40, 40, 9, 45, 45}
	r := failoverResult{Iterations: len(base)}
	if err := r.aggregate(base, retry, 5, 9); err != nil {
		t.Fatal(err)
	}
	// Before: iterations 2..4; after the loss: 6..8; retried: 5; the
	// joined server's first share: 9; joined: 10..11.
	want := failoverResult{Iterations: len(base), RetryFrom: 5, JoinFrom: 9, BaselineBeforeMs: 10, BaselineAfterMs: 20, BaselineJoinedMs: 30,
		RetryBeforeMs: 20, RetryAfterMs: 40, RetryJoinedMs: 45, BeforeRatio: 2, AfterRatio: 2, JoinedRatio: 1.5, RetriedIterMs: 80, RetriedRatio: 8}
	r.BaselineItersMs, r.RetryItersMs = nil, nil
	got, _ := json.Marshal(r)
	if w, _ := json.Marshal(want); !bytes.Equal(got, w) {
		t.Errorf("aggregate:\n got %s\nwant %s", got, w)
	}
	for _, tc := range []struct {
		name        string
		base, retry []float64
		from, join  int
	}{
		{"too few times", base[:10], retry, 5, 9},
		{"retry before any timed iteration", base, retry, 2, 9},
		{"share right after the retry", base, retry, 5, 6},
		{"share in the last iteration", base, retry, 5, 11},
		{"no share", base, retry, 5, 0},
		{"zero baseline", make([]float64, 11), retry, 5, 9},
	} {
		r := failoverResult{Iterations: 11}
		if err := r.aggregate(tc.base, tc.retry, tc.from, tc.join); err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
}

func TestParseLoss(t *testing.T) {
	log := `time=... level=INFO msg="lb decision" version=3
time=... level=WARN msg="membership change: worker left; the iterations not every worker has the sums of are summed again over the workers left" role=scheduler node=worker2(13)@198.18.0.5:40001 reason=lost membership_version=1 retry_from_iteration=10 decision_version=4 servers=2 workers=2
time=... level=WARN msg="membership change: server left; its incomplete iterations are pushed again" role=scheduler node=server1(10)@127.0.0.1:46783 reason="cluster: lost server1(10)@127.0.0.1:46783: van: connection to node 10 lost: unexpected EOF" membership_version=2 retry_from_iteration=20 decision_version=5 servers=1
`
	for _, tc := range []struct {
		role node.Role
		lost string
		from int
	}{
		{node.Server, "server1(10)@127.0.0.1:46783", 20},
		{node.Worker, "worker2(13)@198.18.0.5:40001", 10},
	} {
		lost, from, err := parseLoss(log, tc.role)
		if err != nil || lost != tc.lost || from != tc.from {
			t.Errorf("parseLoss(%s) = %q, %d, %v; want %q, %d", tc.role, lost, from, err, tc.lost, tc.from)
		}
	}
	if _, _, err := parseLoss(`msg="lb decision" version=3`, node.Server); err == nil {
		t.Error("no membership change: no error")
	}
}

func TestParseWorkerJoin(t *testing.T) {
	log := `time=... level=WARN msg="membership change: server joined" role=scheduler node=server2(12)@127.0.0.1:40177 membership_version=2 servers=2
time=... level=WARN msg="membership change: worker joined" role=scheduler node=worker3(15)@198.18.0.7:40002 membership_version=3 workers=3 from_iteration=13
`
	joined, from, err := parseWorkerJoin(log)
	if err != nil || joined != "worker3(15)@198.18.0.7:40002" || from != 13 {
		t.Errorf("parseWorkerJoin = %q, %d, %v", joined, from, err)
	}
	if _, _, err := parseWorkerJoin(strings.SplitN(log, "\n", 2)[0]); err == nil {
		t.Error("only a server joined: no error")
	}
}

func TestParseJoin(t *testing.T) {
	log := `time=... level=INFO msg="server joining the running job" role=scheduler node=server2(12)@127.0.0.1:40177
time=... level=WARN msg="membership change: server joined" role=scheduler node=server2(12)@127.0.0.1:40177 membership_version=2 servers=2 share="after the next probe"
`
	for _, tc := range []struct {
		name, decisions string
		from            int // 0: an error
	}{
		{"a probe gives it a share", `lb decision v3 from iteration 17: server0(8) 100.0%; retry (server1(10) lost)
lb decision v4 from iteration 23: server0(8) 25.0%, server2(12) 25.0%, worker0(9) 25.0%, worker1(11) 25.0%; probe; shaping off (probe: server2(12) joined)
lb decision v5 from iteration 28: server0(8) 50.0%, server2(12) 50.0%`, 23},
		{"a zero share is none", `lb decision v4 from iteration 23: server0(8) 100.0%, server2(12) 0.0%
lb decision v5 from iteration 30: server0(8) 50.0%, server2(12) 50.0% (server2(12) joined: even split over 2 servers)`, 30},
		{"only named in a reason", `lb decision v4 from iteration 23: server0(8) 100.0% (probe failed: no measurement of server2(12))`, 0},
		{"no decision", "", 0},
	} {
		node, from, err := parseJoin(log, tc.decisions)
		if node != "server2(12)@127.0.0.1:40177" || from != tc.from || (err != nil) != (tc.from == 0) {
			t.Errorf("%s: parseJoin = %q, %d, %v; want from iteration %d", tc.name, node, from, err, tc.from)
		}
	}
	if _, _, err := parseJoin(`msg="lb decision" version=3`, ""); err == nil {
		t.Error("no join: no error")
	}
}

// --kill-at and --join-at must leave iterations before the loss, between
// it and the join, and after the join.
func TestFailoverUsage(t *testing.T) {
	for _, args := range [][]string{
		{"--scenario", "failover", "--kill-at", "2"},
		{"--scenario", "failover", "--iters", "10", "--kill-at", "9"},
		{"--scenario", "failover", "--iters", "30", "--kill-at", "19"},
		{"--scenario", "failover", "--kill-at", "20", "--join-at", "21"},
		{"--scenario", "failover", "--iters", "40", "--join-at", "31"},
		{"--scenario", "failover", "--tensors", "0"},
	} {
		f := newFlags(io.Discard)
		if err := f.fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		if code := failoverMain(f); code != 2 {
			t.Errorf("%v: exit %d, want 2 (usage)", args, code)
		}
	}
}
