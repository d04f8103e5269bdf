package tests

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fptps/fpt/internal/localcluster"
)

// The C library: scripts/build-lib.sh builds libfpt.so, installs it with
// fpt.h and fpt.pc under a prefix and builds the C++ client
// (kvstore_client) and the C bad-calls program against that install
// through pkg-config, as a user's build would. Built at most once per
// variant for the package: with cgo's default checks (GODEBUG=cgocheck=1),
// and with GOEXPERIMENT=cgocheck2, which checks every pointer the Go side
// writes.
var (
	libDefault   = sync.OnceValues(func() (string, error) { return buildLib("default") })
	libCgocheck2 = sync.OnceValues(func() (string, error) { return buildLib("cgocheck2", "GOEXPERIMENT=cgocheck2") })
)

// buildLib runs build-lib.sh with extra environment and returns the
// directory holding the programs.
func buildLib(name string, env ...string) (string, error) {
	for _, cc := range []string{"gcc", "g++", "pkg-config"} {
		if _, err := exec.LookPath(cc); err != nil {
			return "", fmt.Errorf("the C API tests need %s (scripts/setup.sh installs it): %w", cc, err)
		}
	}
	prefix := filepath.Join(bin.dir, "libfpt-"+name)
	// Niced: it may run beside tests (TestMain starts it early).
	cmd := exec.Command("nice", "-n", "10", "../scripts/build-lib.sh", "--prefix", prefix, "--bindir", filepath.Join(prefix, "bin"))
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build-lib.sh (%s): %w\n%s", name, err, out)
	}
	return filepath.Join(prefix, "bin"), nil
}

func libPrograms(t testing.TB, variant string) string {
	t.Helper()
	build := libDefault
	if variant == "cgocheck2" {
		build = libCgocheck2
	}
	dir, err := build()
	if err != nil {
		t.Fatal(err)
	}
	if variant == "cgocheck2" {
		// The experiment is recorded in the library's build information.
		out, err := exec.Command("go", "version", "-m", filepath.Join(dir, "..", "lib", "libfpt.so")).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "GOEXPERIMENT=cgocheck2") {
			t.Fatalf("libfpt.so was not built with cgocheck2: %v\n%s", err, out)
		}
	}
	return dir
}

// startProcs starts a cluster of any programs, with the tests' settings.
func startProcs(t testing.TB, s localcluster.Spec) *localcluster.Cluster {
	t.Helper()
	s.Env = append([]string{"PS_VERBOSE=1", "FPT_START_TIMEOUT=60"}, s.Env...)
	lc, err := localcluster.Start(s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lc.Kill)
	return lc
}

// The C++ client drives libfpt as MXNet's kvstore_dist does, as the
// workers of a real cluster next to Go servers and a Go scheduler (and, in
// one case, as every role), with cgo's default pointer checks (and
// GODEBUG=cgocheck=1 said explicitly): worker 0's init values win
// everywhere and every pulled sum is exact. TestCAPICgocheck2 runs it
// under GOEXPERIMENT=cgocheck2.
func TestCAPIKVStoreClient(t *testing.T) {
	tests := []struct {
		name   string
		env    []string
		allCpp bool // scheduler and servers run the C++ client too
	}{
		{"go-servers-cgocheck1", []string{"GODEBUG=cgocheck=1"}, false},
		{"every-role-in-cpp", nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { runKVStoreClient(t, libPrograms(t, "default"), tt.env, tt.allCpp) })
	}
}

// runKVStoreClient runs TestCAPIKVStoreClient's cluster with the programs
// in dir.
func runKVStoreClient(t *testing.T, dir string, env []string, allCpp bool) {
	// Six tensors from 4 KiB to about 2.9 MiB: the larger ones span
	// several 1 MiB partitions, none a whole number of them.
	client := []string{filepath.Join(dir, "kvstore_client"), "-iters", "4", "-tensors", "6", "-max-bytes", "3000000"}
	s := localcluster.Spec{Servers: 2, Workers: 2, Scheduler: []string{bin.fpt}, Server: []string{bin.fpt},
		// FPT_LB_AHEAD=0: the LB probes however short the iterations
		// (lb.Config.MinIteration), so that a decision is on stdout.
		Worker: client, Env: slices.Concat(env, []string{"FPT_LB_AHEAD=0"})}
	if allCpp {
		s.Scheduler, s.Server = client, client
	}
	c := &cluster{Cluster: startProcs(t, s), t: t}
	c.waitAll(2 * time.Minute)
	for _, w := range []string{"worker0", "worker1"} {
		mustContain(t, w+" stdout", c.proc(w).Stdout.String(),
			"every value is worker 0's", "iteration 4/4 verified", "PASS: 4 iterations x 6 tensors")
	}
	// fpt's scheduler and libfpt's start the same way: the LB's
	// decisions (a probe after the warm-up) are on stdout.
	mustContain(t, "scheduler stdout", c.proc("scheduler").Stdout.String(), "lb decision v1 ")
	if allCpp {
		mustContain(t, "scheduler stdout", c.proc("scheduler").Stdout.String(), "scheduler: done")
		mustContain(t, "server0 stdout", c.proc("server0").Stdout.String(), "server: done")
	}
}

