package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fptps/fpt/internal/localcluster"
	"github.com/fptps/fpt/launch"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/van"
	"github.com/fptps/fpt/worker"
)

// warmups are the untimed iterations after init; with init, each worker
// pushes and pulls its tensor iters+untimedIters times in a run.
const (
	warmups      = 2
	untimedIters = 1 + warmups
)

type goodputOptions struct {
	workers, servers int
	tensorBytes      int64
	iters            int
	partitionBytes   int64
	jsonOut          bool
	// step is how a worker exchanges its tensor each iteration:
	// "pushpull" (one FPTPushPull) or "separate" (FPTPush, then FPTPull).
	step string
	// authCompare runs every row four times, the cluster without a
	// secret, with one (FPT_CLUSTER_SECRET) twice, and without again, to
	// show what authentication costs.
	authCompare bool
}

// The --step choices.
const (
	stepPushPull = "pushpull"
	stepSeparate = "separate"
)

// shape is one cluster configuration of the goodput bench.
type shape struct {
	workers, servers int
	lb               bool
}

func (s shape) lbMode() string {
	if s.lb {
		return "on"
	}
	return "off"
}

func (s shape) String() string {
	return fmt.Sprintf("%d workers x %d servers, LB %s", s.workers, s.servers, s.lbMode())
}

// defaultShapes move every tensor byte over TCP: with one worker and the
// LB on, the worker would keep every partition's sum itself, and the bench
// would measure a memory copy.
var defaultShapes = []shape{{1, 1, false}, {2, 2, false}, {2, 2, true}}

// peerShapes are the rows of --peers: W workers x W servers, LB off, so
// that every node talks to W peers.
func peerShapes(list string) ([]shape, error) {
	var shapes []shape
	for _, item := range splitList(list) {
		w, err := strconv.Atoi(item)
		if err != nil || w < 1 {
			return nil, fmt.Errorf("--peers %q: %q is not a positive count", list, item)
		}
		shapes = append(shapes, shape{w, w, false})
	}
	if len(shapes) == 0 {
		return nil, fmt.Errorf("--peers %q: no counts", list)
	}
	return shapes, nil
}

// goodputResult is one line of "fpt bench --json".
type goodputResult struct {
	Van         string `json:"van"`
	Workers     int    `json:"workers"`
	Servers     int    `json:"servers"`
	LB          string `json:"lb"`
	TensorBytes int64  `json:"tensor_bytes"`
	Iters       int    `json:"iters"`
	Step        string `json:"step"` // --step
	// GoodputGbps is what worker rank 0 pushed plus pulled per second in
	// the timed iterations; RawTCPGbps two sockets moving the same bytes
	// both ways at once (the mean of one measurement before the cluster
	// and one after).
	GoodputGbps float64 `json:"goodput_gbps"`
	RawTCPGbps  float64 `json:"raw_tcp_gbps"`
	Ratio       float64 `json:"ratio"`
	// ClusterGoodputGbps is every worker's pushes plus pulls over rank 0's
	// timed iterations: what the cluster moved per second.
	ClusterGoodputGbps float64 `json:"cluster_goodput_gbps"`
	// TensorTrafficBytes is what every worker pushed plus pulled in the
	// timed iterations; TCPBytes what the vans wrote to TCP meanwhile,
	// frame headers included (0 would mean no byte crossed the network).
	TensorTrafficBytes int64  `json:"tensor_traffic_bytes"`
	TCPBytes           uint64 `json:"tcp_bytes"`
	// CPUSeconds is user+sys of every process of the cluster over its
	// whole life; CPUPerGB is that per GB (1e9 bytes) every worker pushed
	// and pulled over the run (init, warm-up and timed iterations).
	// RawTCPCPUPerGB is raw TCP's, per GB moved, through 4 MiB buffers
	// that stay in the CPU's cache; RawTCPTensorCPUPerGB the same
	// transfer through buffers of the tensor's size, which a tensor larger
	// than the cache has to come from and go to as the cluster's do.
	CPUSeconds           float64 `json:"cpu_s"`
	CPUPerGB             float64 `json:"cpu_s_per_gb"`
	RawTCPCPUPerGB       float64 `json:"raw_tcp_cpu_s_per_gb"`
	RawTCPTensorCPUPerGB float64 `json:"raw_tcp_tensor_cpu_s_per_gb"`
	// WorkersCPUPerGB, ServersCPUPerGB and SchedulerCPUPerGB split
	// CPUPerGB by role, to tell where the CPU above raw TCP's goes.
	// TimedCPUPerGB is every process's CPU over the timed iterations
	// only, per GB all workers pushed and pulled in them (cpuwindow.go):
	// the figure to hold against raw TCP's.
	TimedCPUPerGB     float64 `json:"timed_cpu_s_per_gb"`
	WorkersCPUPerGB   float64 `json:"workers_cpu_s_per_gb"`
	ServersCPUPerGB   float64 `json:"servers_cpu_s_per_gb"`
	SchedulerCPUPerGB float64 `json:"scheduler_cpu_s_per_gb"`
	// Secret is "on" when every process of the cluster had a
	// FPT_CLUSTER_SECRET, else "off". With --auth-compare, a row with the
	// secret on also has the mean goodput and CPU per GB of the
	// configuration's secret-on rows divided by those of its secret-off
	// rows, run in the order off, on, on, off.
	Secret        string  `json:"secret"`
	GoodputVsOff  float64 `json:"goodput_vs_secret_off,omitempty"`
	CPUPerGBVsOff float64 `json:"cpu_s_per_gb_vs_secret_off,omitempty"`
}

