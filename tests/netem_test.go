package tests

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fptps/fpt/internal/localcluster"
	"github.com/fptps/fpt/netem"
)

// skipRootTestsEnv, set to 1, skips the tests that need root instead of
// failing them.
const skipRootTestsEnv = "FPT_SKIP_ROOT_TESTS"

func needRoot(t *testing.T) {
	t.Helper()
	if err := netem.Available(); err != nil {
		if os.Getenv(skipRootTestsEnv) == "1" {
			t.Skipf("%v (%s=1)", err, skipRootTestsEnv)
		}
		t.Fatalf("this test needs root, iproute2 and tc (CI runs as root); set %s=1 to skip it: %v", skipRootTestsEnv, err)
	}
}

// netemRun is one "fpt netem" process (or another long-running command,
// such as fptrun); mark is in the environment of everything it starts, to
// find what it leaves behind.
type netemRun struct {
	cmd  *exec.Cmd
	out  localcluster.Buffer
	mark string
}

func startNetem(t *testing.T, args ...string) *netemRun {
	t.Helper()
	return startFPT(t, append([]string{"netem"}, args...)...)
}

// startFPT runs bin/fpt with args, as a run whose leftovers checkGone finds
// (fpt netem, or fpt bench --scenario).
func startFPT(t *testing.T, args ...string) *netemRun {
	t.Helper()
	r := &netemRun{cmd: exec.Command(bin.fpt, args...)}
	r.mark = fmt.Sprintf("FPT_NETEM_TEST_RUN=%s-%d", t.Name(), time.Now().UnixNano())
	r.cmd.Env = append(os.Environ(), "PS_VERBOSE=0", r.mark)
	r.cmd.Stdout, r.cmd.Stderr = &r.out, &r.out
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return r
}

// wait returns the exit status, failing the test if it takes over timeout.
func (r *netemRun) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- r.cmd.Wait() }()
	select {
	case <-done:
		return r.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		r.cmd.Process.Signal(syscall.SIGTERM)
		<-done
		t.Fatalf("%s still running after %s:\n%s", strings.Join(r.cmd.Args, " "), timeout, tail(r.out.String()))
		return -1
	}
}

// checkGone fails the test if the run left namespaces, links or processes.
func (r *netemRun) checkGone(t *testing.T) {
	t.Helper()
	// Names of the package's objects: "fpt", the owner's pid, a letter.
	ours := regexp.MustCompile(`^fpt` + strconv.Itoa(r.cmd.Process.Pid) + `[a-z]`)
	for _, args := range [][]string{{"ip", "netns", "list"}, {"ip", "-o", "link", "show"}} {
		out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
		if err != nil {
			t.Fatalf("%q: %v: %s", args, err, out)
		}
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			if args[1] == "-o" && len(f) > 1 {
				f = f[1:]
			}
			if len(f) > 0 && ours.MatchString(f[0]) {
				t.Errorf("left behind (%s): %s", strings.Join(args, " "), line)
			}
		}
	}
	if left := processesWithEnv(r.mark); len(left) > 0 {
		t.Errorf("processes left behind: %v", left)
	}
}

// The acceptance run: three hosts, one of them slow, each running a
// server and a worker through run_test.sh; every worker verifies every
// value and nothing is left afterwards.
func TestNetemCluster(t *testing.T) {
	needRoot(t)
	script, builds := netemTree(t)
	r := startNetem(t, "--hosts", "1gbit,200mbit,1gbit", "--cluster", "--script", script,
		"--", "--iters", "5", "--max-bytes", "4194304")
	code := r.wait(t, 3*time.Minute)
	out := r.out.String()
	if code != 0 {
		t.Fatalf("fpt netem exited %d:\n%s", code, tail(out))
	}
	// fpt netem builds once, before the hosts start (their run_test.sh
	// finds the binaries fresh).
	if b, err := os.ReadFile(builds); err != nil || string(b) != "built\n" {
		t.Errorf("build.sh ran %d times (err %v), want once", strings.Count(string(b), "built"), err)
	}
	passed := map[string]bool{}
	// Host i runs worker rank i (run_test.sh --first-worker).
	for _, m := range regexp.MustCompile(`(?m)^\[h(\d)\] \[worker (\d)\] worker (\d): PASS: 5 iterations`).FindAllStringSubmatch(out, -1) {
		passed[m[1]] = m[1] == m[2] && m[2] == m[3]
	}
	if len(passed) != 3 || !passed["0"] || !passed["1"] || !passed["2"] {
		t.Errorf("hosts whose worker of their rank passed: %v, want 0, 1 and 2:\n%s", passed, tail(out))
	}
	mustContain(t, "output", out, "fpt netem: h1 198.18.0.2 in ", "up 200mbit, down 200mbit",
		"iteration 5/5 verified", "[h0] run_test.sh: all 3 processes finished cleanly",
		"[h2] run_test.sh: all 2 processes finished cleanly", "network of 3 hosts removed")
	r.checkGone(t)
}