// Every entry point called wrongly (before fpt_start, with NULL pointers,
// unknown keys, wrong sizes, out of order, after fpt_finalize) returns its
// status and a message, and the process neither crashes nor hangs
// (TestCAPICgocheck2 under GOEXPERIMENT=cgocheck2).
func TestCAPIBadCalls(t *testing.T) { runBadCalls(t, libPrograms(t, "default")) }

// runBadCalls runs fpt_bad_calls from dir as the worker of a cluster.
func runBadCalls(t *testing.T, dir string) {
	c := &cluster{Cluster: startProcs(t, localcluster.Spec{Servers: 1, Workers: 1,
		Scheduler: []string{bin.fpt}, Server: []string{bin.fpt}, Worker: []string{filepath.Join(dir, "fpt_bad_calls")}}), t: t}
	c.waitAll(time.Minute)
	out := c.proc("worker0").Stdout.String()
	mustContain(t, "fpt_bad_calls stdout", out, "BAD CALLS PASS")
	if n := strings.Count(out, "ok   line"); n < 60 {
		t.Errorf("only %d checks passed:\n%s", n, out)
	}
}

// The C library built with GOEXPERIMENT=cgocheck2, which checks every
// pointer the Go side writes: the C++ client beside Go servers, every
// entry point called wrongly, and a ps-lite program as every role, as
// their default-build tests run them. This test is parallel only so that
// it runs after the package's other tests: its library's build (TestMain
// starts it in the background) takes minutes on a small machine, and none
// of them waits for it.
func TestCAPICgocheck2(t *testing.T) {
	t.Parallel()
	dir := libPrograms(t, "cgocheck2")
	t.Run("kvstore-client", func(t *testing.T) { runKVStoreClient(t, dir, nil, false) })
	t.Run("bad-calls", func(t *testing.T) { runBadCalls(t, dir) })
	t.Run("pslite-kv-app", func(t *testing.T) { runPSLite(t, dir, psliteKVAppCgocheck2) })
}

// kill -9 of a server while C++ workers train: each worker's pending call
// returns FPT_ERR_CLUSTER naming the dead node, and the worker exits with
// status 1 (not a crash, not a hang) within the heartbeat timeout.
func TestCAPIClusterFailure(t *testing.T) {
	dir := libPrograms(t, "default")
	c := &cluster{Cluster: startProcs(t, localcluster.Spec{Servers: 2, Workers: 2,
		Scheduler: []string{bin.fpt}, Server: []string{bin.fpt},
		Worker: []string{filepath.Join(dir, "kvstore_client"), "-iters", "100000", "-max-bytes", "1048576"}}), t: t}
	addr, killed := c.killMidRun("server1")
	for _, name := range []string{"worker0", "worker1"} {
		mustContain(t, name+" stderr", c.awaitFailed(killed, name), "FPT_ERR_CLUSTER", addr)
	}
}

var goodputRe = regexp.MustCompile(`PASS: .* goodput ([0-9.]+) Gbit/s`)

// meanGoodput averages the workers' goodput figures.
func meanGoodput(tb testing.TB, c *localcluster.Cluster, workers int) float64 {
	tb.Helper()
	sum := 0.0
	for i := range workers {
		out := c.Proc(fmt.Sprintf("worker%d", i)).Stdout.String()
		m := goodputRe.FindStringSubmatch(out)
		if m == nil {
			tb.Fatalf("worker%d printed no goodput:\n%s", i, tail(out))
		}
		g, err := strconv.ParseFloat(m[1], 64)
		if err != nil {
			tb.Fatal(err)
		}
		sum += g
	}
	return sum / float64(workers)
}

// The C++ client's push+pull goodput against the Go trainer's, on the same
// cluster shape (a Go scheduler, 2 Go servers, 2 workers) and the same
// model (8 tensors, 4 KiB to 16 MiB, float32), one after the other:
//
//	go test -run XXX -bench CAPIGoodput -benchtime 1x ./tests/
func BenchmarkCAPIGoodput(b *testing.B) {
	dir := libPrograms(b, "default")
	model := []string{"-iters", "20", "-tensors", "8", "-min-bytes", "4096", "-max-bytes", "16777216", "-quiet"}
	run := func(worker []string) float64 {
		c := startProcs(b, localcluster.Spec{Servers: 2, Workers: 2,
			Scheduler: []string{bin.fpt}, Server: []string{bin.fpt}, Worker: worker,
			Env: []string{"PS_VERBOSE=0"}})
		if err := c.Wait(5 * time.Minute); err != nil {
			b.Fatal(err)
		}
		return meanGoodput(b, c, 2)
	}
	var goSum, cppSum float64
	for range b.N {
		goSum += run(append([]string{bin.app, "-classic", "0"}, model...))
		cppSum += run(append([]string{filepath.Join(dir, "kvstore_client")}, model...))
	}
	n := float64(b.N)
	b.ReportMetric(goSum/n, "go-Gbit/s")
	b.ReportMetric(cppSum/n, "cpp-Gbit/s")
	b.ReportMetric(cppSum/goSum, "cpp/go")
}

// lastLine is s's last non-empty line.
func lastLine(s string) string {
	s = strings.TrimSpace(s)
	return s[strings.LastIndexByte(s, '\n')+1:]
}
