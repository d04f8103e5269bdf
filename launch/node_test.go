package launch_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/internal/localcluster"
	"github.com/fptps/fpt/internal/metricstest"
	"github.com/fptps/fpt/launch"
	"github.com/fptps/fpt/worker"
)

// nodeConfig is one node's configuration for a loopback cluster whose
// scheduler listens on port, with extra variables.
func nodeConfig(t *testing.T, role string, port int, extra map[string]string) config.Config {
	t.Helper()
	e := map[string]string{
		"DMLC_ROLE":         role,
		"DMLC_PS_ROOT_URI":  "127.0.0.1",
		"DMLC_PS_ROOT_PORT": strconv.Itoa(port),
		"DMLC_NUM_SERVER":   "1",
		"DMLC_NUM_WORKER":   "1",
	}
	for k, v := range extra {
		e[k] = v
	}
	cfg, err := config.FromEnv(func(k string) (string, bool) { v, ok := e[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func freePort(t *testing.T) int {
	t.Helper()
	p, err := localcluster.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// The scheduler starts in the background: Start returns at once, its
// outcome is Finalize's (and Err's once Done), and the metrics it served
// stop with it.
func TestStartSchedulerOutcomeIsFinalizes(t *testing.T) {
	taken, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	port := taken.Addr().(*net.TCPAddr).Port
	cfg := nodeConfig(t, "scheduler", port, map[string]string{"FPT_METRICS_ADDR": "127.0.0.1:0"})
	n, err := launch.Start(context.Background(), cfg, launch.Deps{Log: quiet})
	if err != nil {
		t.Fatalf("Start of a scheduler whose port is taken: %v, want nil (the outcome is Finalize's)", err)
	}
	if n.Worker() != nil || n.Rank() != 0 {
		t.Errorf("scheduler: Worker %v, Rank %d; want nil, 0", n.Worker(), n.Rank())
	}
	addr := n.MetricsAddr()
	if strings.HasSuffix(addr, ":0") || addr == "" {
		t.Fatalf("MetricsAddr = %q, want the port chosen", addr)
	}
	<-n.Done()
	if err := n.Err(); err == nil || !strings.Contains(err.Error(), "DMLC_PS_ROOT_PORT") {
		t.Errorf("Err after Done: %v, want the taken port", err)
	}
	if err := n.Finalize(context.Background()); err == nil || !strings.Contains(err.Error(), "DMLC_PS_ROOT_PORT") {
		t.Errorf("Finalize: %v, want the taken port", err)
	}
	if _, err := metricstest.Scrape(context.Background(), addr); err == nil {
		t.Error("metrics still served after Finalize")
	}
}

// Finalize's context bounds how long it waits for the scheduler, which it
// stops when the context ends (a binary's SIGTERM).
func TestFinalizeContextStopsScheduler(t *testing.T) {
	n, err := launch.Start(context.Background(), nodeConfig(t, "scheduler", freePort(t), nil), launch.Deps{Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-n.Done():
		t.Fatalf("the scheduler returned before any node registered: %v", n.Err())
	default:
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := n.Finalize(ctx); err == nil || !strings.Contains(err.Error(), "interrupted") {
		t.Errorf("Finalize with an ended context: %v, want the scheduler interrupted", err)
	}
}

// A Start that fails has released everything it bound: the metrics port
// can be served again at once.
func TestStartFailureReleases(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	metricsAddr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	tests := []struct {
		name  string
		role  string
		extra map[string]string
		want  string
	}{
		{"metrics address taken", "server", map[string]string{"FPT_METRICS_ADDR": busy.Addr().String()}, "FPT_METRICS_ADDR"},
		// No scheduler listens: the worker gives up after its start timeout.
		{"no scheduler", "worker", map[string]string{"FPT_METRICS_ADDR": metricsAddr, "FPT_START_TIMEOUT": "0.5"}, ""},
		{"no scheduler, server", "server", map[string]string{"FPT_METRICS_ADDR": metricsAddr, "FPT_START_TIMEOUT": "0.5"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := nodeConfig(t, tt.role, freePort(t), tt.extra)
			n, err := launch.Start(context.Background(), cfg, launch.Deps{Log: quiet})
			if err == nil {
				n.Close()
				t.Fatal("Start succeeded")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Start: %v, want it to name %q", err, tt.want)
			}
			if cfg.MetricsAddr == busy.Addr().String() {
				return // the test holds it
			}
			l, err := net.Listen("tcp", cfg.MetricsAddr)
			if err != nil {
				t.Fatalf("the metrics address is still held after a failed Start: %v", err)
			}
			l.Close()
		})
	}
}

// A worker role needs a training program.
func TestRunWorkerWithoutTrain(t *testing.T) {
	err := launch.Run(context.Background(), nodeConfig(t, "worker", freePort(t), nil), launch.Deps{Log: quiet}, nil)
	if err == nil || !strings.Contains(err.Error(), "training program") {
		t.Errorf("Run of a worker without train: %v", err)
	}
}

// Close stops a scheduler at once; a nil decisions writer is allowed (the
// decisions are only logged).
func TestCloseStopsScheduler(t *testing.T) {
	n, err := launch.Start(context.Background(), nodeConfig(t, "scheduler", freePort(t), nil), launch.Deps{Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	n.Close()
	select {
	case <-n.Done():
	case <-time.After(time.Minute):
		t.Fatal("Close did not stop the scheduler")
	}
	if err := n.Err(); err == nil || !strings.Contains(err.Error(), "interrupted") {
		t.Errorf("Err after Close: %v, want the scheduler interrupted", err)
	}
}

// Protected mode: without a secret, a job that is not on loopback is a
// configuration error naming FPT_CLUSTER_SECRET (exit 2), for the scheduler
// and for a server; with FPT_INSECURE=1 or a secret it is not.
func TestProtectedMode(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want int
	}{
		{"scheduler elsewhere", map[string]string{"DMLC_ROLE": "scheduler", "DMLC_PS_ROOT_URI": "198.18.0.1"}, launch.ExitUsage},
		{"server advertising a non-loopback address", map[string]string{"DMLC_ROLE": "server", "DMLC_NODE_HOST": "198.18.0.2"}, launch.ExitUsage},
	}
	for _, tt := range tests {
		env := map[string]string{"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": strconv.Itoa(freePort(t)),
			"DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "1", "FPT_START_TIMEOUT": "0.5"}
		for k, v := range tt.env {
			env[k] = v
		}
		code, stderr := mainInChild(t, env)
		if code != tt.want || !strings.Contains(stderr, "FPT_CLUSTER_SECRET") {
			t.Errorf("%s: exit %d, stderr %q; want %d naming FPT_CLUSTER_SECRET", tt.name, code, stderr, tt.want)
		}
	}
}

// mainChildEnv carries mainInChild's environment to the child; not an
// FPT_ variable, of which Main warns when it does not know it.
const mainChildEnv = "LAUNCH_TEST_MAIN_ENV"

// mainInChild runs launch.Main on env in a child process, this test
// binary re-run, and returns its exit code and output. Main reads only
// env; it warns of unknown variables in the process's environment, which
// the child inherits. Main ends the process's ZeroMQ context
// (control.Shutdown), which czmq cannot start again safely while other
// threads make sockets: run in this process, it aborted later tests.
func mainInChild(t *testing.T, env map[string]string) (int, string) {
	t.Helper()
	b, err := json.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestMainChild$")
	cmd.Env = append(os.Environ(), mainChildEnv+"="+string(b))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	var ee *exec.ExitError
	if err := cmd.Run(); err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), out.String()
}

// TestMainChild is mainInChild's child; run otherwise, it does nothing.
func TestMainChild(t *testing.T) {
	b, ok := os.LookupEnv(mainChildEnv)
	if !ok {
		t.Skip("mainInChild's child")
	}
	var env map[string]string
	if err := json.Unmarshal([]byte(b), &env); err != nil {
		t.Fatal(err)
	}
	os.Exit(launch.Main("fpt", func(k string) (string, bool) { v, ok := env[k]; return v, ok }, os.Stderr, nil))
}

// A panic on Main's goroutine is a bug: exit 3 and say so, never 2, the
// code of a configuration error. The panicking Main runs in a child
// process (this test binary, re-run), since Main ends the process's
// ZeroMQ context. In the cluster case, the panic is the training
// program's: the node fails first, so the server names the worker.
func TestMainPanicExitsThree(t *testing.T) {
	if where := os.Getenv("FPTTEST_PANIC"); where != "" {
		train := func(context.Context, *worker.Worker) error { panic("boom in train") }
		lookup := os.LookupEnv
		if where == "lookup" {
			lookup = func(string) (string, bool) { panic("boom in lookup") }
		}
		os.Exit(launch.Main("fpt", lookup, os.Stderr, train))
	}
	child := func(where string, env ...string) (int, string) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestMainPanicExitsThree$")
		cmd.Env = append(append(os.Environ(), "FPTTEST_PANIC="+where), env...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		return cmd.ProcessState.ExitCode(), out.String()
	}
	t.Run("lookup", func(t *testing.T) {
		code, out := child("lookup")
		if code != launch.ExitBug {
			t.Fatalf("exit %d, want %d:\n%s", code, launch.ExitBug, out)
		}
		if !strings.Contains(out, "fpt: internal error (a bug): panic: boom in lookup") || !strings.Contains(out, "goroutine") {
			t.Fatalf("output %q: want the panic, called a bug, with its stack", out)
		}
	})
	t.Run("train", func(t *testing.T) {
		port := freePort(t)
		sched, err := launch.Start(context.Background(), nodeConfig(t, "scheduler", port, nil), launch.Deps{Log: quiet})
		if err != nil {
			t.Fatal(err)
		}
		defer sched.Finalize(context.Background())
		serverDone := make(chan error, 1)
		go func() {
			serverDone <- launch.Run(context.Background(), nodeConfig(t, "server", port, nil), launch.Deps{Log: quiet}, nil)
		}()
		code, out := child("train", "DMLC_ROLE=worker", "DMLC_PS_ROOT_URI=127.0.0.1", "DMLC_PS_ROOT_PORT="+strconv.Itoa(port),
			"DMLC_NUM_SERVER=1", "DMLC_NUM_WORKER=1")
		if code != launch.ExitBug {
			t.Fatalf("exit %d, want %d:\n%s", code, launch.ExitBug, out)
		}
		if !strings.Contains(out, "fpt: internal error (a bug): panic: boom in train") || !strings.Contains(out, "TestMainPanicExitsThree") {
			t.Fatalf("output %q: want the panic, called a bug, with the stack where it happened", out)
		}
		select {
		case err := <-serverDone:
			if err == nil || !strings.Contains(err.Error(), "worker0") || !strings.Contains(err.Error(), "panic: boom in train") {
				t.Errorf("server: %v, want the worker named, with its panic", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the server still runs 30 s after the worker panicked")
		}
	})
}

// A scheduler that cannot have its own address says so, naming the
// variable and the value: a port another process holds is a
// configuration error (exit 2) found at once; a name that does not
// resolve may only not exist yet (a Kubernetes pod's own headless-service
// name), so it is waited for until FPT_START_TIMEOUT, then fails the
// start (exit 1).
func TestSchedulerOwnAddress(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	busyPort := strconv.Itoa(busy.Addr().(*net.TCPAddr).Port)
	tests := []struct {
		name, uri, port, timeout string
		code                     int
		wants                    []string
	}{
		{"name does not resolve", "no-such-host.invalid", strconv.Itoa(freePort(t)), "1", launch.ExitFailed,
			[]string{"DMLC_PS_ROOT_URI", "no-such-host.invalid", "does not resolve after 1s"}},
		{"port in use", "127.0.0.1", busyPort, "30", launch.ExitUsage, []string{"DMLC_PS_ROOT_PORT", busyPort, "in use"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := map[string]string{"DMLC_ROLE": "scheduler", "DMLC_PS_ROOT_URI": tt.uri, "DMLC_PS_ROOT_PORT": tt.port,
				"DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "1", "FPT_START_TIMEOUT": tt.timeout, "FPT_INSECURE": "1"}
			began := time.Now()
			code, stderr := mainInChild(t, env)
			if code != tt.code {
				t.Errorf("exit %d, stderr %q; want %d", code, stderr, tt.code)
			}
			for _, w := range tt.wants {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr %q does not name %s", stderr, w)
				}
			}
			if d := time.Since(began); d > 20*time.Second {
				t.Errorf("took %s: the scheduler waited for the cluster before refusing", d)
			}
		})
	}
}