// netemTree lays out a repository for fpt netem --cluster: the real
// scripts/run_test.sh, the package's binaries in bin/, and a
// scripts/build.sh that only records each call in the file builds. The
// binaries are this run's already; the real build.sh would build the C
// library and its programs too, minutes of a small machine's time that
// this test has no use for.
func netemTree(t *testing.T) (script, builds string) {
	t.Helper()
	root := t.TempDir()
	builds = filepath.Join(root, "builds")
	for _, d := range []string{"scripts", "bin"} {
		if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	real, err := filepath.Abs("../scripts/run_test.sh")
	if err != nil {
		t.Fatal(err)
	}
	script = filepath.Join(root, "scripts", "run_test.sh")
	for link, target := range map[string]string{script: real,
		filepath.Join(root, "bin", "fpt"): bin.fpt, filepath.Join(root, "bin", "test_kv_app"): bin.app} {
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
	}
	stub := fmt.Sprintf("#!/bin/sh\necho built >>%q\n", builds)
	if err := os.WriteFile(filepath.Join(root, "scripts", "build.sh"), []byte(stub), 0o755); err != nil {
		t.Fatal(err)
	}
	return script, builds
}

// One host's command fails: fpt netem exits with its status at once,
// stopping the others (which would sleep for 30 s), and tears down.
func TestNetemFailedRun(t *testing.T) {
	needRoot(t)
	start := time.Now()
	r := startNetem(t, "--hosts", "none,50mbit,none", "--",
		"sh", "-c", `if [ "$FPT_NETEM_HOST" = 1 ]; then exit 3; fi; exec sleep 30`)
	code := r.wait(t, time.Minute)
	took := time.Since(start)
	if code != 3 {
		t.Errorf("exit status %d, want 3 (the failing host's):\n%s", code, tail(r.out.String()))
	}
	if took > 15*time.Second {
		t.Errorf("took %s: the other hosts were not stopped", took)
	}
	mustContain(t, "output", r.out.String(), "h1 failed", "network of 3 hosts removed")
	r.checkGone(t)
}

// SIGINT to a running fpt netem: the hosts' commands stop, the network
// goes, the status says so.
func TestNetemInterrupted(t *testing.T) {
	needRoot(t)
	r := startNetem(t, "--hosts", "100mbit,none", "--", "sh", "-c", "echo ready; exec sleep 60")
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(r.out.String(), "[h0] ready") || !strings.Contains(r.out.String(), "[h1] ready") {
		if time.Now().After(deadline) {
			r.cmd.Process.Kill()
			t.Fatalf("hosts never started:\n%s", tail(r.out.String()))
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The checks below must be able to fail: they see the running hosts.
	if running := processesWithEnv(r.mark); len(running) < 2 {
		t.Errorf("found %d processes of the run, want at least 2: %v", len(running), running)
	}
	if err := r.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if code := r.wait(t, 30*time.Second); code != 130 {
		t.Errorf("exit status %d, want 130:\n%s", code, tail(r.out.String()))
	}
	r.checkGone(t)
}

// The bench scenarios run end to end in their emulated network, print
// their JSON line (--json), and leave nothing behind. Their figures are
// reported, not asserted: speeds are for the benchmark's reader (see
// docs/benchmarks.md).
func TestBenchScenarios(t *testing.T) {
	needRoot(t)
	for _, tc := range []struct {
		args   []string
		fields []string
	}{
		{[]string{"--scenario", "shaping", "--rate", "50mbit", "--tensor-bytes", "4194304", "--iters", "4", "--json"},
			[]string{"byte_ratio", "unshaped_byte_ratio", "window_seconds"}},
		{[]string{"--scenario", "priority", "--rate", "50mbit", "--tensor-bytes", "2097152", "--iters", "1", "--json"},
			[]string{"high_done_ms", "low_done_ms", "nopriority_done_ms"}},
		// The LB scenarios, small: a 0.4 MB model, 4 iterations a run.
		{lbScenarioArgs("slow-server"), lbScenarioFields},
		{lbScenarioArgs("equal"), lbScenarioFields},
		{lbScenarioArgs("slow-worker"), lbScenarioFields},
		// The elastic scenarios, small (the later flags win): server1
		// killed in iteration 4 of 12; a server started in iteration 5 of
		// 20 (its probe needs the joiner measured for half a second first).
		{append(lbScenarioArgs("server-loss"), "--iters", "12", "--kill-at", "4", "--tail", "3"),
			append(elasticFields, "retry_from_iteration", "retried_iter_ms", "kill_at")},
		{append(lbScenarioArgs("server-join"), "--iters", "20", "--join-at", "5", "--tail", "3"),
			append(elasticFields, "share_from_iteration", "join_at")},
		// worker2 killed in iteration 4 of 12 under
		// FPT_ON_WORKER_LOSS=wait, a replacement started once the
		// scheduler logged the loss (it fails unless every worker ends
		// with the same parameters).
		{append(lbScenarioArgs("worker-wait"), "--iters", "12", "--kill-at", "4", "--tail", "3"),
			append(elasticFields, "retry_from_iteration", "hold_iteration", "joined_from_iteration", "join_iter_ms", "waited_ms", "kill_at")},
		// 1 and 4 connections per pair under a per-flow cap, small; the
		// last line is the 4-channel run's.
		{[]string{"--scenario", "channels", "--tensor-bytes", "4194304", "--iters", "3", "--json"},
			[]string{"goodput_gbps", "vs_one_channel"}},
	} {
		t.Run(tc.args[1], func(t *testing.T) {
			r := startFPT(t, append([]string{"bench"}, tc.args...)...)
			if code := r.wait(t, 3*time.Minute); code != 0 {
				t.Fatalf("fpt bench %v exited %d:\n%s", tc.args, code, tail(r.out.String()))
			}
			var line map[string]any
			out := strings.TrimSpace(r.out.String())
			if err := json.Unmarshal([]byte(out[strings.LastIndexByte(out, '\n')+1:]), &line); err != nil {
				t.Fatalf("last line is not JSON (%v):\n%s", err, tail(out))
			}
			if line["scenario"] != tc.args[1] {
				t.Errorf("scenario %v, want %s", line["scenario"], tc.args[1])
			}
			for _, f := range tc.fields {
				if v, ok := line[f].(float64); !ok || !(v > 0) {
					t.Errorf("%s = %v, want a positive number: %s", f, line[f], out)
				}
			}
			checkExits(t, line)
			if line["scenario"] == "channels" && (line["channels"] != 4.0 || line["checked"] != true) {
				t.Errorf("channels scenario's last line: channels %v, checked %v; want 4 and true", line["channels"], line["checked"])
			}
			t.Logf("%s", out)
			r.checkGone(t)
		})
	}
}

// elasticFields are the elastic scenarios' figures that must be positive.
var elasticFields = []string{"before_iter_ms", "after_iter_ms", "bound_before_ms", "bound_after_ms",
	"after_over_bound", "after_over_before", "model_bytes", "iterations"}

// checkExits checks an elastic scenario's exits, when it has them: every
// process exited 0 (a worker's 0 is its trainer's PASS) but server1 in
// server-loss and worker2 in worker-wait, killed by a signal (-1).
func checkExits(t *testing.T, line map[string]any) {
	t.Helper()
	exits, ok := line["exits"].(map[string]any)
	if !ok {
		return
	}
	for _, name := range []string{"scheduler", "server0", "server1", "worker0", "worker1"} {
		want := 0.0
		if name == "server1" && line["scenario"] == "server-loss" {
			want = -1
		}
		if exits[name] != want {
			t.Errorf("%s exited %v, want %v: %v", name, exits[name], want, exits)
		}
	}
	if line["scenario"] == "server-join" && exits["server2"] != 0.0 {
		t.Errorf("the joined server2 exited %v, want 0: %v", exits["server2"], exits)
	}
	if line["scenario"] == "worker-wait" && (exits["worker2"] != -1.0 || exits["worker3"] != 0.0) {
		t.Errorf("the killed worker2 exited %v and its replacement worker3 %v, want -1 and 0: %v", exits["worker2"], exits["worker3"], exits)
	}
}

// lbScenarioArgs runs an LB scenario of "fpt bench" small enough for a
// test: 40 Mbit/s links (the slow one 10), a model of 4 tensors (16 KiB to
// 256 KiB), 4 iterations with the LB off and 4 with it on.
func lbScenarioArgs(name string) []string {
	return []string{"--scenario", name, "--rate", "40mbit", "--iters", "4", "--tail", "2",
		"--tensors", "4", "--min-bytes", "16384", "--max-bytes", "262144", "--json"}
}

// lbScenarioFields are the LB scenarios' figures that must be positive.
var lbScenarioFields = []string{"even_iter_ms", "lb_iter_ms", "bound_iter_ms", "even_model_iter_ms",
	"lb_over_bound", "even_over_lb", "model_bytes", "workers", "servers", "iterations"}
