package capi

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/internal/localcluster"
	"github.com/fptps/fpt/internal/metricstest"
)

// trainLibs runs iters iterations of one float32 tensor of size bytes on
// every worker (declare, init, then push, pull and wait for both), then
// passes a workers' barrier: every node is still up when it returns.
func trainLibs(c *libCluster, size, iters int) error {
	return c.each(func(_ int, l *Lib) error {
		if err := l.SetTensorsPerIteration(1); err != nil {
			return err
		}
		if err := l.Declare(1, uint64(size), int(frame.Float32), 0); err != nil {
			return err
		}
		one := func(b []byte) Tensors { return Tensors{Keys: []uint64{1}, Lens: []int{size}, Data: b} }
		if err := l.Init(one(make([]byte, size))); err != nil {
			return err
		}
		grads, sums := make([]byte, size), make([]byte, size)
		for range iters {
			push, err := l.Push(one(grads), 0, nil)
			if err != nil {
				return err
			}
			pull, err := l.Pull(one(sums), nil)
			if err != nil {
				return err
			}
			if err := l.Wait(push); err != nil {
				return err
			}
			if err := l.Wait(pull); err != nil {
				return err
			}
		}
		return l.Barrier()
	})
}

// A node the C library starts serves its metrics at FPT_METRICS_ADDR, as
// the fpt binaries' nodes do (they start the same way), with figures that
// match what was trained, until Finalize.
func TestLibMetrics(t *testing.T) {
	const size, iters = 40000, 3
	addrs := map[*Lib]string{}
	c := startLibsWith(t, 1, 2, func(_ string, vars map[string]string, l *Lib) {
		port, err := localcluster.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		addrs[l] = fmt.Sprintf("127.0.0.1:%d", port)
		vars["FPT_METRICS_ADDR"] = addrs[l]
		vars["FPT_LB"] = "off" // every tensor byte goes to the server
	})
	if err := trainLibs(c, size, iters); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	scrape := func(name string, l *Lib) metricstest.Families {
		t.Helper()
		mfs, err := metricstest.Scrape(ctx, addrs[l])
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return mfs
	}
	if mfs := scrape("scheduler", c.sched); mfs["process_cpu_seconds_total"] == nil {
		t.Error("the scheduler's scrape has no process metrics")
	}
	toServers := map[string]string{"role": "worker", "peer_role": "server"}
	var sentToServers float64
	for rank, l := range c.workers {
		mfs := scrape(fmt.Sprintf("worker %d", rank), l)
		// Worker 0 also pushes the init round; every worker pulls it.
		pushed := float64(size * iters)
		if rank == 0 {
			pushed += size
		}
		sent := value(t, mfs, "fpt_van_sent_bytes_total", toServers)
		frames := value(t, mfs, "fpt_van_sent_frames_total", toServers)
		if got := sent - frame.HeaderSize*frames; got != pushed {
			t.Errorf("worker %d: %v payload bytes sent to the server, it pushed %v", rank, got, pushed)
		}
		recv := value(t, mfs, "fpt_van_received_bytes_total", toServers)
		frames = value(t, mfs, "fpt_van_received_frames_total", toServers)
		if got := recv - frame.HeaderSize*frames; got != float64(size*(iters+1)) {
			t.Errorf("worker %d: %v payload bytes received from the server, it pulled %v", rank, got, size*(iters+1))
		}
		for _, name := range []string{"fpt_push_latency_seconds", "fpt_pull_latency_seconds"} {
			if n := value(t, mfs, name, nil); n != 1+iters {
				t.Errorf("worker %d: %v in %s, want %d (init and %d iterations)", rank, n, name, 1+iters, iters)
			}
		}
		sentToServers += sent
	}
	got := value(t, scrape("server", c.servers[0]), "fpt_van_received_bytes_total", map[string]string{"role": "server", "peer_role": "worker"})
	if got != sentToServers {
		t.Errorf("the server received %v bytes from workers, the workers sent %v", got, sentToServers)
	}
	for i, err := range c.finalize() {
		if err != nil {
			t.Errorf("node %d: Finalize: %v", i, err)
		}
	}
	for _, addr := range addrs {
		if _, err := metricstest.Scrape(ctx, addr); err == nil {
			t.Errorf("a node still serves metrics at %s after Finalize", addr)
		}
	}
}

// value is a series' value that must be in the scrape.
func value(t *testing.T, f metricstest.Families, name string, labels map[string]string) float64 {
	t.Helper()
	v, ok := f.Value(name, labels)
	if !ok {
		t.Fatalf("no %s%v in the scrape", name, labels)
	}
	return v
}

