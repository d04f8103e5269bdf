package tests

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fptps/fpt/internal/localcluster"
)

// survivors lists processes whose environment names the cluster's
// scheduler port: whatever run_test.sh started and left behind.
func survivors(port int) []string {
	return processesWithEnv(fmt.Sprintf("DMLC_PS_ROOT_PORT=%d", port))
}

// processesWithEnv lists the processes whose environment holds the setting
// kv ("KEY=VALUE").
func processesWithEnv(kv string) []string {
	needle := []byte(kv + "\x00")
	var found []string
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		env, err := os.ReadFile(d + "/environ")
		if err != nil || !bytes.Contains(env, needle) {
			continue
		}
		cmd, _ := os.ReadFile(d + "/cmdline")
		found = append(found, filepath.Base(d)+": "+strings.ReplaceAll(string(cmd), "\x00", " "))
	}
	return found
}

func runScript(port int, args ...string) *exec.Cmd {
	all := append([]string{"--scheduler", "--root", fmt.Sprintf("127.0.0.1:%d", port), "--no-monitor"}, args...)
	cmd := exec.Command("../scripts/run_test.sh", all...)
	cmd.Env = append(os.Environ(), "PS_VERBOSE=0")
	return cmd
}

// The README's first command: a whole local cluster that trains, verifies
// and leaves nothing behind. Every line is labelled with its process's role
// and rank (the ranks the nodes report), the rate monitor runs, and the
// final line is the last: nothing follows it.
func TestRunTestScript(t *testing.T) {
	port, err := localcluster.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	statusPort, err := localcluster.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	// The job lasts at least 2 s however fast the machine (40 pauses
	// of 50 ms), past the rate monitor's first line at 1 s, without
	// 300 iterations' CPU.
	cmd := exec.Command("../scripts/run_test.sh", "--scheduler", "--root", fmt.Sprintf("127.0.0.1:%d", port),
		"--status-port", strconv.Itoa(statusPort), "--", "-iters", "40", "-compute", "50ms", "-max-bytes", "1048576", "-quiet")
	cmd.Env = append(os.Environ(), "PS_VERBOSE=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("run_test.sh: %v\n%s", err, tail(string(out)))
	}
	s := string(out)
	mustContain(t, "output", s, "[worker 0] worker 0: PASS", "[worker 1] worker 1: PASS",
		fmt.Sprintf("run_test.sh: scheduler status page at http://127.0.0.1:%d/", statusPort))
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if last := lines[len(lines)-1]; last != "run_test.sh: all 5 processes finished cleanly" {
		t.Errorf("last line %q, want the final one:\n%s", last, tail(s))
	}
	labelRe := regexp.MustCompile(`^\[(scheduler|server [01]|worker [01]|net lo)\] `)
	ranks := regexp.MustCompile(`^\[(server|worker) (\d)\] .*msg=started .*id=(server|worker)(\d)\(`)
	seen := map[string]bool{}
	for _, l := range lines {
		if strings.HasPrefix(l, "run_test.sh: ") {
			continue
		}
		m := labelRe.FindStringSubmatch(l)
		if m == nil {
			t.Errorf("line without a role and rank label: %q", l)
			continue
		}
		seen[m[1]] = true
		// The label's rank is the one the node reports.
		if r := ranks.FindStringSubmatch(l); r != nil && (r[1] != r[3] || r[2] != r[4]) {
			t.Errorf("labelled %s %s, started as %s%s: %q", r[1], r[2], r[3], r[4], l)
		}
	}
	for _, label := range []string{"scheduler", "server 0", "server 1", "worker 0", "worker 1", "net lo"} {
		if !seen[label] {
			t.Errorf("no line labelled [%s]:\n%s", label, tail(s))
		}
	}
	if left := survivors(port); len(left) > 0 {
		t.Errorf("processes left behind: %v", left)
	}
}

// Ctrl-C at any point of a run: the script exits only once every process
// it started is gone, and the ports are free. The test is the children's
// subreaper while the script runs, so a process the script leaves to
// outlive it, even one killed and still tearing down (which a look at
// /proc right after the exit can miss), becomes the test's child and is
// found. Each point is interrupted several times: while the nodes start,
// and while they train.
func TestRunTestScriptInterrupted(t *testing.T) {
	points := []struct {
		name, after string
		cluster     bool // the whole cluster runs when the signal comes
	}{
		{"starting", "run_test.sh: cluster of", false},
		{"training", "iteration 2/", true},
	}
	const rounds = 3
	for _, p := range points {
		for i := 0; i < rounds; i++ {
			t.Run(fmt.Sprintf("%s/%d", p.name, i), func(t *testing.T) {
				interruptRunTest(t, p.after, p.cluster)
			})
		}
	}
}