// goodputHeader and row are the table "fpt bench" prints without --json.
var goodputHeader = []string{"van", "workers", "servers", "lb", "tensor", "iters",
	"goodput Gbit/s", "raw TCP Gbit/s", "ratio", "all workers Gbit/s", "TCP/tensor bytes", "CPU s/GB", "raw TCP CPU s/GB",
	"raw TCP CPU s/GB, tensor buffers", "timed CPU s/GB", "CPU s/GB workers/servers/scheduler",
	"secret", "vs secret off (goodput, CPU/GB)"}

func (r goodputResult) row() []string {
	tcpShare := "-"
	if r.TensorTrafficBytes > 0 {
		tcpShare = fmt.Sprintf("%.3f", float64(r.TCPBytes)/float64(r.TensorTrafficBytes))
	}
	secret, vsOff := r.Secret, "-"
	if secret == "" {
		secret = "off"
	}
	if r.GoodputVsOff > 0 {
		vsOff = fmt.Sprintf("x%.3f, x%.3f", r.GoodputVsOff, r.CPUPerGBVsOff)
	}
	return []string{r.Van, strconv.Itoa(r.Workers), strconv.Itoa(r.Servers), r.LB,
		sizeText(r.TensorBytes), strconv.Itoa(r.Iters),
		fmt.Sprintf("%.2f", r.GoodputGbps), fmt.Sprintf("%.2f", r.RawTCPGbps), fmt.Sprintf("%.2f", r.Ratio),
		fmt.Sprintf("%.2f", r.ClusterGoodputGbps), tcpShare, fmt.Sprintf("%.3f", r.CPUPerGB), fmt.Sprintf("%.3f", r.RawTCPCPUPerGB),
		fmt.Sprintf("%.3f", r.RawTCPTensorCPUPerGB), fmt.Sprintf("%.3f", r.TimedCPUPerGB), fmt.Sprintf("%.3f/%.3f/%.3f", r.WorkersCPUPerGB, r.ServersCPUPerGB, r.SchedulerCPUPerGB),
		secret, vsOff}
}

// workerReport is what each worker of the bench cluster prints.
type workerReport struct {
	Rank     int     `json:"rank"`
	Seconds  float64 `json:"seconds"`   // the timed iterations
	TCPBytes uint64  `json:"tcp_bytes"` // see tcpBytes, over the timed iterations
	// Channels is the most connections the worker's van has to one peer
	// (FPT_CHANNELS as the van applied it).
	Channels int `json:"channels"`
}

// shapes are the configurations the flags ask for: --peers' rows, the one
// --workers, --servers and --lb give, or the default rows.
func (f *flags) shapes() ([]shape, error) {
	if f.lb != "on" && f.lb != "off" {
		return nil, fmt.Errorf("--lb %q: want on or off", f.lb)
	}
	switch {
	case f.peers != "":
		return peerShapes(f.peers)
	case f.set("workers") || f.set("servers") || f.set("lb"):
		return []shape{{f.goodput.workers, f.goodput.servers, f.lb == "on"}}, nil
	}
	return defaultShapes, nil
}

