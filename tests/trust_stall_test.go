package tests

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fptps/fpt/internal/localcluster"
)

// A server that cannot start (its data port is taken) tells the scheduler
// at once; the worker started beside it fails naming that server, long
// before FPT_START_TIMEOUT (120 s here).
func TestStartFailureToldAtOnce(t *testing.T) {
	port, err := localcluster.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	// The server's control port is free, its data port (the next one) held.
	serverPort, err := localcluster.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	held, err := net.Listen("tcp", ":"+strconv.Itoa(serverPort+1))
	if err != nil {
		t.Skipf("cannot hold port %d: %v", serverPort+1, err)
	}
	defer held.Close()
	env := []string{"DMLC_PS_ROOT_URI=127.0.0.1", fmt.Sprintf("DMLC_PS_ROOT_PORT=%d", port), "DMLC_NUM_SERVER=2", "DMLC_NUM_WORKER=1",
		"FPT_START_TIMEOUT=120", "PATH=" + os.Getenv("PATH")}
	run := func(role, path string, extra ...string) *exec.Cmd {
		cmd := exec.Command(path)
		cmd.Env = append(append([]string{"DMLC_ROLE=" + role}, env...), extra...)
		return cmd
	}
	cmds := []*exec.Cmd{
		run("scheduler", bin.fpt),
		run("server", bin.fpt),
		run("server", bin.fpt, "FPT_NODE_PORT="+strconv.Itoa(serverPort)),
		run("worker", bin.app),
	}
	start := time.Now()
	out := workerFails(t, cmds, "a server failed to start")
	mustContain(t, "worker output", out, "failed while starting", strconv.Itoa(serverPort))
	t.Logf("worker exited after %s: %s", time.Since(start).Round(time.Millisecond), out)
}

// workerFails starts cmds (the last one the worker) and waits, for a
// bounded time, for the worker to exit non-zero because of what; it
// returns the worker's output.
func workerFails(t *testing.T, cmds []*exec.Cmd, what string) string {
	t.Helper()
	outs := make([]localcluster.Buffer, len(cmds))
	for i, cmd := range cmds {
		cmd.Stdout, cmd.Stderr = &outs[i], &outs[i]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	}
	w := len(cmds) - 1
	done := make(chan error, 1)
	go func() { done <- cmds[w].Wait() }()
	select {
	case err := <-done:
		if err == nil {
			t.Errorf("the worker exited 0")
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("the worker still waits 60 s after %s; its output:\n%s", what, outs[w].String())
	}
	return outs[w].String()
}

// A server stopped (SIGSTOP) for longer than the heartbeat timeout is named
// as the dead node by everyone, itself included once it resumes: not the
// scheduler.
func TestStoppedServerIsTheCulprit(t *testing.T) {
	c := startCluster(t, spec{servers: 2, workers: 2, appArgs: []string{"-iters", "100000", "-max-bytes", "65536"},
		env: []string{"PS_HEARTBEAT_INTERVAL=0.2", "PS_HEARTBEAT_TIMEOUT=1"}})
	victim := c.proc("server1")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, err := waitOutput(ctx, victim, controlRe)
	if err != nil {
		t.Fatal(err)
	}
	addr := m[1]
	if _, err := waitOutput(ctx, c.proc("worker0"), regexp.MustCompile(`iteration 3/`)); err != nil {
		c.dump()
		t.Fatal(err)
	}
	if err := syscall.Kill(victim.Cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// Never leave a stopped process behind.
	defer syscall.Kill(victim.Cmd.Process.Pid, syscall.SIGCONT)
	// Everyone else fails naming the stopped server.
	for _, p := range c.Procs {
		if p == victim {
			continue
		}
		if !p.Wait(30 * time.Second) {
			syscall.Kill(victim.Cmd.Process.Pid, syscall.SIGCONT)
			c.dump()
			t.Fatalf("%s still running 30 s after server1 was stopped", p.Name)
		}
		if p.ExitCode() == 0 {
			t.Errorf("%s exited 0", p.Name)
		}
		mustContain(t, p.Name+" stderr", p.Stderr.String(), addr)
	}
	// Resumed, it names itself: it was the one not running.
	if err := syscall.Kill(victim.Cmd.Process.Pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if !victim.Wait(30 * time.Second) {
		c.dump()
		t.Fatal("server1 still running 30 s after it resumed")
	}
	if victim.ExitCode() == 0 {
		t.Error("server1 exited 0")
	}
	out := victim.Stderr.String()
	mustContain(t, "server1 stderr", out, addr)
	if strings.Contains(out, "unreachable") {
		t.Errorf("server1 blames the scheduler:\n%s", out)
	}
}

// A server that rejects the node table (its DMLC_NUM_WORKER disagrees)
// fails after the table was sent: the scheduler names it to everyone, and
// the worker, waiting at the start barrier, fails at once naming it.
func TestBadTableToldAtOnce(t *testing.T) {
	port, err := localcluster.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	env := []string{"DMLC_PS_ROOT_URI=127.0.0.1", fmt.Sprintf("DMLC_PS_ROOT_PORT=%d", port), "DMLC_NUM_SERVER=2",
		"FPT_START_TIMEOUT=120", "PATH=" + os.Getenv("PATH")}
	run := func(role, path string, extra ...string) *exec.Cmd {
		cmd := exec.Command(path)
		cmd.Env = append(append([]string{"DMLC_ROLE=" + role}, env...), extra...)
		return cmd
	}
	cmds := []*exec.Cmd{
		run("scheduler", bin.fpt, "DMLC_NUM_WORKER=1"),
		run("server", bin.fpt, "DMLC_NUM_WORKER=1"),
		run("server", bin.fpt, "DMLC_NUM_WORKER=2"),
		run("worker", bin.app, "DMLC_NUM_WORKER=1"),
	}
	out := workerFails(t, cmds, "a server rejected the table")
	mustContain(t, "worker output", out, "failed while starting", "node table has", "server")
	if strings.Contains(out, "node(0)") {
		t.Errorf("the worker does not name the server:\n%s", out)
	}
	t.Logf("worker: %s", out)
}
