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
)

// The scenario end to end, short: real processes of the fpt binary on
// loopback, 12 iterations of a small model, server1 killed in iteration
// 5. Checked: the loss happened (the scheduler took a server out and
// retried from an iteration at or past the kill), both runs reported
// every iteration, and the output has its shape, as tables and as JSON.
// Times are printed, not asserted.
func TestFailoverScenario(t *testing.T) {
	dir := t.TempDir()
	fpt := filepath.Join(dir, "fpt")
	build := exec.Command("go", "build", "-o", fpt, "./cmd/fpt")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building fpt: %v\n%s", err, out)
	}
	const iters, killAt = 12, 5
	fo := failoverOptions{killAt: killAt, lbOptions: lbOptions{iters: iters, tensors: 4, minBytes: 16 << 10, maxBytes: 1 << 20}}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := runFailover(ctx, fpt, fo, newProgress(io.Discard))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(res.LostNode, "server") || res.RetryFrom < killAt || res.RetryFrom >= iters {
		t.Errorf("lost %q, retry from iteration %d: want a server, from %d to %d", res.LostNode, res.RetryFrom, killAt, iters-1)
	}
	if len(res.BaselineItersMs) != iters || len(res.RetryItersMs) != iters {
		t.Errorf("%d and %d iteration times, want %d each", len(res.BaselineItersMs), len(res.RetryItersMs), iters)
	}
	for _, x := range []float64{res.BaselineBeforeMs, res.BaselineAfterMs, res.RetryBeforeMs, res.RetryAfterMs, res.RetriedIterMs, res.BeforeRatio, res.AfterRatio} {
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
	// The window (header, up to 3 iterations before the retried one and
	// 10 after, within the run), a blank line, the summary (header, row).
	window := min(res.RetryFrom-1, failoverBefore) + 1 + min(iters-res.RetryFrom, failoverAfter)
	if len(lines) != 1+window+1+2 {
		t.Fatalf("%d lines, want %d", len(lines), 1+window+1+2)
	}
	if !strings.HasPrefix(lines[0], "iteration") || !strings.Contains(out.String(), "<- server lost, retried") ||
		!strings.HasPrefix(lines[window+2], "scenario") || !strings.HasPrefix(lines[window+3], "failover") {
		t.Errorf("not the tables' shape:\n%s", out.String())
	}

	out.Reset()
	if err := writeFailover(&out, res, true, ""); err != nil {
		t.Fatal(err)
	}
	rs, err := readResults(&out)
	if err != nil {
		t.Fatal(err)
	}
	if back, ok := rs[0].(failoverResult); len(rs) != 1 || !ok || back.RetryFrom != res.RetryFrom || len(back.RetryItersMs) != iters {
		t.Errorf("--json read back as %+v", rs)
	}
}

func TestFailoverAggregate(t *testing.T) {
	base := []float64{50, 10, 10, 10, 10, 20, 20, 20}
	retry := []float64{60, 20, 20, 20, 80, 40, 40, 40}
	r := failoverResult{Iterations: len(base)}
	if err := r.aggregate(base, retry, 5); err != nil {
		t.Fatal(err)
	}
	// Before: iterations 2..4; after: 6..8; retried: 5.
	want := failoverResult{Iterations: len(base), RetryFrom: 5, BaselineBeforeMs: 10, BaselineAfterMs: 20,
		RetryBeforeMs: 20, RetryAfterMs: 40, BeforeRatio: 2, AfterRatio: 2, RetriedIterMs: 80, RetriedRatio: 8}
	r.BaselineItersMs, r.RetryItersMs = nil, nil
	got, _ := json.Marshal(r)
	if w, _ := json.Marshal(want); !bytes.Equal(got, w) {
		t.Errorf("aggregate:\n got %s\nwant %s", got, w)
	}
	for _, tc := range []struct {
		name        string
		base, retry []float64
		from        int
	}{
		{"too few times", base[:7], retry, 5},
		{"retry before any timed iteration", base, retry, 2},
		{"retry in the last iteration", base, retry, 8},
		{"zero baseline", make([]float64, 8), retry, 5},
	} {
		r := failoverResult{Iterations: 8}
		if err := r.aggregate(tc.base, tc.retry, tc.from); err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
}

func TestParseLoss(t *testing.T) {
	log := `time=... level=INFO msg="lb decision" version=3
time=... level=WARN msg="membership change: server left; its incomplete iterations are pushed again" role=scheduler node=server1(10)@127.0.0.1:46783 reason="cluster: lost server1(10)@127.0.0.1:46783: van: connection to node 10 lost: unexpected EOF" membership_version=1 retry_from_iteration=20 decision_version=4 servers=1
`
	node, from, err := parseLoss(log)
	if err != nil || node != "server1(10)@127.0.0.1:46783" || from != 20 {
		t.Errorf("parseLoss = %q, %d, %v", node, from, err)
	}
	if _, _, err := parseLoss(`msg="lb decision" version=3`); err == nil {
		t.Error("no membership change: no error")
	}
}

// --kill-at must leave iterations before and after the loss.
func TestFailoverUsage(t *testing.T) {
	for _, args := range [][]string{
		{"--scenario", "failover", "--kill-at", "2"},
		{"--scenario", "failover", "--iters", "10", "--kill-at", "9"},
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