// goodputMain runs the goodput bench: in the parent, every van and shape;
// in a worker it started, the worker's side.
func goodputMain(f *flags) int {
	o := f.goodput
	if o.workers < 1 || o.servers < 1 || o.iters < 1 || o.tensorBytes < 4 || o.tensorBytes%4 != 0 {
		return usageError("workers, servers and iters must be positive, tensor-bytes a positive multiple of 4")
	}
	if o.step != stepPushPull && o.step != stepSeparate {
		return usageError("--step %q: %s or %s", o.step, stepPushPull, stepSeparate)
	}
	if isChild() {
		return runWorker(func(ctx context.Context, w *worker.Worker) error {
			return goodputWorker(ctx, w, o, os.Stdout, os.Stderr)
		})
	}
	shapes, err := f.shapes()
	if err != nil {
		return usageError("%v", err)
	}
	vans := splitList(f.vans)
	if len(vans) == 0 {
		return usageError("--van %q: no van", f.vans)
	}
	p := newProgress(os.Stderr)
	results := resultWriter{w: os.Stdout, jsonOut: o.jsonOut, header: goodputHeader, plot: f.plot}
	secrets := []bool{false}
	if o.authCompare {
		// ABBA: a drift of the machine over the four runs (the later runs
		// of a process tree were about 2 % slower here) weighs on both
		// sides alike, where off-then-on charged it all to the secret.
		secrets = []bool{false, true, true, false}
	}
	n := len(vans) * len(shapes) * len(secrets)
	k := 0
	for _, v := range vans {
		for _, s := range shapes {
			var rows []goodputResult
			for _, secret := range secrets {
				k++
				run := fmt.Sprintf("run %d/%d (%s van, %s, secret %s)", k, n, v, s, onOff(secret))
				res, err := goodputRun(v, s, o, p, run, secret)
				if err != nil {
					return failed(run, err)
				}
				p.printf(run, "goodput %.2f Gbit/s (raw TCP %.2f), %.3f CPU s/GB, timed %.3f (raw TCP %.3f, through tensor-sized buffers %.3f)",
					res.GoodputGbps, res.RawTCPGbps, res.CPUPerGB, res.TimedCPUPerGB, res.RawTCPCPUPerGB, res.RawTCPTensorCPUPerGB)
				rows = append(rows, res)
			}
			if o.authCompare {
				compareSecret(rows)
				p.printf(fmt.Sprintf("%s van, %s", v, s), "secret on / off (means of 2 runs each, ABBA): goodput x%.3f, CPU per GB x%.3f",
					rows[1].GoodputVsOff, rows[1].CPUPerGBVsOff)
			}
			for _, res := range rows {
				if err := results.add(res); err != nil {
					return failed("table", err)
				}
			}
		}
	}
	if err := results.flush(); err != nil {
		return failed("table", err)
	}
	return launch.ExitOK
}

// goodputRun measures a cluster of one shape on one van between two
// measurements of raw TCP; the baseline is their mean, so that a shift in
// the machine's load during the run does not favour either side.
func goodputRun(van string, s shape, o goodputOptions, p *progress, run string, secret bool) (goodputResult, error) {
	res := goodputResult{Van: van, Secret: onOff(secret), Workers: s.workers, Servers: s.servers, LB: s.lbMode(),
		TensorBytes: o.tensorBytes, Iters: o.iters, Step: o.step,
		TensorTrafficBytes: int64(s.workers) * 2 * o.tensorBytes * int64(o.iters)}
	volume := o.tensorBytes * int64(o.iters)
	p.printf(run, "raw TCP, %d MB each way", volume/1e6)
	before, cpuBefore, err := rawTCP(volume)
	if err != nil {
		return res, err
	}
	_, tensorBefore, err := rawTCPBuffers(volume, tensorBuffer(o.tensorBytes))
	if err != nil {
		return res, err
	}
	p.printf(run, "cluster starting")
	c, err := goodputCluster(van, s, o, p, run, secret)
	if err != nil {
		return res, err
	}
	p.printf(run, "raw TCP again")
	after, cpuAfter, err := rawTCP(volume)
	if err != nil {
		return res, err
	}
	_, tensorAfter, err := rawTCPBuffers(volume, tensorBuffer(o.tensorBytes))
	if err != nil {
		return res, err
	}
	res.RawTCPGbps = (before + after) / 2
	res.RawTCPCPUPerGB = cpuPerGB(cpuBefore+cpuAfter, float64(2*2*volume))
	res.RawTCPTensorCPUPerGB = cpuPerGB(tensorBefore+tensorAfter, float64(2*2*volume))
	res.GoodputGbps = gbps(float64(2*volume), c.timed)
	res.Ratio = res.GoodputGbps / res.RawTCPGbps
	res.ClusterGoodputGbps = gbps(float64(res.TensorTrafficBytes), c.timed)
	res.TCPBytes = c.tcpBytes
	res.CPUSeconds = c.cpu.Seconds()
	moved := float64(int64(s.workers) * 2 * o.tensorBytes * int64(o.iters+untimedIters))
	res.CPUPerGB = cpuPerGB(c.cpu, moved)
	res.TimedCPUPerGB = cpuPerGB(c.timedCPU, float64(res.TensorTrafficBytes))
	res.WorkersCPUPerGB = cpuPerGB(c.roleCPU["worker"], moved)
	res.ServersCPUPerGB = cpuPerGB(c.roleCPU["server"], moved)
	res.SchedulerCPUPerGB = cpuPerGB(c.roleCPU["scheduler"], moved)
	return res, nil
}

