package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fptps/fpt/internal/localcluster"
	"github.com/fptps/fpt/launch"
	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/netem"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/worker"
)

// The hosts scenario: several workers per emulated host (one server per
// host, the scheduler on host 0), the simulated trainer with local
// aggregation off, then on (FPT_LOCAL_AGGREGATION), first with the LB off
// (the even split over the servers), then on (balancing by host with
// local aggregation), and the bytes through every host's link from its
// interface's counters.
const scenarioHosts = "hosts"

// Defaults of the hosts scenario.
const (
	hostsDefaultWorkers = "4,4"
	hostsDefaultRate    = "1gbit"
	hostsDefaultIters   = 12
)

// hostsResult is one run of the hosts scenario: one mode, one placement.
type hostsResult struct {
	Scenario         string  `json:"scenario"`
	LocalAggregation string  `json:"local_aggregation"`
	LB               string  `json:"lb"`
	HostsWorkers     []int   `json:"hosts_workers"`
	Rate             string  `json:"rate"`
	ModelBytes       int64   `json:"model_bytes"`
	Iterations       int     `json:"iterations"`
	IterMs           float64 `json:"iter_ms"`  // median over the last --tail iterations
	BoundMs          float64 `json:"bound_ms"` // lb.HostBound for the mode
	// HostLinkBytes is each host's interface counters (sent plus
	// received) over the run, per iteration; ModelLinkBytes what the
	// traffic model by host (lb.HostLoad, both ways) says for the even
	// split over the servers, payload only (with the LB on, the split it
	// balanced differs).
	HostLinkBytes  []int64 `json:"host_link_bytes"`
	ModelLinkBytes []int64 `json:"model_link_bytes"`
}

var hostsHeader = []string{"scenario", "local aggregation", "lb", "hosts workers", "rate", "iter ms", "bound ms", "host link bytes/iter", "model bytes/iter"}

func (r hostsResult) row() []string {
	f := func(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }
	return []string{r.Scenario, r.LocalAggregation, r.LB, joinInts(r.HostsWorkers), r.Rate, f(r.IterMs), f(r.BoundMs),
		joinInt64s(r.HostLinkBytes), joinInt64s(r.ModelLinkBytes)}
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

func joinInt64s(xs []int64) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.FormatInt(x, 10)
	}
	return strings.Join(s, ",")
}

// parseHostsWorkers reads --hosts-workers: workers per host, each at
// least 1, two hosts at least.
func parseHostsWorkers(s string) ([]int, error) {
	var ws []int
	for _, it := range splitList(s) {
		n, err := strconv.Atoi(it)
		if err != nil || n < 1 || n > 16 {
			return nil, fmt.Errorf("--hosts-workers %q: want workers per host, 1 to 16 each, as 4,3,1", s)
		}
		ws = append(ws, n)
	}
	if len(ws) < 2 {
		return nil, fmt.Errorf("--hosts-workers %q: want two hosts at least", s)
	}
	return ws, nil
}

// hostsPlacement maps the scenario's processes to hosts: server i on host
// i, the workers host by host, the scheduler on host 0.
func hostsPlacement(workers []int) map[string]int {
	m := map[string]int{"scheduler": 0}
	k := 0
	for h, n := range workers {
		m["server"+strconv.Itoa(h)] = h
		for range n {
			m["worker"+strconv.Itoa(k)] = h
			k++
		}
	}
	return m
}

// hostsModel is the traffic model by host for the placement: the
// bound, and each host's bytes both ways under the even split.
func hostsModel(workers []int, capacity float64, model int64, local bool) (time.Duration, []int64, error) {
	in := lb.HostInput{HostOf: map[node.ID]int{}, ModelBytes: float64(model), Local: local}
	var servers []node.ID
	k := 0
	for h, n := range workers {
		in.Capacity = append(in.Capacity, capacity)
		in.HostOf[node.ServerID(h)] = h
		servers = append(servers, node.ServerID(h))
		for range n {
			in.HostOf[node.WorkerID(k)] = h
			k++
		}
	}
	bound, err := lb.HostBound(in)
	if err != nil {
		return 0, nil, err
	}
	load, err := lb.HostLoad(in, lb.Even(1, 0, servers))
	if err != nil {
		return 0, nil, err
	}
	both := make([]int64, len(load))
	for i, l := range load {
		both[i] = int64(2 * l)
	}
	return bound, both, nil
}

// linkBytes reads host i's interface counters: bytes sent plus received.
func linkBytes(ctx context.Context, net *netem.Network, i int) (int64, error) {
	out, err := exec.CommandContext(ctx, "ip", "-n", net.Namespace(i), "-s", "-j", "link", "show", "dev", net.Iface()).Output()
	if err != nil {
		return 0, fmt.Errorf("host %d's counters: %w", i, err)
	}
	var links []struct {
		Stats struct {
			RX struct{ Bytes int64 } `json:"rx"`
			TX struct{ Bytes int64 } `json:"tx"`
		} `json:"stats64"`
	}
	if err := json.Unmarshal(out, &links); err != nil || len(links) != 1 {
		return 0, fmt.Errorf("host %d's counters: %q: %v", i, out, err)
	}
	return links[0].Stats.RX.Bytes + links[0].Stats.TX.Bytes, nil
}

