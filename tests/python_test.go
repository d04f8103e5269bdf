package tests

import (
	"archive/zip"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fptps/fpt/internal/localcluster"
	"golang.org/x/sys/unix"
)

// Python and PyTorch over libfpt: the bindings (python/fpt), the launcher
// (fptrun) and the example's data-parallel training, with the real
// interpreter and PyTorch a user has (Debian's python3-torch,
// scripts/setup.sh installs it).

// pyEnv is what the Python programs run with: the interpreter fptrun
// picks (FPT_PYTHON, else the first python3 on PATH that imports torch,
// then /usr/bin/python3) and the environment that finds the package, the
// library and bin/fpt.
type pyEnv struct {
	python string
	env    []string
}

var findPython = sync.OnceValues(func() (string, error) {
	launcher := "python3"
	if p := os.Getenv("FPT_PYTHON"); p != "" {
		launcher = p
	} else if _, err := exec.LookPath(launcher); err != nil {
		launcher = "/usr/bin/python3"
	}
	cmd := exec.Command(launcher, "../python/fpt/run.py", "--print-python")
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return "", fmt.Errorf("no Python interpreter with torch: %s", strings.TrimSpace(string(ee.Stderr)))
		}
		return "", fmt.Errorf("no Python interpreter (%s): %w", launcher, err)
	}
	return strings.TrimSpace(string(out)), nil
})

// needPython skips the test when no interpreter imports torch, except in
// CI (CI=true), where that is a broken setup and fails.
func needPython(t *testing.T) pyEnv {
	t.Helper()
	py, err := findPython()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%v (scripts/setup.sh installs python3-torch; CI=true, so this fails rather than skips)", err)
		}
		t.Skipf("%v: install python3-torch (scripts/setup.sh) or set FPT_PYTHON", err)
	}
	dir := libPrograms(t, "default")
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return pyEnv{python: py, env: []string{
		"FPT_PYTHON=" + py,
		"FPT_LIB=" + filepath.Join(dir, "..", "lib", "libfpt.so"),
		"FPT_BIN=" + bin.fpt,
		"PYTHONPATH=" + filepath.Join(repo, "python"),
		"PYTHONDONTWRITEBYTECODE=1",
	}}
}

const pyChecks = "../python/tests/fpt_checks.py"

// startPyChecks starts a cluster of fpt's scheduler and servers with two
// workers running fpt_checks.py in mode.
func startPyChecks(t *testing.T, py pyEnv, servers int, mode string) *cluster {
	t.Helper()
	return &cluster{Cluster: startProcs(t, localcluster.Spec{Servers: servers, Workers: 2,
		Scheduler: []string{bin.fpt}, Server: []string{bin.fpt},
		Worker: []string{py.python, pyChecks, mode}, Env: py.env}), t: t}
}

// Every binding's error path, round trips of NumPy arrays, PyTorch tensors
// (float32, float64, float16) and raw bytes (push and pull, and push_pull), buffers kept alive while a
// request uses them, and nothing left after finalize: fpt_checks.py
// asserts each and prints what it checked.
func TestPythonBindings(t *testing.T) {
	py := needPython(t)
	c := startPyChecks(t, py, 1, "basic")
	c.waitAll(3 * time.Minute)
	for _, w := range []string{"worker0", "worker1"} {
		out := c.proc(w).Stdout.String()
		mustContain(t, w+" stdout", out, "BINDINGS PASS",
			"push of an undeclared key raises UnknownKeyError", "push of the wrong size raises SizeError",
			"push after finalize raises StateError", "mid-push was sent intact",
			"joined before start raises StateError", "params source: numpy bytes copied",
			"params source: an exception is a non-zero status", "push_pull in place",
			"numpy float32 push_pull into another buffer", "push_pull of two keys end to end",
			"push_pull into an output of the wrong size raises SizeError",
			"push, pull and push_pull pass the library no callback")
		if n := strings.Count(out, "ok   "); n < 35 {
			t.Errorf("%s: only %d checks passed:\n%s", w, n, out)
		}
	}
}

var optParamsRe = regexp.MustCompile(`optimizer params ([0-9a-f]+)`)