// clusterRun is what one run of the bench's cluster measured.
type clusterRun struct {
	timed    time.Duration // worker rank 0's timed iterations
	tcpBytes uint64        // every worker's tcpBytes, summed
	cpu      time.Duration // every process's user+sys
	roleCPU  map[string]time.Duration
	timedCPU time.Duration // every process's, over the timed iterations
}

// goodputCluster runs the cluster once.
func goodputCluster(van string, s shape, o goodputOptions, p *progress, run string, secret bool) (clusterRun, error) {
	self, err := os.Executable()
	if err != nil {
		return clusterRun{}, err
	}
	args := []string{self, "bench",
		"-tensor-bytes", strconv.FormatInt(o.tensorBytes, 10), "-iters", strconv.Itoa(o.iters), "-step", o.step}
	env := []string{"FPT_VAN=" + van, childEnv + "=1", "FPT_LB=" + s.lbMode()}
	if o.partitionBytes > 0 {
		env = append(env, "FPT_PARTITION_BYTES="+strconv.FormatInt(o.partitionBytes, 10))
	}
	secretEnv, err := clusterSecretEnv(secret)
	if err != nil {
		return clusterRun{}, err
	}
	env = append(env, secretEnv...)
	window := new(cpuWindow)
	c, err := localcluster.Start(localcluster.Spec{
		Servers: s.servers, Workers: s.workers,
		Scheduler: []string{self}, Server: []string{self}, Worker: args, Env: env,
		Stderr: func(name string) io.Writer {
			// Rank 0, whichever process it is, says the marks.
			if strings.HasPrefix(name, "worker") {
				return io.MultiWriter(p.relay(run), window.writer())
			}
			return nil
		},
	})
	if err != nil {
		return clusterRun{}, err
	}
	var pids []int
	for _, proc := range c.Procs {
		pids = append(pids, proc.Cmd.Process.Pid)
	}
	window.setPids(pids)
	defer c.Kill()
	if err := c.Wait(10 * time.Minute); err != nil {
		return clusterRun{}, err
	}
	var reps []workerReport
	for _, proc := range c.Procs {
		if !strings.HasPrefix(proc.Name, "worker") {
			continue
		}
		var rep workerReport
		if err := decodeReport(proc, &rep); err != nil {
			return clusterRun{}, err
		}
		reps = append(reps, rep)
	}
	r, err := sumReports(reps)
	if err != nil {
		return r, err
	}
	r.cpu = c.CPU()
	r.roleCPU = roleCPU(c)
	r.timedCPU, err = window.result(func(pid int) time.Duration {
		for _, proc := range c.Procs {
			if proc.Cmd.Process.Pid == pid {
				return proc.CPU()
			}
		}
		return 0
	})
	return r, err
}

// roleCPU is the user+sys CPU of c's processes by role: localcluster names
// them scheduler, server0.., worker0...
func roleCPU(c *localcluster.Cluster) map[string]time.Duration {
	m := map[string]time.Duration{}
	for _, proc := range c.Procs {
		m[strings.TrimRight(proc.Name, "0123456789")] += proc.CPU()
	}
	return m
}

