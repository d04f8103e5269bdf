package bench

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/fptps/fpt/internal/localcluster"
	"github.com/fptps/fpt/launch"
	"github.com/fptps/fpt/netem"
	"github.com/fptps/fpt/worker"
)

// The channels scenario: one worker and one server, each on its own host
// of a link where one TCP connection gets at most a fraction of the rate
// (netem's per-flow cap), run with one data connection per pair and then
// with several (FPT_CHANNELS); the goodput of each side by side.
const scenarioChannels = "channels"

// Defaults of the channels scenario.
const (
	channelsDefaultRate    = "1gbit"
	channelsDefaultFlowCap = "200mbit"
	channelsDefaultTensor  = 32 << 20
	channelsDefaultIters   = 5
	// channelsNodePort is every node's control port (data: the next):
	// below the ephemeral range, as the per-flow cap needs (netem).
	channelsNodePort = 9000
)

// channelsCounts are the FPT_CHANNELS values the scenario compares.
var channelsCounts = []int{1, 4}

// channelsResult is one run of the channels scenario.
type channelsResult struct {
	Scenario    string  `json:"scenario"`
	Rate        string  `json:"rate"`
	FlowCap     string  `json:"flow_cap"`
	Channels    int     `json:"channels"`
	TensorBytes int64   `json:"tensor_bytes"`
	Iters       int     `json:"iters"`
	GoodputGbps float64 `json:"goodput_gbps"`
	// VsOne is the goodput over the one-channel run's.
	VsOne float64 `json:"vs_one_channel"`
	// Checked says the worker verified the sums it pulled (a run whose
	// sums are wrong fails instead).
	Checked bool `json:"checked"`
}

var channelsHeader = []string{"scenario", "rate", "flow cap", "channels", "tensor", "iters", "goodput Gbit/s", "vs 1 channel", "checked"}

func (r channelsResult) row() []string {
	return []string{r.Scenario, r.Rate, r.FlowCap, strconv.Itoa(r.Channels), sizeText(r.TensorBytes), strconv.Itoa(r.Iters),
		fmt.Sprintf("%.3f", r.GoodputGbps), fmt.Sprintf("%.2f", r.VsOne), strconv.FormatBool(r.Checked)}
}

// channelsMain runs "fpt bench --scenario channels": in the parent, the
// network and one run per channel count; in the worker it starts, the
// goodput bench's worker (which checks the sums).
func channelsMain(f *flags) int {
	o := f.goodput
	if !f.set("tensor-bytes") {
		o.tensorBytes = channelsDefaultTensor
	}
	if !f.set("iters") {
		o.iters = channelsDefaultIters
	}
	if o.iters < 1 || o.tensorBytes < 4 || o.tensorBytes%4 != 0 {
		return usageError("iters must be positive, tensor-bytes a positive multiple of 4")
	}
	if isChild() {
		return runWorker(func(ctx context.Context, w *worker.Worker) error {
			return goodputWorker(ctx, w, o, os.Stdout, os.Stderr)
		})
	}
	rate := channelsDefaultRate
	if f.set("rate") {
		rate = f.scen.rate
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	p := newProgress(os.Stderr)
	spec := netem.HostSpec{Up: rate, Down: rate, FlowCap: f.flowCap}
	// The worker's host, the server's, the scheduler's.
	hosts := []netem.HostSpec{spec, spec, {}}
	p.printf(scenarioChannels, "building a network of %d hosts at %s, %s a connection", len(hosts), rate, f.flowCap)
	net, err := netem.New(ctx, hosts)
	if err != nil {
		return failed(scenarioChannels, err)
	}
	defer net.Close()
	results := resultWriter{w: os.Stdout, jsonOut: o.jsonOut, header: channelsHeader}
	var one float64
	for _, n := range channelsCounts {
		res, err := runChannels(ctx, net, o, rate, f.flowCap, n, p)
		if err != nil {
			return failed(fmt.Sprintf("%s, %d channels", scenarioChannels, n), err)
		}
		if n == 1 {
			one = res.GoodputGbps
		}
		if one > 0 {
			res.VsOne = res.GoodputGbps / one
		}
		p.printf(scenarioChannels, "%d channels: %.3f Gbit/s (x%.2f one channel's)", n, res.GoodputGbps, res.VsOne)
		if err := results.add(res); err != nil {
			return failed("table", err)
		}
	}
	if err := results.flush(); err != nil {
		return failed("table", err)
	}
	if err := net.Close(); err != nil {
		return failed(scenarioChannels, err)
	}
	return launch.ExitOK
}

// runChannels runs the cluster once with n channels per pair.
func runChannels(ctx context.Context, net *netem.Network, o goodputOptions, rate, flowCap string, n int, p *progress) (channelsResult, error) {
	res := channelsResult{Scenario: scenarioChannels, Rate: rate, FlowCap: flowCap, Channels: n, TensorBytes: o.tensorBytes, Iters: o.iters}
	self, err := os.Executable()
	if err != nil {
		return res, err
	}
	args := []string{self, "bench", "--scenario", scenarioChannels,
		"--tensor-bytes", strconv.FormatInt(o.tensorBytes, 10), "--iters", strconv.Itoa(o.iters)}
	env := []string{childEnv + "=1", "DMLC_INTERFACE=" + net.Iface(), "FPT_LB=off",
		"FPT_CHANNELS=" + strconv.Itoa(n), "FPT_NODE_PORT=" + strconv.Itoa(channelsNodePort)}
	if o.partitionBytes > 0 {
		env = append(env, "FPT_PARTITION_BYTES="+strconv.FormatInt(o.partitionBytes, 10))
	}
	run := fmt.Sprintf("%s, %d channels", scenarioChannels, n)
	p.printf(run, "cluster starting")
	hostOf := map[string]int{"worker0": 0, "server0": 1, "scheduler": 2}
	c, err := runOnHosts(ctx, net, localcluster.Spec{
		Servers: 1, Workers: 1,
		Scheduler: []string{self}, Server: []string{self}, Worker: args,
		RootURI: net.Addr(2), Env: env,
	}, func(proc string) int { return hostOf[proc] }, p, run, 30*time.Minute)
	if err != nil {
		return res, err
	}
	defer c.Kill()
	var rep workerReport
	if err := decodeReport(c.Proc("worker0"), &rep); err != nil {
		return res, err
	}
	if rep.Seconds <= 0 || rep.TCPBytes < uint64(2*o.tensorBytes*int64(o.iters)) {
		return res, fmt.Errorf("worker 0 reported %.3f s and %d bytes on TCP, want a positive time and %d bytes at least",
			rep.Seconds, rep.TCPBytes, 2*o.tensorBytes*int64(o.iters))
	}
	if rep.Channels != n {
		return res, fmt.Errorf("worker 0's van has %d connections per peer, want %d (FPT_CHANNELS)", rep.Channels, n)
	}
	// The worker checked its sums, or failed the run.
	res.Checked = true
	res.GoodputGbps = gbps(float64(2*o.tensorBytes*int64(o.iters)), time.Duration(rep.Seconds*float64(time.Second)))
	return res, nil
}