// fpt.torch's gradient buckets (one, one per gradient, several; gradients
// in place or set to None between steps) train the same parameters bit
// for bit, on both workers; the parameters source fpt.torch registers for
// a joining worker gives the model's current parameters and broadcast
// optimizer state, and refuses once the optimizer holds state made while
// training that no broadcast covers.
func TestPythonOptimizerBuckets(t *testing.T) {
	py := needPython(t)
	c := startPyChecks(t, py, 1, "optimizer")
	c.waitAll(3 * time.Minute)
	var hashes []string
	for _, w := range []string{"worker0", "worker1"} {
		out := c.proc(w).Stdout.String()
		mustContain(t, w+" stdout", out, "OPTIMIZER PASS", "broadcast_parameters from rank 1 raises ValueError",
			"the registered source copies the parameter's bytes (after 5 steps, the momentum buffers broadcast)",
			"steps numbered from start_iteration()", "the registered source refuses")
		if m := optParamsRe.FindStringSubmatch(out); m != nil {
			hashes = append(hashes, m[1])
		}
	}
	if len(hashes) != 2 || hashes[0] != hashes[1] {
		t.Errorf("the workers' parameters hash %v, want two equal", hashes)
	}
}

var (
	joinParamsRe = regexp.MustCompile(`join params ([0-9a-f]+)`)
	joinedAtRe   = regexp.MustCompile(`rank 2 joined at iteration ([0-9]+)`)
)

// startPyJoin starts fpt_checks.py in mode on two workers, and a third
// once the first has finished step 3.
func startPyJoin(t *testing.T, py pyEnv, mode string, env ...string) *cluster {
	t.Helper()
	c := &cluster{Cluster: startProcs(t, localcluster.Spec{Servers: 1, Workers: 2,
		Scheduler: []string{bin.fpt}, Server: []string{bin.fpt},
		Worker: []string{py.python, pyChecks, mode}, Env: append(slices.Clone(py.env), env...)}), t: t}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := waitOutput(ctx, c.proc("worker0"), regexp.MustCompile(`step 3 over`)); err != nil {
		c.dump()
		t.Fatal(err)
	}
	if _, err := c.Add("worker"); err != nil {
		t.Fatal(err)
	}
	return c
}

// A third Python worker started while two train with fpt.torch joins the
// job with the same script: fpt.torch hands it the model (every worker
// starts from its own random weights, so only the handover makes them
// equal), it numbers its steps from the iteration it joined at, and all
// three end with the same parameters bit for bit. Under
// FPT_ON_WORKER_LOSS=continue too, where iterations complete only with
// every sum in: fpt.torch's broadcast keys, initialised only, must not
// hold them back (SetTensorsPerIteration), or the first step hangs.
func TestPythonJoin(t *testing.T) {
	py := needPython(t)
	for _, policy := range []string{"fail", "continue"} {
		t.Run(policy, func(t *testing.T) { pythonJoin(t, py, policy) })
	}
}

func pythonJoin(t *testing.T, py pyEnv, policy string) {
	c := startPyJoin(t, py, "join", "FPT_ON_WORKER_LOSS="+policy)
	c.waitAll(3 * time.Minute)
	var hashes []string
	for _, w := range []string{"worker0", "worker1", "worker2"} {
		out := c.proc(w).Stdout.String()
		mustContain(t, w+" stdout", out, "JOIN PASS", "step 60 over 3 workers")
		if m := joinParamsRe.FindStringSubmatch(out); m != nil {
			hashes = append(hashes, m[1])
		}
	}
	joiner := ""
	for _, w := range []string{"worker0", "worker1", "worker2"} {
		if m := joinedAtRe.FindStringSubmatch(c.proc(w).Stdout.String()); m != nil {
			joiner = w
			at, _ := strconv.Atoi(m[1])
			if at <= 3 || at > 60 {
				t.Errorf("the joiner started at iteration %d, want one in 4..60", at)
			}
			t.Logf("%s joined as rank 2 at iteration %d; parameters hash %v", w, at, hashes)
		}
	}
	if joiner == "" {
		t.Error("no worker said it joined as rank 2")
	}
	if len(hashes) != 3 || hashes[0] != hashes[1] || hashes[0] != hashes[2] {
		t.Errorf("the workers' parameters hash %v, want three equal", hashes)
	}
}

// kill -9 of a server while Python workers push and pull: each worker's
// wait raises ClusterError naming the dead node, and the worker exits 1
// within the heartbeat timeout rather than hanging.
func TestPythonBindingsDeadNode(t *testing.T) {
	py := needPython(t)
	c := startPyChecks(t, py, 2, "dead")
	addr, killed := c.killMidRun("server1")
	for _, name := range []string{"worker0", "worker1"} {
		mustContain(t, name+" stderr", c.awaitFailed(killed, name), "ClusterError raised: FPT_ERR_CLUSTER", addr)
	}
}