// sumReports adds up the workers' reports: rank 0's time, everyone's bytes.
func sumReports(reps []workerReport) (clusterRun, error) {
	var r clusterRun
	for _, rep := range reps {
		r.tcpBytes += rep.TCPBytes
		if rep.Rank == 0 {
			r.timed = time.Duration(rep.Seconds * float64(time.Second))
		}
	}
	if r.timed <= 0 {
		return r, errors.New("worker rank 0 reported no time")
	}
	return r, nil
}

// tcpBytes is what crossed TCP to or from a worker between two snapshots
// of its van's counters, frame headers included: everything it sent (to
// servers, and to workers aggregating with the LB on) and what it received
// from servers. Summed over the workers, it counts every byte on the wire
// once, as servers talk only to workers.
func tcpBytes(before, after []van.PeerStats) uint64 {
	count := func(stats []van.PeerStats) uint64 {
		var n uint64
		for _, st := range stats {
			n += st.SentBytes
			if r, ok := st.Peer.Role(); ok && r == node.Server {
				n += st.ReceivedBytes
			}
		}
		return n
	}
	return count(after) - count(before)
}

// goodputWorker pushes and pulls one tensor; every worker prints its
// report as JSON on out, rank 0 its progress on errOut. The sums are
// spot-checked: a fast wrong answer is no benchmark.
func goodputWorker(ctx context.Context, w *worker.Worker, o goodputOptions, out, errOut io.Writer) error {
	kv := worker.NewKV[float32](w)
	n := int(o.tensorBytes / 4)
	if err := kv.Declare(0, n, 0); err != nil {
		return err
	}
	grads := make([]float32, n)
	sums := make([]float32, n)
	// i%251 + rank, without a division per element: the fill is not
	// what the bench measures, and it is counted in its CPU.
	for i, r := 0, 0; i < n; i, r = i+1, r+1 {
		if r == 251 {
			r = 0
		}
		grads[i] = float32(r + w.Rank())
	}
	keys, lens := []uint64{0}, []int{n}
	if err := kv.Init(ctx, keys, sums, lens); err != nil {
		return err
	}
	step := func() error {
		if o.step == stepPushPull {
			ts, err := kv.FPTPushPull(keys, grads, sums, lens, 0, nil)
			if err != nil {
				return err
			}
			return kv.Wait(ts)
		}
		push, err := kv.FPTPush(keys, grads, lens, 0, nil)
		if err != nil {
			return err
		}
		pull, err := kv.FPTPull(keys, sums, lens, nil)
		if err != nil {
			return err
		}
		if err := kv.Wait(pull); err != nil {
			return err
		}
		return kv.Wait(push)
	}
	say := func(string, ...any) {}
	if w.Rank() == 0 {
		progressOut := marked(errOut)
		say = func(format string, args ...any) { fmt.Fprintf(progressOut, format+"\n", args...) }
	}
	say("warm-up")
	for range warmups {
		if err := step(); err != nil {
			return err
		}
	}
	if err := w.Barrier(ctx, node.WorkerGroup); err != nil {
		return err
	}
	say(markTimedStart)
	v := w.Node().Van()
	before := v.Stats()
	start := time.Now()
	tick := ticker{every: time.Second}
	for i := 1; i <= o.iters; i++ {
		if err := step(); err != nil {
			return err
		}
		if now := time.Now(); tick.due(i, o.iters, now) {
			say("iteration %d/%d, %.1fs", i, o.iters, now.Sub(start).Seconds())
		}
	}
	elapsed := time.Since(start)
	// Every worker's last pull is in, and with it every byte of the timed
	// iterations on every worker's counters.
	if err := w.Barrier(ctx, node.WorkerGroup); err != nil {
		return err
	}
	say(markTimedEnd)
	after := v.Stats()
	workers := w.NumWorkers()
	for _, i := range []int{0, n / 2, n - 1} {
		want := float32(workers*(i%251) + workers*(workers-1)/2)
		if sums[i] != want {
			return fmt.Errorf("bench: element %d = %v, want %v", i, sums[i], want)
		}
	}
	channels := 0
	for _, st := range after {
		channels = max(channels, st.Channels)
	}
	return writeJSONLine(out, workerReport{Rank: w.Rank(), Seconds: elapsed.Seconds(), TCPBytes: tcpBytes(before, after), Channels: channels})
}

