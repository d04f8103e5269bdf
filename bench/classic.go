package bench

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/fptps/fpt/internal/localcluster"
	"github.com/fptps/fpt/launch"
)

// scenarioClassic is "fpt bench --scenario classic": ps-lite's classic
// path (KVWorker ZPush/ZPull into the servers' KVServerDefaultHandle,
// through include/ps) next to the FPT path (FPTPush/FPTPull) of the same
// C++ program (clients/pslite/benchmark.cc, bin/pslite_benchmark) and raw
// TCP, for a dense case (a few keys of 8 MiB) and a sparse one (many keys
// of one float), on loopback, all in one run.
const scenarioClassic = "classic"

// The classic scenario's defaults.
const (
	classicDenseKeys     = 4
	classicDenseKeyBytes = 8 << 20
	classicSparseKeys    = 10_000_000
	classicIters         = 5
	classicPeers         = 2 // workers and servers unless --workers/--servers say
)

// classicResult is one row of the classic scenario: one path for one case.
type classicResult struct {
	Scenario string `json:"scenario"`
	Case     string `json:"case"` // dense or sparse
	Path     string `json:"path"` // classic, fpt or raw-tcp
	Workers  int    `json:"workers,omitempty"`
	Servers  int    `json:"servers,omitempty"`
	Keys     int    `json:"keys,omitempty"`
	// Bytes is what a worker pushes (and pulls back) per iteration.
	Bytes int64 `json:"bytes"`
	Iters int   `json:"iters"`
	// PushMs and PullMs are worker rank 0's mean push and pull times per
	// iteration; on the FPT path a push overlaps its pull and PullMs is
	// the pair's.
	PushMs float64 `json:"push_ms,omitempty"`
	PullMs float64 `json:"pull_ms,omitempty"`
	// Gbps is worker rank 0's bytes pushed plus pulled per second (raw
	// TCP: both ways at once between two sockets).
	Gbps float64 `json:"gbps"`
	// CPUPerGB is the user+sys seconds of every process of the cluster
	// (start and end included) per GB pushed and pulled by all workers;
	// raw TCP's, of both ends per GB moved.
	CPUPerGB float64 `json:"cpu_s_per_gb"`
}

var classicHeader = []string{"case", "path", "workers x servers", "keys", "bytes/worker", "iters",
	"push ms", "pull ms", "Gbit/s", "CPU s/GB"}

func (r classicResult) row() []string {
	shape, keys, push := "", "", ""
	if r.Path != classicPathTCP {
		shape = fmt.Sprintf("%d x %d", r.Workers, r.Servers)
		keys = strconv.Itoa(r.Keys)
	}
	if r.Path == classicPathClassic || r.Path == classicPathPSLite {
		push = fmt.Sprintf("%.1f", r.PushMs)
	}
	pull := ""
	if r.Path != classicPathTCP {
		pull = fmt.Sprintf("%.1f", r.PullMs)
	}
	return []string{r.Case, r.Path, shape, keys, sizeText(r.Bytes), strconv.Itoa(r.Iters), push, pull,
		fmt.Sprintf("%.3f", r.Gbps), fmt.Sprintf("%.3f", r.CPUPerGB)}
}

const (
	classicPathClassic = "classic"
	classicPathFPT     = "fpt"
	classicPathTCP     = "raw-tcp"
	// classicPathPSLite is the classic path of the program built against
	// dmlc/ps-lite (--pslite-program). ps-lite's KVServerDefaultHandle
	// keeps one value per key, so in the dense case its servers run the
	// program's own handle of one vector per key (-handle vector).
	classicPathPSLite = "ps-lite"
)

// classicCase is one of the scenario's two loads.
type classicCase struct {
	name  string
	keys  int   // the classic path's keys
	bytes int64 // a worker's push per iteration
}

// classicCases are the dense and sparse loads: the dense one's keys of
// keyBytes each, the sparse one's keys of one float.
func classicCases(denseKeys int, keyBytes int64, sparseKeys int) []classicCase {
	return []classicCase{
		{name: "dense", keys: denseKeys, bytes: int64(denseKeys) * keyBytes},
		{name: "sparse", keys: sparseKeys, bytes: int64(sparseKeys) * 4},
	}
}

// programArgs is the C++ program's command line for one path of a case.
// The FPT path moves the sparse case's bytes as one tensor: it declares
// every key, a tensor each, which is not what it is for.
func (c classicCase) programArgs(program, path string, iters int) []string {
	keys := c.keys
	if path == classicPathFPT && c.name == "sparse" {
		keys = 1
	}
	mode, handle := path, "default"
	if path == classicPathPSLite {
		mode = classicPathClassic
		if c.name == "dense" {
			handle = "vector"
		}
	}
	return []string{program, "-bytes", strconv.FormatInt(c.bytes, 10), "-keys", strconv.Itoa(keys),
		"-iters", strconv.Itoa(iters), "-mode", mode, "-handle", handle}
}

// programReport is the line "bench: {...}" a worker of the program prints.
type programReport struct {
	Rank       int     `json:"rank"`
	PushS      float64 `json:"push_s"`
	PullS      float64 `json:"pull_s"`
	MovedBytes float64 `json:"moved_bytes"`
}

// parseProgramReport finds the program's report in a worker's stdout.
func parseProgramReport(out string) (programReport, error) {
	var rep programReport
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "bench: ")
		if !ok {
			continue
		}
		if err := json.Unmarshal([]byte(line), &rep); err != nil {
			return rep, fmt.Errorf("report %q: %w", line, err)
		}
		return rep, nil
	}
	return rep, errors.New("no line \"bench: {...}\" in its output")
}