// startFptrun runs scripts/fptrun with the Python environment and env.
func startFptrun(t *testing.T, py pyEnv, env []string, args ...string) *netemRun {
	t.Helper()
	r := &netemRun{cmd: exec.Command("../scripts/fptrun", args...)}
	r.cmd.Env = append(append(os.Environ(), py.env...), env...)
	r.cmd.Stdout, r.cmd.Stderr = &r.out, &r.out
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.cmd.Process.Kill() })
	return r
}

var fptrunPortRe = regexp.MustCompile(`scheduler at 127\.0\.0\.1:([0-9]+)`)

// fptrunPort is the scheduler's port fptrun announced.
func fptrunPort(t *testing.T, r *netemRun) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for ctx.Err() == nil {
		if m := fptrunPortRe.FindStringSubmatch(r.out.String()); m != nil {
			p, _ := strconv.Atoi(m[1])
			return p
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("fptrun never named the scheduler's port:\n%s", tail(r.out.String()))
	return 0
}

func fptrunOutput(t *testing.T, r *netemRun, re *regexp.Regexp) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		if re.MatchString(r.out.String()) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("fptrun's output never matched %q:\n%s", re, tail(r.out.String()))
}

var (
	stepRe  = regexp.MustCompile(`\[worker([01])\] step ([0-9]+) loss ([0-9.]+) params ([0-9a-f]+)`)
	lbVerRe = regexp.MustCompile(`\[scheduler\] lb decision v([0-9]+) `)
)

// Data-parallel training is exact. Two workers and two servers train the
// example's network for 30 steps, each on its half of every batch of a
// fixed synthetic dataset, while the LB re-decides every 3 iterations
// (small partitions, so tensors span several aggregators): after every
// step both workers hold the same parameters bit for bit, and after the
// last they equal, within float32 rounding, one process that trained on
// whole batches. The loss goes down. (PS_VERBOSE=1: the scheduler writes
// every decision, probes too, which the test counts.)
func TestPythonTrainingMatchesSingleProcess(t *testing.T) {
	py := needPython(t)
	dir := t.TempDir()
	const steps = 30
	train := []string{"../examples/pytorch/train.py", "--samples", "1024", "--batch", "128", "--epochs", "4",
		"--steps", strconv.Itoa(steps), "--hash"}
	// FPT_LB_AHEAD=0: decisions take effect 2 iterations after they are
	// made, whatever the pace; fast steps would otherwise be granted up
	// to 64 iterations ahead, past the run's end.
	// FPT_LOCAL_AGGREGATION=off: the pushes go to the servers, so the LB
	// has links to measure and splits to make.
	r := startFptrun(t, py, []string{"FPT_LB=on", "FPT_LB_PROBE_EVERY=3", "FPT_LB_AHEAD=0", "FPT_PARTITION_BYTES=4096", "PS_VERBOSE=1",
		"FPT_LOCAL_AGGREGATION=off"},
		append(append([]string{"-np", "2", "--servers", "2", "python"}, train...), "--save", filepath.Join(dir, "w{rank}.bin"))...)
	if code := r.wait(t, 4*time.Minute); code != 0 {
		t.Fatalf("fptrun exited %d:\n%s", code, tail(r.out.String()))
	}
	out := r.out.String()
	mustContain(t, "fptrun output", out, "all 5 processes finished cleanly", "[worker0] epoch 1: loss", "[worker1] epoch 1: loss")

	ref := exec.Command(py.python, append(train, "--single", "--save", filepath.Join(dir, "ref.bin"))...)
	if refOut, err := ref.CombinedOutput(); err != nil {
		t.Fatalf("the single-process run: %v\n%s", err, refOut)
	}

	// Per step: both workers' parameters hash the same.
	hashes := map[string]map[int]string{}
	var losses []float64
	for _, m := range stepRe.FindAllStringSubmatch(out, -1) {
		step, _ := strconv.Atoi(m[2])
		if hashes[m[1]] == nil {
			hashes[m[1]] = map[int]string{}
		}
		hashes[m[1]][step] = m[4]
		if m[1] == "0" {
			loss, _ := strconv.ParseFloat(m[3], 64)
			losses = append(losses, loss)
		}
	}
	for s := 1; s <= steps; s++ {
		h0, h1 := hashes["0"][s], hashes["1"][s]
		if h0 == "" || h0 != h1 {
			t.Errorf("step %d: worker parameters hash %q and %q, want equal", s, h0, h1)
		}
	}
	if len(losses) != steps || mean(losses[:3]) <= 2*mean(losses[steps-3:]) {
		t.Errorf("the loss did not go down (first steps vs last, want at least halved): %v", losses)
	}
	if v := distinct(lbVerRe.FindAllStringSubmatch(out, -1)); v < 3 {
		t.Errorf("the scheduler made %d LB decisions during the run, want at least 3:\n%s", v, tail(out))
	}

	w0, w1, single := readFloats(t, filepath.Join(dir, "w0.bin")), readFloats(t, filepath.Join(dir, "w1.bin")),
		readFloats(t, filepath.Join(dir, "ref.bin"))
	if len(w0) == 0 || len(w0) != len(w1) || len(w0) != len(single) {
		t.Fatalf("parameter counts %d, %d, single process %d", len(w0), len(w1), len(single))
	}
	scale, worst := 0.0, 0.0
	for i := range w0 {
		if math.Float32bits(w0[i]) != math.Float32bits(w1[i]) {
			t.Fatalf("parameter %d: worker0 %v, worker1 %v: the workers differ", i, w0[i], w1[i])
		}
		scale = max(scale, math.Abs(float64(single[i])))
		worst = max(worst, math.Abs(float64(w0[i])-float64(single[i])))
	}
	t.Logf("%d parameters; largest difference from the single process %.3g (largest parameter %.3g); %d LB decisions",
		len(w0), worst, scale, distinct(lbVerRe.FindAllStringSubmatch(out, -1)))
	if worst > 1e-5*scale {
		t.Errorf("after %d steps the workers' parameters differ from the single process's by up to %.3g, more than 1e-5 of the largest (%.3g)",
			steps, worst, scale)
	}
}