// rawTCP moves volume bytes each way at once between two loopback TCP
// sockets and returns the total rate in Gbit/s, the ceiling a push (one
// way) overlapped with a pull (the other way) could reach, and the CPU
// time this process spent meanwhile (both ends' user+sys).
func rawTCP(volume int64) (float64, time.Duration, error) {
	return rawTCPBuffers(volume, pumpCall)
}

// pumpCall is the bytes of one read or write of raw TCP.
const pumpCall = 4 << 20

// maxTensorBuffer bounds each of the four buffers of raw TCP through
// tensor-sized buffers: far past any CPU cache, as the cluster's tensors.
const maxTensorBuffer = 256 << 20

// tensorBuffer is the size of the buffers of raw TCP through tensor-sized
// buffers: the tensor's, within [pumpCall, maxTensorBuffer].
func tensorBuffer(tensorBytes int64) int {
	return int(min(max(tensorBytes, pumpCall), maxTensorBuffer))
}

// rawTCPBuffers is rawTCP with each of its four pumps cycling through a
// buffer of bufBytes, touched before the clock starts.
func rawTCPBuffers(volume int64, bufBytes int) (float64, time.Duration, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, 0, err
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	a, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		return 0, 0, err
	}
	defer a.Close()
	b, ok := <-accepted
	if !ok {
		return 0, 0, errors.New("raw tcp: accept failed")
	}
	defer b.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	var bufs [4][]byte
	for i := range bufs {
		// Written, so that no page fault falls in the measurement.
		bufs[i] = bytes.Repeat([]byte{byte(i + 1)}, bufBytes)
	}
	cpu0, err := selfCPU()
	if err != nil {
		return 0, 0, err
	}
	start := time.Now()
	for i, c := range []net.Conn{a, b} {
		// Large calls both ways, as the vans make: io.Copy's small ones
		// would understate the baseline.
		for j, op := range []func([]byte) (int, error){c.Write, c.Read} {
			buf := bufs[2*i+j]
			wg.Go(func() {
				if err := pump(volume, buf, op); err != nil {
					errs <- err
				}
			})
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu1, err := selfCPU()
	if err != nil {
		return 0, 0, err
	}
	close(errs)
	if err := <-errs; err != nil {
		return 0, 0, fmt.Errorf("raw tcp: %w", err)
	}
	return gbps(float64(2*volume), elapsed), cpu1 - cpu0, nil
}

// selfCPU is this process's user+sys CPU time so far.
func selfCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// pump moves volume bytes through op (a Write or a Read) in calls of at
// most pumpCall bytes, going round buf.
func pump(volume int64, buf []byte, op func([]byte) (int, error)) error {
	off := 0
	for left := volume; left > 0; {
		end := min(off+pumpCall, len(buf))
		n, err := op(buf[off:min(end, off+int(min(left, int64(pumpCall))))])
		if err != nil {
			return err
		}
		left -= int64(n)
		if off += n; off == len(buf) {
			off = 0
		}
	}
	return nil
}

// onOff is "on" or "off".
func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// compareSecret gives every secret-on row of one configuration the mean
// goodput and CPU per GB of the secret-on rows over those of the
// secret-off rows.
func compareSecret(rows []goodputResult) {
	var on, off struct{ goodput, cpu float64 }
	for _, r := range rows {
		side := &off
		if r.Secret == "on" {
			side = &on
		}
		side.goodput += r.GoodputGbps
		side.cpu += r.CPUPerGB
	}
	for i := range rows {
		if rows[i].Secret != "on" {
			continue
		}
		if off.goodput > 0 {
			rows[i].GoodputVsOff = on.goodput / off.goodput
		}
		if off.cpu > 0 {
			rows[i].CPUPerGBVsOff = on.cpu / off.cpu
		}
	}
}

// clusterSecretEnv is the environment that gives every process of a bench
// cluster a fresh random secret, or (off) none, whatever the caller's
// environment holds: the later, empty settings override inherited ones.
func clusterSecretEnv(on bool) ([]string, error) {
	if !on {
		return []string{"FPT_CLUSTER_SECRET=", "FPT_CLUSTER_SECRET_FILE="}, nil
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return nil, fmt.Errorf("bench: a cluster secret: %w", err)
	}
	return []string{"FPT_CLUSTER_SECRET=" + hex.EncodeToString(b), "FPT_CLUSTER_SECRET_FILE="}, nil
}
