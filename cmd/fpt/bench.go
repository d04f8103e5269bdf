package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fptps/fpt/launch"
	"github.com/fptps/fpt/internal/localcluster"
	"github.com/fptps/fpt/worker"
)

// benchChildEnv marks a child process that "fpt bench" started as one of
// its cluster's workers.
const benchChildEnv = "FPT_BENCH_CHILD"

type benchOptions struct {
	vans           []string
	workers        int
	servers        int
	tensorBytes    int64
	iters          int
	partitionBytes int64
	jsonOut        bool
}

// benchResult is one line of "fpt bench --json".
type benchResult struct {
	Van         string  `json:"van"`
	Workers     int     `json:"workers"`
	Servers     int     `json:"servers"`
	TensorBytes int64   `json:"tensor_bytes"`
	Iters       int     `json:"iters"`
	GoodputGbps float64 `json:"goodput_gbps"`
	RawTCPGbps  float64 `json:"raw_tcp_gbps"`
	Ratio       float64 `json:"ratio"`
}

// workerReport is what worker 0 of the bench cluster prints.
type workerReport struct {
	Seconds float64 `json:"seconds"`
}

func benchMain(args []string) int {
	fs := flag.NewFlagSet("fpt bench", flag.ContinueOnError)
	var o benchOptions
	van := fs.String("van", "epoll,netconn", "vans to measure, comma-separated (epoll, netconn)")
	fs.IntVar(&o.workers, "workers", 1, "workers")
	fs.IntVar(&o.servers, "servers", 1, "servers")
	fs.Int64Var(&o.tensorBytes, "tensor-bytes", 64<<20, "size of the one float32 tensor pushed and pulled")
	fs.IntVar(&o.iters, "iters", 50, "timed iterations (after init and two warm-up iterations); LB scenarios:\ntraining iterations per run (default 20 there)")
	fs.Int64Var(&o.partitionBytes, "partition-bytes", 0, "FPT_PARTITION_BYTES for the cluster (0: the default)")
	fs.BoolVar(&o.jsonOut, "json", false, "one JSON object per line")
	var so scenarioOptions
	fs.StringVar(&so.name, "scenario", "", "run a scenario in an emulated network instead (needs root): shaping, priority,\nor slow-server, equal, slow-worker (comma-separated for several)")
	fs.StringVar(&so.rate, "rate", "200mbit", "scenarios: the worker host's link rate, both ways (tc syntax); LB scenarios:\nevery host's but the slow one's (default 400mbit there)")
	var lo lbOptions
	registerLBFlags(fs, &lo)
	weights := fs.String("weights", "3:1", "shaping scenario: the worker's flow weights for server 0 and server 1")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: fpt bench [flags]\n\nRuns a cluster on loopback (separate processes), pushes and pulls one tensor, and\nreports goodput (bytes pushed plus pulled by one worker per second) against raw TCP\nmoving the same bytes both ways at once between two Go sockets, measured in the same run.\n\nWith --scenario, runs a cluster in an emulated network (network namespaces, tbf) instead\nand prints one JSON line:\n  shaping   one worker behind a --rate link pushes to two servers with flow weights\n            --weights; byte_ratio is what the servers received while both flows were\n            backlogged (unshaped_byte_ratio: the same run with shaping off)\n  priority  a low- and a high-priority tensor pushed together; when each sum arrived,\n            next to the same push with equal priorities\n  slow-server, equal, slow-worker\n            the simulated trainer with the load balancer off (FPT_LB=off, even split over\n            the servers) and on: even_iter_ms, lb_iter_ms and bound_iter_ms (the least\n            the configured rates allow); one host is at --slow-rate in slow-server (server\n            rank 1 of 2, 2 workers) and slow-worker (worker rank 3 of 4, 2 servers); equal\n            has 4 workers and 4 servers\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return launch.ExitUsage
	}
	if so.name != "" && isLBScenario(so.name) {
		return lbScenarioMain(fs, so.name, so.rate, o, lo)
	}
	if so.name != "" {
		return scenarioMain(fs, so, *weights, o)
	}
	o.vans = strings.Split(*van, ",")
	if o.workers < 1 || o.servers < 1 || o.iters < 1 || o.tensorBytes < 4 || o.tensorBytes%4 != 0 {
		fmt.Fprintln(os.Stderr, "fpt bench: workers, servers and iters must be positive, tensor-bytes a positive multiple of 4")
		return launch.ExitUsage
	}
	if os.Getenv(benchChildEnv) != "" {
		return launch.Main("fpt bench", os.LookupEnv, os.Stderr, func(ctx context.Context, w *worker.Worker) error {
			return benchWorker(ctx, w, o, os.Stdout)
		})
	}
	for _, v := range o.vans {
		res, err := benchOne(v, o)
		if err != nil {
			fmt.Fprintf(os.Stderr, "fpt bench: %s: %v\n", v, err)
			return launch.ExitFailed
		}
		if o.jsonOut {
			line, _ := json.Marshal(res)
			fmt.Println(string(line))
		} else {
			fmt.Printf("van=%-8s workers=%d servers=%d tensor=%d MiB iters=%d  goodput %.2f Gbit/s  raw TCP %.2f Gbit/s  ratio %.2f\n",
				res.Van, res.Workers, res.Servers, res.TensorBytes>>20, res.Iters, res.GoodputGbps, res.RawTCPGbps, res.Ratio)
		}
	}
	return launch.ExitOK
}