// examples/pytorch/exchange.py runs fpt, gloo and the floor (plain TCP
// sockets to worker 0) on the same exchange and prints one JSON row per
// size, every value checked by the workers (a wrong sum exits non-zero).
// fpt's workers sum on their host, as fptrun runs a job on one machine;
// --network, which only sets fpt's FPT_LOCAL_AGGREGATION=off, is not run:
// each run costs a minute here.
func TestPythonExchangeAgainstGloo(t *testing.T) {
	py := needPython(t)
	cmd := exec.Command(py.python, "../examples/pytorch/exchange.py", "--sizes", "4K,100K", "--workers", "2",
		"--steps", "5", "--warmup", "1", "--json")
	cmd.Env = append(os.Environ(), py.env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("exchange.py: %v\n%s", err, tail(string(out)))
	}
	var rows []map[string]any
	for line := range strings.Lines(string(out)) {
		var row map[string]any
		if json.Unmarshal([]byte(line), &row) == nil {
			rows = append(rows, row)
		}
	}
	if len(rows) != 2 || rows[0]["bytes"] != 4096.0 || rows[1]["bytes"] != 102400.0 {
		t.Fatalf("exchange.py printed %d rows %v, want 4096 and 102400 bytes:\n%s", len(rows), rows, out)
	}
	for _, r := range rows {
		for _, f := range []string{"workers", "fpt_median_ms", "fpt_p90_ms", "gloo_median_ms", "gloo_p90_ms", "fpt_over_gloo",
			"tcp_median_ms", "tcp_p90_ms", "fpt_over_tcp"} {
			if v, _ := r[f].(float64); !(v > 0) {
				t.Errorf("row %v: %s is not positive", r, f)
			}
		}
		if r["local_aggregation"] != "auto" {
			t.Errorf("row %v: local_aggregation is not auto", r)
		}
	}
	t.Logf("%s", out)
}