// interruptRunTest starts a local cluster, sends run_test.sh SIGINT once
// its output holds after, and checks that nothing it started outlives it.
func interruptRunTest(t *testing.T, after string, cluster bool) {
	port, err := localcluster.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatalf("becoming a subreaper: %v", err)
	}
	defer unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
	cmd := runScript(port, "--", "-iters", "100000", "-max-bytes", "65536")
	var out localcluster.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(out.String(), after) {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("no %q:\n%s", after, tail(out.String()))
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The check below must be able to fail: it sees the running cluster.
	if running := survivors(port); cluster && len(running) < 5 {
		t.Errorf("found %d processes of the running cluster, want at least 5: %v", len(running), running)
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err == nil {
			t.Error("interrupted run_test.sh exited 0")
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatal("run_test.sh did not exit after SIGINT")
	}
	if orphans := adoptedChildren(); len(orphans) > 0 {
		t.Errorf("processes that outlived run_test.sh (left to its parent): %v\n%s", orphans, tail(out.String()))
	}
	if left := survivors(port); len(left) > 0 {
		t.Errorf("processes left behind: %v\n%s", left, tail(out.String()))
	}
	if l, err := net.Listen("tcp", fmt.Sprintf("0.0.0.0:%d", port)); err != nil {
		t.Errorf("scheduler port still taken: %v", err)
	} else {
		l.Close()
	}
}

// adoptedChildren lists, then kills and reaps, the children of this test
// process other than the ones it started: the processes a script it ran
// left to outlive it while the test was their subreaper. The tests of this
// package run one at a time, so every other child has been waited for.
func adoptedChildren() []string {
	me := strconv.Itoa(os.Getpid())
	var found []string
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		status, err := os.ReadFile(d + "/status")
		if err != nil || !regexp.MustCompile(`(?m)^PPid:\s+`+me+`$`).Match(status) {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(d))
		state := regexp.MustCompile(`(?m)^State:\s+(.*)$`).FindSubmatch(status)
		name := regexp.MustCompile(`(?m)^Name:\s+(.*)$`).FindSubmatch(status)
		if len(state) < 2 || len(name) < 2 {
			continue
		}
		found = append(found, fmt.Sprintf("%d %s (%s)", pid, name[1], state[1]))
		syscall.Kill(pid, syscall.SIGKILL)
		var ws syscall.WaitStatus
		syscall.Wait4(pid, &ws, 0, nil)
	}
	return found
}

// Under FPT_ON_WORKER_LOSS=continue a worker killed (kill -9) mid-run
// does not stop the others: the two left run to their end and pass, the
// script says which node the job went on without, and its status is still
// 1 (a process failed). Nothing is left behind.
func TestRunTestScriptWorkerLoss(t *testing.T) {
	port, err := localcluster.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	cmd := runScript(port, "--num-workers", "3", "--", "-iters", "60", "-compute", "20ms", "-max-bytes", "65536", "-classic", "0")
	cmd.Env = append(cmd.Env, "FPT_ON_WORKER_LOSS=continue")
	var out localcluster.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(out.String(), "iteration 10/") {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("no progress:\n%s", tail(out.String()))
		}
		time.Sleep(20 * time.Millisecond)
	}
	// One worker of this cluster: its pid leads processesWithEnv's line.
	var victim int
	for _, p := range processesWithEnv(fmt.Sprintf("DMLC_PS_ROOT_PORT=%d", port)) {
		if strings.Contains(p, "test_kv_app") {
			victim, _ = strconv.Atoi(p[:strings.IndexByte(p, ':')])
			break
		}
	}
	if victim == 0 {
		cmd.Process.Kill()
		t.Fatal("no worker process found")
	}
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killedAt := time.Now()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(2 * time.Minute):
		cmd.Process.Kill()
		t.Fatalf("run_test.sh did not end:\n%s", tail(out.String()))
	}
	s := out.String()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Errorf("run_test.sh: %v, want exit status 1 (a process failed)", err)
	}
	if n := strings.Count(s, "PASS: 60 iterations"); n != 2 {
		t.Errorf("%d workers passed, want the 2 left:\n%s", n, tail(s))
	}
	t.Logf("%s (ended %s after the kill)", tail(s), time.Since(killedAt).Round(time.Millisecond))
	mustContain(t, "run_test.sh output", s, "exited with status 137; the job goes on without it",
		"run_test.sh: the others finished cleanly; the job went on without worker")
	if left := survivors(port); len(left) > 0 {
		t.Errorf("processes left behind: %v", left)
	}
}