// hostsMain runs "fpt bench --scenario hosts": in the parent, the network
// and both runs; in a worker it starts, the worker's side.
func hostsMain(f *flags) int {
	if !f.set("tail") {
		// The median of the second half of the run.
		iters := hostsDefaultIters
		if f.set("iters") {
			iters = f.goodput.iters
		}
		f.lbs.tail = max(1, iters/2)
	}
	lo, code := lbDefaults(f, hostsDefaultIters)
	if code != launch.ExitOK {
		return code
	}
	if !f.set("rate") {
		lo.rate = hostsDefaultRate
	}
	workers, err := parseHostsWorkers(f.hostsWorkers)
	if err != nil {
		return usageError("%v", err)
	}
	if isChild() {
		return runWorker(func(ctx context.Context, w *worker.Worker) error {
			return lbWorker(ctx, w, lo, os.Stdout, os.Stderr)
		})
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	p := newProgress(os.Stderr)
	results := resultWriter{w: os.Stdout, jsonOut: f.goodput.jsonOut, header: hostsHeader}
	spec := netem.HostSpec{Up: lo.rate, Down: lo.rate}
	hosts := make([]netem.HostSpec, len(workers))
	for i := range hosts {
		hosts[i] = spec
	}
	p.printf(scenarioHosts, "building a network of %d hosts at %s (workers per host %s)", len(hosts), lo.rate, joinInts(workers))
	net, err := netem.New(ctx, hosts)
	if err != nil {
		return failed(scenarioHosts, err)
	}
	defer net.Close()
	for _, balance := range []bool{false, true} {
		for _, local := range []bool{false, true} {
			res, err := runHosts(ctx, net, workers, lo, local, balance, p)
			if err != nil {
				return failed(scenarioHosts, err)
			}
			if err := results.add(res); err != nil {
				return failed(scenarioHosts, err)
			}
		}
	}
	if err := results.flush(); err != nil {
		return failed("table", err)
	}
	if err := net.Close(); err != nil {
		return failed(scenarioHosts, err)
	}
	return launch.ExitOK
}

// runHosts runs the scenario's cluster once, local aggregation off or on,
// the LB off or on (balance).
func runHosts(ctx context.Context, net *netem.Network, workers []int, lo lbOptions, local, balance bool, p *progress) (hostsResult, error) {
	mode := onOff(local)
	res := hostsResult{Scenario: scenarioHosts, LocalAggregation: mode, LB: onOff(balance), HostsWorkers: workers, Rate: lo.rate, Iterations: lo.iters}
	for _, n := range lo.trainerOptions().Sizes() {
		res.ModelBytes += int64(n) * 4
	}
	capacity, err := net.Host(0).Capacity()
	if err != nil {
		return res, err
	}
	bound, model, err := hostsModel(workers, capacity, res.ModelBytes, local)
	if err != nil {
		return res, err
	}
	res.BoundMs, res.ModelLinkBytes = ms(bound), model
	self, err := os.Executable()
	if err != nil {
		return res, err
	}
	args := []string{self, "bench", "--scenario", scenarioHosts, "--hosts-workers", joinInts(workers), "--rate", lo.rate,
		"--iters", strconv.Itoa(lo.iters), "--tail", strconv.Itoa(lo.tail), "--tensors", strconv.Itoa(lo.tensors),
		"--min-bytes", strconv.Itoa(lo.minBytes), "--max-bytes", strconv.Itoa(lo.maxBytes), "--compute", lo.compute.String()}
	env := []string{childEnv + "=1", "DMLC_INTERFACE=" + net.Iface(), "FPT_LB=" + res.LB, "FPT_LOCAL_AGGREGATION=" + mode}
	if lo.partitionBytes > 0 {
		env = append(env, "FPT_PARTITION_BYTES="+strconv.FormatInt(lo.partitionBytes, 10))
	}
	before := make([]int64, len(workers))
	for h := range workers {
		if before[h], err = linkBytes(ctx, net, h); err != nil {
			return res, err
		}
	}
	run := fmt.Sprintf("%s %s, local aggregation %s, lb %s", scenarioHosts, joinInts(workers), mode, res.LB)
	p.printf(run, "cluster starting")
	place := hostsPlacement(workers)
	total := 0
	for _, n := range workers {
		total += n
	}
	c, err := runOnHosts(ctx, net, localcluster.Spec{
		Servers: len(workers), Workers: total,
		Scheduler: []string{self}, Server: []string{self}, Worker: args,
		RootURI: net.Addr(0), Env: env,
	}, func(proc string) int { return place[proc] }, p, run, 30*time.Minute)
	if err != nil {
		return res, err
	}
	defer c.Kill()
	rep, err := rank0Report(c, total)
	if err != nil {
		return res, err
	}
	if len(rep.IterMs) != lo.iters || rep.ModelBytes != res.ModelBytes {
		return res, fmt.Errorf("worker 0 reported %d iterations of %d bytes, want %d of %d", len(rep.IterMs), rep.ModelBytes, lo.iters, res.ModelBytes)
	}
	if res.IterMs, err = tailMedian(rep.IterMs, lo.tail); err != nil {
		return res, err
	}
	for h := range workers {
		after, err := linkBytes(ctx, net, h)
		if err != nil {
			return res, err
		}
		// The run's init round and start-up ride on the counters too.
		res.HostLinkBytes = append(res.HostLinkBytes, (after-before[h])/int64(lo.iters))
	}
	for h, b := range res.HostLinkBytes {
		// Headers only add to the payload the model counts (for the even
		// split: the LB's may put less on a host).
		if !balance && b < model[h] {
			return res, fmt.Errorf("host %d's link carried %d bytes per iteration, less than the %d the model's payload needs", h, b, model[h])
		}
	}
	return res, nil
}