// A scheduler the C library starts writes its LB decisions to stdout, the
// stream the fpt binaries' scheduler writes them to, not among its logs.
func TestLibDecisionsOnStdout(t *testing.T) {
	var stdout, stderr localcluster.Buffer // the node's goroutines write them
	c := startLibsWith(t, 1, 2, func(role string, vars map[string]string, l *Lib) {
		// Iterations this short probe only with the lookahead fixed
		// (lb.Config.MinIteration).
		vars["FPT_LB_AHEAD"] = "0"
		if role == "scheduler" {
			vars["PS_VERBOSE"] = "1" // the decisions are logged too
			l.stdout, l.stderr = &stdout, &stderr
		}
	})
	// The LB decides to probe once the warm-up's two iterations are done.
	if err := trainLibs(c, 4000, 4); err != nil {
		t.Fatal(err)
	}
	for i, err := range c.finalize() {
		if err != nil {
			t.Errorf("node %d: Finalize: %v", i, err)
		}
	}
	lines := func(s string) (n int) {
		for _, line := range strings.Split(s, "\n") {
			if strings.HasPrefix(line, "lb decision v") {
				n++
			}
		}
		return n
	}
	if n := lines(stdout.String()); n == 0 {
		t.Errorf("no decision on the scheduler's stdout:\n%s", stdout.String())
	}
	if n := lines(stderr.String()); n != 0 {
		t.Errorf("%d decisions on the scheduler's stderr:\n%s", n, stderr.String())
	}
	if !strings.Contains(stderr.String(), `msg="lb decision"`) {
		t.Errorf("the scheduler's log (PS_VERBOSE=1) has no decision:\n%s", stderr.String())
	}
}

// Start's failures other than the configuration's are final: only
// Finalize is left, and it neither hangs nor fails again. A scheduler
// starts in the background, so its failure (a taken port) is Finalize's.
func TestLibStartFailures(t *testing.T) {
	taken, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	port := taken.Addr().(*net.TCPAddr).Port
	free, err := localcluster.FreePort() // no scheduler there
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name        string
		vars        map[string]string
		startCode   Code
		finalize    Code
		finalizeMsg string
	}{
		// A taken port is a configuration error, as the binary's exit 2.
		{"scheduler, port taken", env(port, 1, 1, "scheduler"), CodeOK, CodeConfig, "DMLC_PS_ROOT_PORT"},
		{"worker, no scheduler", env(free, 1, 1, "worker"), CodeCluster, CodeOK, ""},
		{"server, metrics address taken", env(port, 1, 1, "server"), CodeCluster, CodeOK, ""},
	}
	tests[1].vars["FPT_START_TIMEOUT"] = "0.5"
	tests[2].vars["FPT_METRICS_ADDR"] = taken.Addr().String()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var shutdowns atomic.Int32
			l := newLib(tt.vars, &shutdowns)
			err := l.Start()
			if CodeOf(err) != tt.startCode {
				t.Fatalf("Start: %v (code %d), want code %d", err, CodeOf(err), tt.startCode)
			}
			if err != nil {
				if again := l.Start(); CodeOf(again) != CodeState || !strings.Contains(again.Error(), "only fpt_finalize is left") {
					t.Errorf("Start after a failed Start: %v, want CodeState", again)
				}
				if _, rerr := l.Rank(); CodeOf(rerr) != CodeState {
					t.Errorf("Rank after a failed Start: %v, want CodeState", rerr)
				}
			}
			err = l.Finalize()
			if CodeOf(err) != tt.finalize || (err != nil && !strings.Contains(err.Error(), tt.finalizeMsg)) {
				t.Errorf("Finalize: %v (code %d), want code %d naming %q", err, CodeOf(err), tt.finalize, tt.finalizeMsg)
			}
			if n := shutdowns.Load(); n != 1 {
				t.Errorf("%d shutdowns, want 1", n)
			}
		})
	}
}

// Nodes of one process start concurrently (a test's cluster, a program
// starting a server beside its worker); the P to spare is still one.
func TestSpareProcConcurrent(t *testing.T) {
	was := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(was) })
	runtime.SetDefaultGOMAXPROCS()
	def := runtime.GOMAXPROCS(0)
	unset := func(string) (string, bool) { return "", false }
	for round := range 200 {
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() { spareProc(unset) })
		}
		wg.Wait()
		if got := runtime.GOMAXPROCS(0); got != def+1 {
			t.Fatalf("round %d: GOMAXPROCS %d after 4 concurrent starts, want %d", round, got, def+1)
		}
	}
}

// The library spares the runtime a P for the program's thread, which goes
// back to C holding one, unless the program's environment sets
// GOMAXPROCS, which it applies.
func TestLibSparesAProc(t *testing.T) {
	was := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(was) })
	runtime.SetDefaultGOMAXPROCS()
	def := runtime.GOMAXPROCS(0)
	for _, tc := range []struct {
		name, env string // env: GOMAXPROCS, "" for unset
		want      int
	}{
		{name: "default", want: def + 1},
		{name: "set", env: strconv.Itoa(def + 3), want: def + 3},
		{name: "set badly", env: "many", want: def},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runtime.SetDefaultGOMAXPROCS()
			c := startLibsWith(t, 1, 1, func(_ string, vars map[string]string, _ *Lib) {
				if tc.env != "" {
					vars["GOMAXPROCS"] = tc.env
				}
			})
			got := runtime.GOMAXPROCS(0)
			for i, err := range c.finalize() {
				if err != nil {
					t.Errorf("node %d: Finalize: %v", i, err)
				}
			}
			if got != tc.want {
				t.Fatalf("GOMAXPROCS %d after the nodes started, want %d (the default is %d)", got, tc.want, def)
			}
		})
	}
}
