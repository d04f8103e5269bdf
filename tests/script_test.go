package tests

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

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
// and leaves nothing behind.
func TestRunTestScript(t *testing.T) {
	port, err := localcluster.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	out, err := runScript(port, "--", "-iters", "2", "-max-bytes", "1048576").CombinedOutput()
	if err != nil {
		t.Fatalf("run_test.sh: %v\n%s", err, tail(string(out)))
	}
	s := string(out)
	mustContain(t, "output", s, "[worker1] worker", "iteration 2/2 verified", "PASS", "all 5 processes finished cleanly")
	if n := strings.Count(s, "PASS"); n != 2 {
		t.Errorf("%d workers passed, want 2", n)
	}
	if left := survivors(port); len(left) > 0 {
		t.Errorf("processes left behind: %v", left)
	}
}

// Ctrl-C in the middle of a run: every child goes, the ports are free.
func TestRunTestScriptInterrupted(t *testing.T) {
	port, err := localcluster.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	cmd := runScript(port, "--", "-iters", "100000", "-max-bytes", "65536")
	var out localcluster.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(out.String(), "iteration 2/") {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("no progress:\n%s", tail(out.String()))
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The check below must be able to fail: it sees the running cluster.
	if running := survivors(port); len(running) < 5 {
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
	if left := survivors(port); len(left) > 0 {
		t.Errorf("processes left behind: %v", left)
	}
	if l, err := net.Listen("tcp", fmt.Sprintf("0.0.0.0:%d", port)); err != nil {
		t.Errorf("scheduler port still taken: %v", err)
	} else {
		l.Close()
	}
}
