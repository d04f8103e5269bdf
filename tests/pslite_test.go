package tests

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/internal/localcluster"
)

// ps-lite programs (clients/pslite), written against ps-lite's C++
// interface only (include/ps/, headers over fpt.h) and built by
// build-lib.sh through pkg-config, run as every role of a real cluster:
// the scheduler is the program too, as ps-lite's own tests run.
func TestPSLitePrograms(t *testing.T) {
	tests := []psliteCase{
		{name: "kv-app", prog: "pslite_kv_app", args: []string{"-keys", "100", "-repeat", "10"},
			servers: 2, workers: 2,
			worker: []string{"PASS: 100 keys pushed 10 times by 2 workers, pulled exactly", "PASS: PushPull and ZPull exact",
				"PASS: FPTPush/FPTPull: init round and sum exact", "worker: done"},
			server: []string{"server: done"}},
		// As in ps-lite, each worker customer counts as one of
		// DMLC_NUM_WORKER workers: two processes of two are four.
		{name: "multi-workers", prog: "pslite_multi_workers", args: []string{"-customers", "2", "-keys", "1000", "-repeat", "20"},
			servers: 2, workers: 2, env: []string{"DMLC_NUM_WORKER=4"},
			worker: []string{"customer 0: PASS", "customer 1: PASS", "from 2 worker processes", "worker: done"}, server: []string{"server: done"}},
		// The servers make their KVServer, then set its handle, well
		// after the workers' first pushes: those wait for the handle.
		{name: "multi-workers-late-server", prog: "pslite_multi_workers", args: []string{"-customers", "2", "-keys", "100", "-repeat", "5", "-server-delay", "300"},
			servers: 2, workers: 2, env: []string{"DMLC_NUM_WORKER=4"},
			worker: []string{"customer 0: PASS", "customer 1: PASS", "from 2 worker processes", "worker: done"}, server: []string{"server: done"}},
		{name: "multi-workers-one-process", prog: "pslite_multi_workers", args: []string{"-customers", "2", "-keys", "1000", "-repeat", "5"},
			servers: 2, workers: 1, env: []string{"DMLC_NUM_WORKER=2"},
			worker: []string{"worker 0 customer 0: PASS", "worker 0 customer 1: PASS", "from 1 worker processes", "worker: done"}, server: []string{"server: done"}},
		{name: "simple-app", prog: "pslite_simple_app", args: []string{"-n", "100"},
			servers: 2, workers: 3,
			worker: []string{"PASS: 100 requests to 2 nodes answered, 200 requests handled"},
			server: []string{"PASS: 100 requests to 3 nodes answered, 300 requests handled"}},
		{name: "scheduler-app", prog: "pslite_scheduler_app", args: []string{"-n", "50"},
			servers: 2, workers: 2,
			worker:    []string{"PASS: 50 requests to 5 nodes answered, 50 from each handled"},
			server:    []string{"PASS: 50 requests to 5 nodes answered, 50 from each handled"},
			scheduler: []string{"node 1: PASS: 50 requests to 5 nodes answered, 50 from each handled"}},
		{name: "benchmark", prog: "pslite_benchmark", args: []string{"-bytes", "4194304", "-keys", "16", "-iters", "5"},
			servers: 2, workers: 2,
			worker: []string{"PASS: 5 iterations of 4.0 MiB over 16 keys pushed and pulled, exact; goodput"}},
		{name: "benchmark-fpt", prog: "pslite_benchmark", args: []string{"-bytes", "4194304", "-keys", "16", "-iters", "5", "-mode", "fpt"},
			servers: 2, workers: 2,
			worker: []string{"PASS: FPTPush/FPTPull: 5 iterations of 4.0 MiB over 16 keys, exact; goodput"}},
		{name: "mxnet", prog: "pslite_mxnet_client", args: []string{"-iters", "5", "-bound", "1000"},
			servers: 2, workers: 2,
			worker: []string{"init: 7 keys pulled, every weight exact", "iteration 5/5: every weight exact",
				"PASS: 5 iterations x 7 keys, sync SGD on the servers, every weight exact"},
			server: []string{"server: done"}},
		{name: "mxnet-fpt", prog: "pslite_mxnet_client", args: []string{"-iters", "5", "-fpt", "1"},
			servers: 2, workers: 2,
			worker: []string{"init: 7 keys through FPTPush/FPTPull, worker 0's weights everywhere", "iteration 5/5: every sum exact",
				"PASS: 5 iterations x 7 keys, FPTPush/FPTPull, SGD on the workers, every value exact"},
			server: []string{"server: done"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { runPSLite(t, libPrograms(t, "default"), tt) })
	}
}

// psliteCase is one run of a ps-lite program as every role.
type psliteCase struct {
	name             string
	prog             string
	args             []string
	servers, workers int
	env              []string
	worker, server   []string // lines each worker / server prints
	scheduler        []string
}

// psliteKVAppCgocheck2 is TestCAPICgocheck2's ps-lite run.
var psliteKVAppCgocheck2 = psliteCase{name: "kv-app", prog: "pslite_kv_app", args: []string{"-keys", "20", "-repeat", "3"},
	servers: 1, workers: 2,
	worker: []string{"pulled exactly", "PASS: PushPull and ZPull exact", "init round and sum exact"}}

// runPSLite runs tt's program from dir as every role of a cluster.
func runPSLite(t *testing.T, dir string, tt psliteCase) {
	argv := append([]string{filepath.Join(dir, tt.prog)}, tt.args...)
	c := &cluster{Cluster: startProcs(t, localcluster.Spec{Servers: tt.servers, Workers: tt.workers,
		Scheduler: argv, Server: argv, Worker: argv, Env: tt.env}), t: t}
	c.waitAll(2 * time.Minute)
	for i := range tt.workers {
		name := fmt.Sprintf("worker%d", i)
		mustContain(t, name+" stdout", c.proc(name).Stdout.String(), tt.worker...)
	}
	for i := range tt.servers {
		name := fmt.Sprintf("server%d", i)
		mustContain(t, name+" stdout", c.proc(name).Stdout.String(), tt.server...)
	}
	mustContain(t, "scheduler stdout", c.proc("scheduler").Stdout.String(), tt.scheduler...)
	if tt.prog == "pslite_benchmark" {
		// A figure for the log only: timing is not asserted.
		t.Logf("mean goodput %.3f Gbit/s", meanGoodput(t, c.Cluster, tt.workers))
	}
}

// A server that makes its KVServer and never sets its handle: libfpt holds
// the workers' pushes for it, then fails the node after FPT_START_TIMEOUT
// naming the customer and the handle, and every process ends with status 1
// instead of waiting for ever.
func TestPSLiteServerWithoutHandle(t *testing.T) {
	argv := []string{filepath.Join(libPrograms(t, "default"), "pslite_multi_workers"),
		"-customers", "2", "-keys", "10", "-repeat", "2", "-no-handle", "1"}
	c := &cluster{Cluster: startProcs(t, localcluster.Spec{Servers: 1, Workers: 1,
		Scheduler: argv, Server: argv, Worker: argv, Env: []string{"DMLC_NUM_WORKER=2", "FPT_START_TIMEOUT=5"}}), t: t}
	for _, name := range []string{"server0", "worker0"} {
		p := c.proc(name)
		if !p.Wait(time.Minute) {
			c.dump()
			t.Fatalf("%s still running a minute in", name)
		}
		if p.ExitCode() != 1 {
			c.dump()
			t.Fatalf("%s exited %d, want 1", name, p.ExitCode())
		}
	}
	mustContain(t, "server0 stderr", c.proc("server0").Stderr.String(),
		"waited 5s for that customer to be registered", "a ps-lite KVServer registers at set_request_handle")
}

// kill -9 of a server while the MXNet-shaped workers train: libfpt calls
// every customer's handler with FPT_MSG_FAILED, the waiting KVWorker::Wait
// (or the handler) ends the program with a check failure naming the
// reason, status 1, within the heartbeat timeout: never a hang. A worker
// whose next request goes to the dead server may end on that send's
// FPT_ERR_CLUSTER first, which is as clear.
func TestPSLiteClusterFailure(t *testing.T) {
	dir := libPrograms(t, "default")
	argv := []string{filepath.Join(dir, "pslite_mxnet_client"), "-iters", "100000"}
	c := &cluster{Cluster: startProcs(t, localcluster.Spec{Servers: 2, Workers: 2,
		Scheduler: argv, Server: argv, Worker: argv}), t: t}
	addr, killed := c.killMidRun("server1")
	for _, name := range []string{"worker0", "worker1"} {
		stderr := c.awaitFailed(killed, name)
		if !strings.Contains(stderr, "the cluster failed") && !strings.Contains(stderr, "FPT_ERR_CLUSTER") {
			t.Errorf("%s stderr names no cluster failure:\n%s", name, stderr)
		}
		if !strings.Contains(stderr, addr) && !strings.Contains(stderr, "server1") && !strings.Contains(stderr, "node 10") {
			t.Logf("%s's reason does not name the dead server (%s): %s", name, addr, lastLine(stderr))
		}
	}
}

// include/ps/ on its own: selftest.cc against a stand-in for libfpt's
// customer calls (fake_fpt.cc, one process holding a server and a worker
// customer), built as C++11 with every warning an error, and under
// ThreadSanitizer; then a cluster failure under a waiting pull. Needs g++
// only, not the library.
func TestPSLiteHeadersSelftest(t *testing.T) {
	if _, err := exec.LookPath("g++"); err != nil {
		t.Skip("g++ not found")
	}
	for _, variant := range []struct{ name, flags string }{{"plain", "-O2"}, {"tsan", "-O1 -fsanitize=thread"}} {
		t.Run(variant.name, func(t *testing.T) {
			t.Parallel() // two compilations side by side
			exe := filepath.Join(t.TempDir(), "selftest")
			args := append([]string{"-std=c++11", "-Wall", "-Wextra", "-Werror", "-pthread", "-g"}, strings.Fields(variant.flags)...)
			args = append(args, "-I../include", "-o", exe,
				"../clients/pslite/selftest/selftest.cc", "../clients/pslite/selftest/fake_fpt.cc")
			if out, err := exec.Command("g++", args...).CombinedOutput(); err != nil {
				if variant.name == "tsan" && strings.Contains(string(out), "tsan") {
					t.Skipf("no ThreadSanitizer: %s", out)
				}
				t.Fatalf("g++: %v\n%s", err, out)
			}
			for _, run := range []struct{ arg, pass string }{
				{"", "selftest: PASS"},
				// Several customers of one process: one node barrier per
				// round of Barriers, one fpt_finalize after every Finalize.
				{"customers", "selftest: customers: PASS"},
				// Requests that come before their app is ready are held
				// until it is (a KVServer's set_request_handle).
				{"late", "selftest: late: PASS"},
			} {
				var args []string
				if run.arg != "" {
					args = []string{run.arg}
				}
				out, err := exec.Command(exe, args...).CombinedOutput()
				if err != nil {
					t.Fatalf("selftest %s: %v\n%s", run.arg, err, out)
				}
				mustContain(t, "selftest "+run.arg+" output", string(out), run.pass)
				if strings.Contains(string(out), "WARNING: ThreadSanitizer") {
					t.Errorf("selftest %s: ThreadSanitizer reports:\n%s", run.arg, out)
				}
			}
			// Wrong calls end the program with status 1 and a message
			// naming the mistake, never a crash or a hang.
			if variant.name == "plain" {
				for _, bad := range []struct{ name, want string }{
					{"before-start", "KVWorker::ZPush before ps::Start"},
					{"lens-sum", "lens add up to 2 values, vals has 3"},
					{"lens-count", "lens and keys differ in size"},
					{"keys-unsorted", "keys must be unique and ascending"},
					{"pushpull-outs", "outs has another size than vals"},
					{"customer-twice", "customer (0, 1) already exists"},
					{"finalize-unknown", "ps::Finalize(7) of a customer that did not call ps::Start"},
					{"after-finalize", "KVWorker::ZPush after ps::Finalize"},
					{"fptpull-undeclared", "key 42 was never pushed with FPTPush or declared with FPTDeclare"},
					{"fptpush-redeclared", "key 3 was declared as 16 bytes, this call gives 12"},
				} {
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					out, err := exec.CommandContext(ctx, exe, "bad", bad.name).CombinedOutput()
					cancel()
					var exit *exec.ExitError
					if !errors.As(err, &exit) || exit.ExitCode() != 1 {
						t.Errorf("bad call %s: %v, want exit status 1\n%s", bad.name, err, out)
						continue
					}
					mustContain(t, "bad call "+bad.name, string(out), "Check failed", bad.want)
				}
			}
			// The cluster fails under a waiting pull: the program ends
			// with status 1 and the reason, instead of waiting for ever.
			fail := exec.Command(exe, "fail")
			out, err := fail.CombinedOutput()
			if fail.ProcessState == nil || fail.ProcessState.ExitCode() != 1 {
				t.Fatalf("selftest fail: %v, want exit status 1\n%s", err, out)
			}
			mustContain(t, "selftest fail output", string(out), "the cluster failed: node 10 died (fake)")
			if strings.Contains(string(out), "Wait returned") {
				t.Errorf("Wait returned after the failure:\n%s", out)
			}
		})
	}
}

// A ps-lite program's goodput on fpt, through the classic path (ZPush and
// ZPull to C++ KVServers) and through FPTPush/FPTPull, against the Go
// trainer's FPTPush/FPTPull on the same cluster shape (2 servers, 2
// workers) and the same model (8 keys of 8 MiB, float32), one after the
// other in one run:
//
//	go test -run XXX -bench PSLiteGoodput -benchtime 1x ./tests/
func BenchmarkPSLiteGoodput(b *testing.B) {
	dir := libPrograms(b, "default")
	const keys, keyBytes, iters = 8, 8 << 20, "20"
	cpp := func(mode string) []string {
		return []string{filepath.Join(dir, "pslite_benchmark"), "-bytes", strconv.Itoa(keys * keyBytes),
			"-keys", strconv.Itoa(keys), "-iters", iters, "-mode", mode}
	}
	run := func(roles, worker []string) float64 {
		c := startProcs(b, localcluster.Spec{Servers: 2, Workers: 2,
			Scheduler: roles, Server: roles, Worker: worker, Env: []string{"PS_VERBOSE=0"}})
		if err := c.Wait(5 * time.Minute); err != nil {
			b.Fatal(err)
		}
		return meanGoodput(b, c, 2)
	}
	var goSum, classicSum, fptSum float64
	for range b.N {
		goSum += run([]string{bin.fpt}, []string{bin.app, "-classic", "0", "-quiet", "-iters", iters,
			"-tensors", strconv.Itoa(keys), "-min-bytes", strconv.Itoa(keyBytes), "-max-bytes", strconv.Itoa(keyBytes)})
		classicSum += run(cpp("classic"), cpp("classic"))
		fptSum += run(cpp("fpt"), cpp("fpt"))
	}
	n := float64(b.N)
	b.ReportMetric(goSum/n, "go-Gbit/s")
	b.ReportMetric(classicSum/n, "cpp-classic-Gbit/s")
	b.ReportMetric(fptSum/n, "cpp-fpt-Gbit/s")
	b.ReportMetric(classicSum/goSum, "classic/go")
	b.ReportMetric(fptSum/goSum, "fpt/go")
}

// kill -9 of the scheduler while every server and worker waits in a
// barrier it cannot pass (final_barrier.cc: the servers and worker 0 in
// Finalize(0, true)'s barrier or, with Finalize(0, false), in libfpt's
// final barrier; worker 1 in a barrier of the workers): each exits with
// status 1 within PS_HEARTBEAT_TIMEOUT and a second, naming the
// scheduler.
func TestPSLiteSchedulerDiesInFinalBarrier(t *testing.T) {
	for _, barrier := range []string{"1", "0"} {
		t.Run("barrier="+barrier, func(t *testing.T) { schedulerDiesInFinalBarrier(t, barrier) })
	}
}

func schedulerDiesInFinalBarrier(t *testing.T, barrier string) {
	const timeout = 3 * time.Second
	dir := libPrograms(t, "default")
	argv := []string{filepath.Join(dir, "pslite_final_barrier"), "-barrier", barrier}
	c := &cluster{Cluster: startProcs(t, localcluster.Spec{Servers: 2, Workers: 2,
		Scheduler: argv, Server: argv, Worker: argv,
		Env: []string{"PS_HEARTBEAT_INTERVAL=0.5", "PS_HEARTBEAT_TIMEOUT=" + strconv.Itoa(int(timeout/time.Second))}}), t: t}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, name := range []string{"server0", "server1", "worker0", "worker1"} {
		if _, err := waitOutput(ctx, c.proc(name), regexp.MustCompile(`waiting in`)); err != nil {
			c.dump()
			t.Fatal(err)
		}
	}
	// Let every node send its barrier and see it answered by nothing.
	time.Sleep(300 * time.Millisecond)
	killed := time.Now()
	if err := c.proc("scheduler").Kill(); err != nil {
		t.Fatal(err)
	}
	t.Logf("scheduler killed at %s", killed.Format("15:04:05.000"))
	for _, name := range []string{"server0", "server1", "worker0", "worker1"} {
		p := c.proc(name)
		if !p.Wait(timeout + 2*time.Second) {
			c.dump()
			t.Fatalf("%s still running %s after the scheduler was killed", name, time.Since(killed).Round(time.Millisecond))
		}
		took := p.ExitedAt().Sub(killed)
		t.Logf("%s exited %d after %s", name, p.ExitCode(), took.Round(time.Millisecond))
		if took > timeout+time.Second {
			t.Errorf("%s exited %s after the kill, later than PS_HEARTBEAT_TIMEOUT (%s) and a second:\n%s", name, took.Round(time.Millisecond), timeout, tail(p.Stderr.String()))
		}
		if p.ExitCode() != 1 {
			t.Errorf("%s exited %d, want 1", name, p.ExitCode())
		}
		mustContain(t, name+" stderr", p.Stderr.String(), "scheduler")
	}
}