// benchOne measures a cluster on one van between two measurements of raw
// TCP; the baseline is their mean, so that a shift in the machine's load
// during the run does not favour either side.
func benchOne(van string, o benchOptions) (benchResult, error) {
	volume := o.tensorBytes * int64(o.iters)
	before, err := rawTCP(volume)
	if err != nil {
		return benchResult{}, err
	}
	goodput, err := benchCluster(van, o, volume)
	if err != nil {
		return benchResult{}, err
	}
	after, err := rawTCP(volume)
	if err != nil {
		return benchResult{}, err
	}
	raw := (before + after) / 2
	return benchResult{
		Van: van, Workers: o.workers, Servers: o.servers, TensorBytes: o.tensorBytes, Iters: o.iters,
		GoodputGbps: goodput, RawTCPGbps: raw, Ratio: goodput / raw,
	}, nil
}

// benchCluster runs the cluster and returns worker 0's goodput in Gbit/s.
func benchCluster(van string, o benchOptions, volume int64) (float64, error) {
	self, err := os.Executable()
	if err != nil {
		return 0, err
	}
	args := []string{self, "bench",
		"-tensor-bytes", strconv.FormatInt(o.tensorBytes, 10), "-iters", strconv.Itoa(o.iters)}
	env := []string{"FPT_VAN=" + van, benchChildEnv + "=1"}
	if o.partitionBytes > 0 {
		env = append(env, "FPT_PARTITION_BYTES="+strconv.FormatInt(o.partitionBytes, 10))
	}
	c, err := localcluster.Start(localcluster.Spec{
		Servers: o.servers, Workers: o.workers,
		Scheduler: []string{self}, Server: []string{self}, Worker: args, Env: env,
	})
	if err != nil {
		return 0, err
	}
	defer c.Kill()
	if err := c.Wait(10 * time.Minute); err != nil {
		return 0, err
	}
	var rep workerReport
	for _, p := range c.Procs {
		if out := strings.TrimSpace(p.Stdout.String()); strings.HasPrefix(p.Name, "worker") && out != "" {
			if err := json.Unmarshal([]byte(out), &rep); err != nil {
				return 0, fmt.Errorf("%s printed %q: %w", p.Name, out, err)
			}
		}
	}
	if rep.Seconds <= 0 {
		return 0, errors.New("no worker reported a time")
	}
	return float64(2*volume) * 8 / rep.Seconds / 1e9, nil
}

// benchWorker pushes and pulls one tensor; worker 0 prints the time of the
// timed iterations as JSON. The sums are spot-checked: a fast wrong answer
// is no benchmark.
func benchWorker(ctx context.Context, w *worker.Worker, o benchOptions, out io.Writer) error {
	kv := worker.NewKV[float32](w)
	n := int(o.tensorBytes / 4)
	if err := kv.Declare(0, n, 0); err != nil {
		return err
	}
	grads := make([]float32, n)
	sums := make([]float32, n)
	for i := range grads {
		grads[i] = float32(i%251 + w.Rank())
	}
	keys, lens := []uint64{0}, []int{n}
	if err := kv.Init(ctx, keys, sums, lens); err != nil {
		return err
	}
	step := func() error {
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
	for range 2 {
		if err := step(); err != nil {
			return err
		}
	}
	if err := w.Barrier(ctx, 4); err != nil {
		return err
	}
	start := time.Now()
	for range o.iters {
		if err := step(); err != nil {
			return err
		}
	}
	elapsed := time.Since(start)
	workers := w.NumWorkers()
	for _, i := range []int{0, n / 2, n - 1} {
		want := float32(workers*(i%251) + workers*(workers-1)/2)
		if sums[i] != want {
			return fmt.Errorf("bench: element %d = %v, want %v", i, sums[i], want)
		}
	}
	if w.Rank() == 0 {
		line, _ := json.Marshal(workerReport{Seconds: elapsed.Seconds()})
		fmt.Fprintln(out, string(line))
	}
	return nil
}

// rawTCP moves volume bytes each way at once between two loopback TCP
// sockets and returns the total rate in Gbit/s: the ceiling a push (one way)
// overlapped with a pull (the other way) could reach.
func rawTCP(volume int64) (float64, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
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
		return 0, err
	}
	defer a.Close()
	b, ok := <-accepted
	if !ok {
		return 0, errors.New("raw tcp: accept failed")
	}
	defer b.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	start := time.Now()
	for _, c := range []net.Conn{a, b} {
		// Large buffers both ways, as the vans use: io.Copy's small ones
		// would understate the baseline.
		for _, op := range []func([]byte) (int, error){c.Write, c.Read} {
			wg.Go(func() {
				if err := pump(volume, op); err != nil {
					errs <- err
				}
			})
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		return 0, fmt.Errorf("raw tcp: %w", err)
	}
	return float64(2*volume) * 8 / elapsed.Seconds() / 1e9, nil
}

// pump moves volume bytes through op (a Write or a Read) in 4 MiB calls.
func pump(volume int64, op func([]byte) (int, error)) error {
	buf := make([]byte, 4<<20)
	for left := volume; left > 0; {
		n, err := op(buf[:min(int64(len(buf)), left)])
		if err != nil {
			return err
		}
		left -= int64(n)
	}
	return nil
}