// classicOptions are the classic scenario's settings.
type classicOptions struct {
	program          string
	pslite           string // the program built against dmlc/ps-lite, or ""
	workers, servers int
	iters            int
	denseKeys        int
	keyBytes         int64
	sparseKeys       int
}

// classicMain runs the classic scenario.
func classicMain(f *flags) int {
	o := classicOptions{program: f.classicProgram, pslite: f.psliteProgram, workers: classicPeers, servers: classicPeers, iters: classicIters,
		denseKeys: classicDenseKeys, keyBytes: classicDenseKeyBytes, sparseKeys: f.sparseKeys}
	if f.set("workers") {
		o.workers = f.goodput.workers
	}
	if f.set("servers") {
		o.servers = f.goodput.servers
	}
	if f.set("iters") {
		o.iters = f.goodput.iters
	}
	if f.set("tensor-bytes") {
		o.keyBytes = f.goodput.tensorBytes
	}
	if o.workers < 1 || o.servers < 1 || o.iters < 1 || o.sparseKeys < 1 || o.keyBytes < 4 || o.keyBytes%4 != 0 {
		return usageError("classic: --workers %d, --servers %d, --iters %d, --sparse-keys %d, --tensor-bytes %d: want positive counts and a multiple of 4",
			o.workers, o.servers, o.iters, o.sparseKeys, o.keyBytes)
	}
	if f.plot != "" {
		return usageError("classic: no --plot")
	}
	if o.program == "" {
		self, err := os.Executable()
		if err != nil {
			return failed(scenarioClassic, err)
		}
		o.program = filepath.Join(filepath.Dir(self), "pslite_benchmark")
	}
	if _, err := os.Stat(o.program); err != nil {
		return usageError("classic: the C++ program: %v (scripts/build.sh builds bin/pslite_benchmark; --classic-program names another)", err)
	}
	paths := []string{classicPathClassic, classicPathFPT, classicPathTCP}
	if o.pslite != "" {
		if _, err := os.Stat(o.pslite); err != nil {
			return usageError("classic: --pslite-program: %v", err)
		}
		paths = []string{classicPathPSLite, classicPathClassic, classicPathFPT, classicPathTCP}
	}
	p := newProgress(os.Stderr)
	results := resultWriter{w: os.Stdout, jsonOut: f.goodput.jsonOut, header: classicHeader}
	for _, c := range classicCases(o.denseKeys, o.keyBytes, o.sparseKeys) {
		for _, path := range paths {
			run := c.name + " " + path
			var (
				res classicResult
				err error
			)
			if path == classicPathTCP {
				res, err = classicRawTCP(c, o, p, run)
			} else {
				res, err = classicRun(c, path, o, p, run)
			}
			if err != nil {
				return failed(run, err)
			}
			p.printf(run, "%.3f Gbit/s, %.3f CPU s/GB", res.Gbps, res.CPUPerGB)
			if err := results.add(res); err != nil {
				return failed("output", err)
			}
		}
	}
	if err := results.flush(); err != nil {
		return failed("table", err)
	}
	return launch.ExitOK
}

// classicRun runs the C++ program's cluster for one path of a case.
func classicRun(c classicCase, path string, o classicOptions, p *progress, run string) (classicResult, error) {
	res := classicResult{Scenario: scenarioClassic, Case: c.name, Path: path, Workers: o.workers, Servers: o.servers,
		Keys: c.keys, Bytes: c.bytes, Iters: o.iters}
	program := o.program
	if path == classicPathPSLite {
		program = o.pslite
	}
	argv := c.programArgs(program, path, o.iters)
	if path == classicPathFPT && c.name == "sparse" {
		res.Keys = 1
	}
	p.printf(run, "%d workers x %d servers, %d keys, %s a worker, %d iterations", o.workers, o.servers, res.Keys, sizeText(c.bytes), o.iters)
	cl, err := localcluster.Start(localcluster.Spec{
		Servers: o.servers, Workers: o.workers,
		Scheduler: argv, Server: argv, Worker: argv,
		Env: []string{"PS_VERBOSE=0"},
	})
	if err != nil {
		return res, err
	}
	defer cl.Kill()
	if err := cl.Wait(10 * time.Minute); err != nil {
		return res, err
	}
	moved := 0.0
	for _, proc := range cl.Procs {
		if !strings.HasPrefix(proc.Name, "worker") {
			continue
		}
		rep, err := parseProgramReport(proc.Stdout.String())
		if err != nil {
			return res, fmt.Errorf("%s: %w", proc.Name, err)
		}
		moved += rep.MovedBytes
		if rep.Rank == 0 {
			res.PushMs = rep.PushS * 1e3 / float64(o.iters)
			res.PullMs = rep.PullS * 1e3 / float64(o.iters)
			res.Gbps = gbps(float64(2*c.bytes)*float64(o.iters), time.Duration((rep.PushS+rep.PullS)*float64(time.Second)))
		}
	}
	res.CPUPerGB = cpuPerGB(cl.CPU(), moved)
	return res, nil
}

// classicRawTCP moves a worker's bytes of all iterations each way at once
// between two sockets.
func classicRawTCP(c classicCase, o classicOptions, p *progress, run string) (classicResult, error) {
	res := classicResult{Scenario: scenarioClassic, Case: c.name, Path: classicPathTCP, Bytes: c.bytes, Iters: o.iters}
	volume := c.bytes * int64(o.iters)
	p.printf(run, "%d MB each way", volume/1e6)
	rate, cpu, err := rawTCP(volume)
	if err != nil {
		return res, err
	}
	res.Gbps, res.CPUPerGB = rate, cpuPerGB(cpu, float64(2*volume))
	return res, nil
}