// exchange.py --breakdown traces an fpt run and prints fpt trace
// breakdown of worker 0's steps: every timed step, each segment measured,
// the Python step spans joined to the worker's.
func TestPythonExchangeBreakdown(t *testing.T) {
	py := needPython(t)
	cmd := exec.Command(py.python, "../examples/pytorch/exchange.py", "--breakdown", "--sizes", "4K", "--workers", "2",
		"--steps", "5", "--warmup", "1", "--json")
	cmd.Env = append(os.Environ(), py.env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("exchange.py --breakdown: %v\n%s", err, tail(string(out)))
	}
	var row struct {
		Worker   int      `json:"worker"`
		Bytes    int      `json:"bytes"`
		Segments []string `json:"segments"`
		Median   []int64  `json:"median_us"`
		Steps    []struct {
			Iteration uint64 `json:"iteration"`
		} `json:"steps"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(string(out))), &row); err != nil {
		t.Fatalf("exchange.py --breakdown printed no JSON row: %v\n%s", err, out)
	}
	if row.Worker != 9 || row.Bytes != 4096 || len(row.Steps) != 5 || row.Steps[0].Iteration != 2 {
		t.Errorf("breakdown of worker %d, %d bytes, %d steps from iteration %v; want worker 9, 4096, 5 from 2:\n%s",
			row.Worker, row.Bytes, len(row.Steps), row.Steps, out)
	}
	for i, m := range row.Median {
		if m < 0 {
			t.Errorf("segment %q not measured", row.Segments[i])
		}
	}
	t.Logf("%s", out)
}

func mean(xs []float64) float64 {
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

func distinct(ms [][]string) int {
	seen := map[string]bool{}
	for _, m := range ms {
		seen[m[1]] = true
	}
	return len(seen)
}

func readFloats(t *testing.T, path string) []float32 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.NativeEndian.Uint32(b[4*i:]))
	}
	return out
}

// fptrun blames a failure on the worker whose program failed, even when
// the scheduler saw the worker's connections close and exited first (the
// worker's process ends after its sockets close): fpt/run.py's choice,
// with stand-in processes.
func TestFptrunBlamesTheWorker(t *testing.T) {
	py := needPython(t)
	cmd := exec.Command(py.python, "../python/tests/run_checks.py", "culprit")
	cmd.Env = append(os.Environ(), py.env...)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "PASS") {
		t.Fatalf("run_checks.py culprit: %v\n%s", err, out)
	}
}

// fptrun --bind-cores deals its cores out to the workers (run_checks.py
// cores: the slices), and every thread of a worker, fpt's and the
// program's, keeps to its slice; without it each has every core.
func TestFptrunBindCores(t *testing.T) {
	py := needPython(t)
	cmd := exec.Command(py.python, "../python/tests/run_checks.py", "cores")
	cmd.Env = append(os.Environ(), py.env...)
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "PASS") {
		t.Fatalf("run_checks.py cores: %v\n%s", err, out)
	}
	// Under a cluster engine the engine binds: refused, clearly.
	engine := exec.Command("../scripts/fptrun", "--bind-cores", "python", "train.py")
	engine.Env = append(os.Environ(), "SLURM_PROCID=0")
	if out, err := engine.CombinedOutput(); engine.ProcessState.ExitCode() != 2 ||
		!strings.Contains(string(out), "--bind-cores under a cluster engine (SLURM_PROCID is set)") {
		t.Errorf("fptrun --bind-cores under srun: %v\n%s", err, out)
	}
	var own unix.CPUSet
	if err := unix.SchedGetaffinity(0, &own); err != nil {
		t.Fatal(err)
	}
	var cores []int
	for c := range 1024 {
		if own.IsSet(c) {
			cores = append(cores, c)
		}
	}
	all := cpuList(cores)
	// Two workers: the first half of the cores (the larger, if odd) and
	// the rest; one core: both on it.
	half := (len(cores) + 1) / 2
	bound := []string{cpuList(cores[:half]), cpuList(cores[half:])}
	if len(cores) == 1 {
		bound[1] = bound[0]
	}
	// Each worker prints the cpu lists of its threads, once fpt started
	// its own.
	script := `import os, fpt
fpt.start()
lists = {open("/proc/self/task/%s/status" % t).read().split("Cpus_allowed_list:")[1].split()[0]
         for t in os.listdir("/proc/self/task")}
print("threads %d cores %s" % (len(os.listdir("/proc/self/task")), ";".join(sorted(lists))), flush=True)
fpt.finalize()`
	re := regexp.MustCompile(`\[worker\d\] threads (\d+) cores (\S+)`)
	for _, bind := range []bool{false, true} {
		t.Run(fmt.Sprintf("bind=%v", bind), func(t *testing.T) {
			args := []string{"-np", "2", "--servers", "1", "python", "-c", script}
			if bind {
				args = append([]string{"--bind-cores"}, args...)
			}
			r := startFptrun(t, py, nil, args...)
			if code := r.wait(t, 2*time.Minute); code != 0 {
				t.Fatalf("fptrun exited %d:\n%s", code, tail(r.out.String()))
			}
			out := r.out.String()
			var got []string
			for _, m := range re.FindAllStringSubmatch(out, -1) {
				if n, _ := strconv.Atoi(m[1]); n < 3 {
					t.Errorf("a worker with %s threads: fpt's own are missing", m[1])
				}
				got = append(got, m[2])
			}
			slices.Sort(got)
			want := []string{all, all}
			if bind {
				want = slices.Clone(bound)
				mustContain(t, "fptrun output", out, "workers bound to cores "+bound[0]+" | "+bound[1])
			}
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Fatalf("the workers' threads' cores %q, want %q:\n%s", got, want, tail(out))
			}
		})
	}
}

// cpuList is cores, ascending, in the kernel's cpu-list form
// (Cpus_allowed_list: 0-3,8).
func cpuList(cores []int) string {
	var runs [][2]int
	for _, c := range cores {
		if n := len(runs); n > 0 && runs[n-1][1] == c-1 {
			runs[n-1][1] = c
		} else {
			runs = append(runs, [2]int{c, c})
		}
	}
	parts := make([]string, len(runs))
	for i, r := range runs {
		parts[i] = strconv.Itoa(r[0])
		if r[1] != r[0] {
			parts[i] += "-" + strconv.Itoa(r[1])
		}
	}
	return strings.Join(parts, ",")
}

// A worker that raises: fptrun names it, stops the rest and exits non-zero
// within the heartbeat timeout of the failure, leaving no process behind.
func TestFptrunWorkerRaises(t *testing.T) {
	py := needPython(t)
	r := startFptrun(t, py, []string{"PS_HEARTBEAT_TIMEOUT=10"}, "-np", "2", "--servers", "1", "python", pyChecks, "raise")
	port := fptrunPort(t, r)
	fptrunOutput(t, r, regexp.MustCompile(`raising at iteration`))
	raised := time.Now()
	code := r.wait(t, 2*time.Minute)
	took := time.Since(raised)
	out := r.out.String()
	if code == 0 {
		t.Fatalf("fptrun exited 0 after a worker raised:\n%s", tail(out))
	}
	mustContain(t, "fptrun output", out, "RuntimeError: a bug in the training script",
		"worker1 exited with status 1; stopping the others")
	if took > 10*time.Second {
		t.Errorf("fptrun exited %s after the worker raised, beyond the heartbeat timeout (10 s)", took)
	}
	if left := survivors(port); len(left) > 0 {
		t.Errorf("processes left behind: %v", left)
	}
}

// Ctrl-C: fptrun stops every process and exits non-zero; no process and no
// port are left.
func TestFptrunInterrupted(t *testing.T) {
	py := needPython(t)
	r := startFptrun(t, py, nil, "-np", "2", "--servers", "1", "python", pyChecks, "loop")
	port := fptrunPort(t, r)
	fptrunOutput(t, r, regexp.MustCompile(`\[worker[01]\] iteration 2/`))
	// The check below must be able to fail: it sees the running job.
	if running := survivors(port); len(running) < 4 {
		t.Errorf("found %d processes of the running job, want 4: %v", len(running), running)
	}
	if err := r.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if code := r.wait(t, 30*time.Second); code == 0 {
		t.Error("interrupted fptrun exited 0")
	}
	mustContain(t, "fptrun output", r.out.String(), "fptrun: interrupted")
	if left := survivors(port); len(left) > 0 {
		t.Errorf("processes left behind: %v", left)
	}
	for _, p := range []int{port, port + 1} {
		if l, err := net.Listen("tcp", fmt.Sprintf("0.0.0.0:%d", p)); err != nil {
			t.Errorf("port %d still taken: %v", p, err)
		} else {
			l.Close()
		}
	}
}

// A job fptrun starts whole on one machine sums on the host by default
// (FPT_LOCAL_AGGREGATION=auto); the variable, when set, is the user's.
func TestFptrunSumsOnTheHost(t *testing.T) {
	py := needPython(t)
	for _, tt := range []struct {
		name string
		env  []string
		want []string
	}{
		{"default", nil, []string{"FPT_LOCAL_AGGREGATION=auto", "sums_locally=true", `msg="local aggregation"`,
			"one host: every partition on its group's leader"}},
		{"off", []string{"FPT_LOCAL_AGGREGATION=off"}, []string{"FPT_LOCAL_AGGREGATION=off", "sums_locally=false"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// 60 steps of 4 KiB, every sum checked: long enough for the
			// LB's one-host split (a decision some iterations ahead).
			r := startFptrun(t, py, append([]string{"PS_VERBOSE=1", "FPT_LB_AHEAD=0"}, tt.env...), "-np", "2", "--servers", "1",
				"python", "../examples/pytorch/exchange.py", "--system", "fpt", "--workers", "2", "--bytes", "4096",
				"--steps", "60", "--warmup", "1")
			if code := r.wait(t, 2*time.Minute); code != 0 {
				t.Fatalf("fptrun exited %d:\n%s", code, tail(r.out.String()))
			}
			mustContain(t, "fptrun output", r.out.String(), tt.want...)
		})
	}
}

// --hosts prints each host's share as run_test.sh takes it: one root and
// secret for all, the scheduler on the first host, servers and workers
// dealt round robin.
func TestFptrunHosts(t *testing.T) {
	for _, tt := range []struct {
		flags []string
		want  []string
	}{
		{nil, []string{
			"h1: FPT_CLUSTER_SECRET=s3cret fptrun --root h1:9091 --scheduler -s 1 -w 2 -np 4 --servers 2 -- python train.py --epochs 1",
			"h2: FPT_CLUSTER_SECRET=s3cret fptrun --root h1:9091 -s 1 -w 1 -np 4 --servers 2 -- python train.py --epochs 1",
			"h3: FPT_CLUSTER_SECRET=s3cret fptrun --root h1:9091 -s 0 -w 1 -np 4 --servers 2 -- python train.py --epochs 1",
		}},
		// Each host binds its own workers.
		{[]string{"--bind-cores"}, []string{
			"h1: FPT_CLUSTER_SECRET=s3cret fptrun --root h1:9091 --scheduler -s 1 -w 2 -np 4 --servers 2 --bind-cores -- python train.py --epochs 1",
			"h2: FPT_CLUSTER_SECRET=s3cret fptrun --root h1:9091 -s 1 -w 1 -np 4 --servers 2 --bind-cores -- python train.py --epochs 1",
			"h3: FPT_CLUSTER_SECRET=s3cret fptrun --root h1:9091 -s 0 -w 1 -np 4 --servers 2 --bind-cores -- python train.py --epochs 1",
		}},
	} {
		args := append(append([]string{"--hosts", "h1,h2,h3", "-np", "4", "--servers", "2", "--secret", "s3cret"}, tt.flags...),
			"python", "train.py", "--epochs", "1")
		out, err := exec.Command("../scripts/fptrun", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("fptrun %v: %v\n%s", tt.flags, err, out)
		}
		if got := strings.Split(strings.TrimSpace(string(out)), "\n"); strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
			t.Errorf("fptrun --hosts %v printed\n%s\nwant\n%s", tt.flags, strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
		}
	}
}

// buildWheel returns the path of fpt's wheel, built with the backend in
// python/_build (standard library only, so offline), carrying bin/fpt and
// libfpt.so.
func buildWheel(t *testing.T) string {
	t.Helper()
	wheel, err := theWheel()
	if err != nil {
		t.Fatal(err)
	}
	return wheel
}

// theWheel is built once for the package, into the binaries' directory:
// the tests only read it.
var theWheel = sync.OnceValues(func() (string, error) {
	lib, err := libDefault()
	if err != nil {
		return "", err
	}
	python := "python3"
	if _, err := exec.LookPath(python); err != nil {
		python = "/usr/bin/python3"
	}
	build := exec.Command(python, "-c", "import sys, backend; print(backend.build_wheel(sys.argv[1]))", bin.dir)
	build.Dir = "../python/_build"
	build.Env = append(environWithout("FPT_"), "FPT_BIN="+bin.fpt, "FPT_LIB="+filepath.Join(lib, "..", "lib", "libfpt.so"))
	out, err := build.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("build_wheel: %w\n%s", err, out)
	}
	return filepath.Join(bin.dir, strings.TrimSpace(string(out))), nil
})

// The wheel: the package, the fptrun and fpt commands, the native files
// (executable where they run), tagged for this platform, and no path of
// the tree it was built in (an installed package must find nothing there).
func TestPythonWheel(t *testing.T) {
	wheel := buildWheel(t)
	if !regexp.MustCompile(`/fpt-[0-9.]+-py3-none-linux_[a-z0-9_]+\.whl$`).MatchString(wheel) {
		t.Errorf("wheel %s: not tagged for this platform", wheel)
	}
	z, err := zip.OpenReader(wheel)
	if err != nil {
		t.Fatal(err)
	}
	defer z.Close()
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, f := range z.File {
		rc, err := f.Open()
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		files[f.Name] = string(b)
		native := strings.HasPrefix(f.Name, "fpt/_native/")
		if native && f.Mode()&0o111 == 0 {
			t.Errorf("%s is not executable in the wheel (mode %v)", f.Name, f.Mode())
		}
		// The Go binaries name their sources for stack traces; nothing
		// else may name the tree.
		if !native && strings.Contains(string(b), repo) {
			t.Errorf("%s records the build tree %s", f.Name, repo)
		}
	}
	for name, want := range map[string]string{
		"fpt/__init__.py":                      "def push(",
		"fpt/torch.py":                         "def DistributedOptimizer(",
		"fpt/run.py":                           "def main(",
		"fpt/_native/fpt":                      "\x7fELF",
		"fpt/_native/libfpt.so":                "\x7fELF",
		"fpt-0.1.0.dist-info/entry_points.txt": "fptrun = fpt.run:main\nfpt = fpt._cli:main",
		"fpt-0.1.0.dist-info/RECORD":           "fpt/_lib.py,sha256=",
		"fpt-0.1.0.dist-info/WHEEL":            "Root-Is-Purelib: false",
	} {
		if !strings.Contains(files[name], want) {
			t.Errorf("wheel file %s does not contain %q (files: %d)", name, want, len(files))
		}
	}
}

// The wheel installed into a fresh virtual environment outside the tree,
// with no PYTHONPATH, FPT_LIB or FPT_BIN: fpt --version and
// fpt.__version__ agree with bin/fpt's, and fptrun runs a job that pushes
// and pulls from the installed package alone.
func TestWheelInstallsAnywhere(t *testing.T) {
	needPython(t)
	dir := t.TempDir()
	wheel := buildWheel(t)
	venv := filepath.Join(dir, "venv")
	run := func(what string, argv ...string) string {
		t.Helper()
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Dir = dir
		// As an activated environment: its bin first on PATH.
		cmd.Env = append(environWithout("FPT_", "PYTHON", "DMLC_", "PS_", "PATH="), "PATH="+filepath.Join(venv, "bin")+":"+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", what, err, tail(string(out)))
		}
		return string(out)
	}
	// Debian's python3 with torch and numpy; the venv sees them.
	run("venv", "/usr/bin/python3", "-m", "venv", "--system-site-packages", venv)
	run("pip install", filepath.Join(venv, "bin", "python"), "-m", "pip", "install", "--no-index", "--no-deps", "-q", wheel)
	want, err := exec.Command(bin.fpt, "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	if got := run("fpt --version", filepath.Join(venv, "bin", "fpt"), "--version"); got != string(want) || got != "fpt 0.1.0\n" {
		t.Errorf("fpt --version: %q; bin/fpt says %q, want fpt 0.1.0", got, want)
	}
	if got := run("fpt.__version__", filepath.Join(venv, "bin", "python"), "-c", "import fpt; print(fpt.__version__, fpt.__file__)"); !strings.HasPrefix(got, "0.1.0 "+venv) {
		t.Errorf("fpt.__version__ and file: %q; want 0.1.0 from %s", got, venv)
	}
	const script = `
import numpy as np, fpt
fpt.start()
r, n = fpt.rank(), fpt.num_workers()
fpt.declare(0, 4 * 1000, "float32")
fpt.init(0, np.zeros(1000, dtype=np.float32))
for it in range(3):
    g = np.full(1000, r + 1 + it, dtype=np.float32)
    out = np.zeros(1000, dtype=np.float32)
    fpt.push(0, g).wait()
    fpt.pull(0, out).wait()
    want = sum(w + 1 + it for w in range(n))
    assert (out == want).all(), (it, out[:3], want)
print("worker %d: pushed and pulled 3 iterations, every value exact" % r)
fpt.finalize()
`
	out := run("fptrun", filepath.Join(venv, "bin", "fptrun"), "-np", "2", "--servers", "1", "python", "-c", script)
	if n := strings.Count(out, "every value exact"); n != 2 {
		t.Errorf("%d workers passed, want 2:\n%s", n, tail(out))
	}
	mustContain(t, "fptrun output", out, "fptrun: all 4 processes finished cleanly")
}

// Under FPT_ON_WORKER_LOSS=continue a worker killed (kill -9) mid-run does
// not stop the others: fptrun lets the two left run to their end (each
// passes, every value checked), names the worker the job went on without,
// and still exits 1. The workers are test_kv_app: fptrun runs any command.
func TestFptrunWorkerLoss(t *testing.T) {
	py := needPython(t)
	r := startFptrun(t, py, []string{"FPT_ON_WORKER_LOSS=continue"}, "-np", "3", "--servers", "2",
		"../bin/test_kv_app", "-iters", "60", "-compute", "20ms", "-max-bytes", "65536", "-classic", "0")
	port := fptrunPort(t, r)
	fptrunOutput(t, r, regexp.MustCompile(`iteration 10/`))
	var victim int
	for _, p := range survivors(port) {
		if strings.Contains(p, "test_kv_app") {
			victim, _ = strconv.Atoi(p[:strings.IndexByte(p, ':')])
			break
		}
	}
	if victim == 0 {
		t.Fatal("no worker process found")
	}
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	code := r.wait(t, 2*time.Minute)
	out := r.out.String()
	if code != 1 {
		t.Errorf("fptrun exited %d, want 1 (a process failed)", code)
	}
	if n := strings.Count(out, "PASS: 60 iterations"); n != 2 {
		t.Errorf("%d workers passed, want the 2 left:\n%s", n, tail(out))
	}
	mustContain(t, "fptrun output", out, "exited with status -9; the job goes on without it",
		"fptrun: the others finished cleanly; the job went on without worker")
	if left := survivors(port); len(left) > 0 {
		t.Errorf("processes left behind: %v", left)
	}
}
