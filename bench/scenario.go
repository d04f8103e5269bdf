package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fptps/fpt/internal/localcluster"
	"github.com/fptps/fpt/internal/metricstest"
	"github.com/fptps/fpt/launch"
	"github.com/fptps/fpt/netem"
	"github.com/fptps/fpt/worker"
)

// The scenarios of "fpt bench --scenario": each runs a small cluster in an
// emulated network (package netem), one node per host, the worker's host
// behind a rate-limited link, and prints its result: a table, or one JSON
// line with --json.
const (
	scenarioShaping  = "shaping"
	scenarioPriority = "priority"
)

// scenarioMetricsPort is where every node of a scenario serves its metrics:
// one node per host, so one port does for all.
const scenarioMetricsPort = 9100

// sampleEvery is how often the shaping scenario reads the servers' counters.
const sampleEvery = 100 * time.Millisecond

type scenarioOptions struct {
	name        string
	rate        string     // the worker's link, tc syntax
	weights     [2]float64 // shaping: the worker's weights for server ranks 0 and 1
	tensorBytes int64
	iters       int // shaping: tensors queued at once; priority: rounds
	// partitionBytes is FPT_PARTITION_BYTES: smaller than the default
	// 1 MiB, the pool's shares are exact to within a frame, and a slow
	// link moves few frames a second.
	partitionBytes int64
}

// scenarioPartitionBytes is partitionBytes unless --partition-bytes says.
const scenarioPartitionBytes = 256 << 10

// shapingResult is the shaping scenario's result.
type shapingResult struct {
	Scenario   string     `json:"scenario"`
	Rate       string     `json:"rate"`
	Weights    [2]float64 `json:"weights"`
	ByteRatio  float64    `json:"byte_ratio"`
	WantRatio  float64    `json:"want_ratio"`
	Bytes      [2]uint64  `json:"window_bytes"`
	WindowSecs float64    `json:"window_seconds"`
	Unshaped   float64    `json:"unshaped_byte_ratio"`
}

// priorityResult is the priority scenario's result (medians over rounds).
type priorityResult struct {
	Scenario          string  `json:"scenario"`
	Rate              string  `json:"rate"`
	TensorBytes       int64   `json:"tensor_bytes"`
	Rounds            int     `json:"rounds"`
	HighDoneMs        float64 `json:"high_done_ms"`
	LowDoneMs         float64 `json:"low_done_ms"`
	NoPriorityDoneMs  float64 `json:"nopriority_done_ms"`
	NoPriorityLowMs   float64 `json:"nopriority_low_done_ms"`
	HighFirstInRounds int     `json:"high_first_rounds"`
}

// shapingHeader and row are the shaping scenario's table without --json.
var shapingHeader = []string{"scenario", "rate", "weights", "byte ratio", "want ratio", "unshaped ratio",
	"window s", "server 0 MB", "server 1 MB"}

func (r shapingResult) row() []string {
	return []string{r.Scenario, r.Rate, fmt.Sprintf("%g:%g", r.Weights[0], r.Weights[1]),
		fmt.Sprintf("%.3f", r.ByteRatio), fmt.Sprintf("%.3f", r.WantRatio), fmt.Sprintf("%.3f", r.Unshaped),
		fmt.Sprintf("%.2f", r.WindowSecs), fmt.Sprintf("%.1f", float64(r.Bytes[0])/1e6), fmt.Sprintf("%.1f", float64(r.Bytes[1])/1e6)}
}

// priorityHeader and row are the priority scenario's table without
// --json: when each sum arrived with priorities high and low, then with
// equal ones.
var priorityHeader = []string{"scenario", "rate", "tensor", "rounds", "high ms", "low ms",
	"equal: high ms", "equal: low ms", "high first"}

func (r priorityResult) row() []string {
	return []string{r.Scenario, r.Rate, sizeText(r.TensorBytes), strconv.Itoa(r.Rounds),
		fmt.Sprintf("%.1f", r.HighDoneMs), fmt.Sprintf("%.1f", r.LowDoneMs),
		fmt.Sprintf("%.1f", r.NoPriorityDoneMs), fmt.Sprintf("%.1f", r.NoPriorityLowMs),
		fmt.Sprintf("%d/%d", r.HighFirstInRounds, r.Rounds)}
}

// scenarioLayout places the nodes: host 0 is the worker's (rate-limited),
// then one host per server, then the scheduler's.
func scenarioLayout(o scenarioOptions) (hosts []netem.HostSpec, servers int) {
	servers = 1
	if o.name == scenarioShaping {
		servers = 2
	}
	hosts = []netem.HostSpec{{Up: o.rate, Down: o.rate}}
	for range servers + 1 {
		hosts = append(hosts, netem.HostSpec{})
	}
	return hosts, servers
}

// runScenario builds the emulated network, runs the scenario's cluster in
// it, and returns the worker's result (a *shapingResult or a
// *priorityResult). The network is torn down on every path, Ctrl-C
// included.
func runScenario(o scenarioOptions, p *progress) (tableRow, error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	hosts, servers := scenarioLayout(o)
	p.printf(o.name, "building a network of %d hosts, the worker's at %s", len(hosts), o.rate)
	net, err := netem.New(ctx, hosts)
	if err != nil {
		return nil, err
	}
	defer net.Close()
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	// Processes are named scheduler, server0.., worker0 by localcluster.
	hostOf := map[string]int{"worker0": 0, "scheduler": servers + 1}
	for i := range servers {
		hostOf["server"+strconv.Itoa(i)] = 1 + i
	}
	workerArgs := []string{self, "bench", "--scenario", o.name, "--rate", o.rate,
		"--weights", fmt.Sprintf("%g:%g", o.weights[0], o.weights[1]),
		"--tensor-bytes", strconv.FormatInt(o.tensorBytes, 10), "--iters", strconv.Itoa(o.iters)}
	c, err := runOnHosts(ctx, net, localcluster.Spec{
		Servers: servers, Workers: 1,
		Scheduler: []string{self}, Server: []string{self}, Worker: workerArgs,
		RootURI: net.Addr(servers + 1),
		Env: []string{
			childEnv + "=1",
			"DMLC_INTERFACE=" + net.Iface(),
			"FPT_METRICS_ADDR=:" + strconv.Itoa(scenarioMetricsPort),
			"FPT_PARTITION_BYTES=" + strconv.FormatInt(o.partitionBytes, 10),
		},
	}, func(proc string) int { return hostOf[proc] }, p, o.name, 10*time.Minute)
	if err != nil {
		return nil, err
	}
	defer c.Kill()
	var res tableRow
	switch o.name {
	case scenarioShaping:
		res = new(shapingResult)
	default:
		res = new(priorityResult)
	}
	if err := decodeReport(c.Proc("worker0"), res); err != nil {
		return nil, err
	}
	return res, net.Close()
}

// scenarioWorker is the worker's side of a scenario, run inside the
// emulated network; it reports the result as a JSON line on out (for the
// bench to decode), and progress lines on progressOut.
func scenarioWorker(ctx context.Context, w *worker.Worker, o scenarioOptions, out, progressOut io.Writer) error {
	var (
		res any
		err error
	)
	switch o.name {
	case scenarioShaping:
		res, err = shapingWorker(ctx, w, o, progressOut)
	case scenarioPriority:
		res, err = priorityWorker(ctx, w, o, progressOut)
	default:
		err = fmt.Errorf("unknown scenario %q", o.name)
	}
	if err != nil {
		return err
	}
	return writeJSONLine(out, res)
}

// sample is what the servers had received from workers at one moment.
type sample struct {
	at    time.Time
	bytes [2]float64
}

// shapingWorker queues o.iters tensors at once, each split evenly over the
// two servers, with the van's weights for the servers set to o.weights,
// and reads the servers' received-bytes counters every sampleEvery while
// they drain. The ratio is taken over the window in which both flows were
// backlogged: from 10 % to 85 % of the bytes of the faster one.
func shapingWorker(ctx context.Context, w *worker.Worker, o scenarioOptions, progressOut io.Writer) (shapingResult, error) {
	res := shapingResult{Scenario: scenarioShaping, Rate: o.rate, Weights: o.weights, WantRatio: o.weights[0] / o.weights[1]}
	servers := w.Node().Servers()
	if len(servers) != 2 {
		return res, fmt.Errorf("shaping: %d servers, want 2", len(servers))
	}
	addrs := make([]string, 2)
	for i, id := range servers {
		info, ok := w.Node().Info(id)
		if !ok {
			return res, fmt.Errorf("shaping: no address for server %d", id)
		}
		addrs[i] = info.Host + ":" + strconv.Itoa(scenarioMetricsPort)
	}
	v := w.Node().Van()
	kv := worker.NewKV[float32](w)
	n := int(o.tensorBytes / 4)
	keys := make([]uint64, o.iters)
	for i := range keys {
		keys[i] = uint64(i)
		if err := kv.Declare(keys[i], n, 0); err != nil {
			return res, err
		}
	}
	grads := make([]float32, n*len(keys))
	for i := range grads {
		grads[i] = float32(i % 1021)
	}
	sums := make([]float32, len(grads))
	lens := slices.Repeat([]int{n}, len(keys))
	if err := kv.Init(ctx, keys, sums, lens); err != nil {
		return res, err
	}
	read := func() (sample, error) {
		s := sample{at: time.Now()}
		var wg sync.WaitGroup
		var errs [2]error
		for i, a := range addrs {
			wg.Go(func() {
				f, err := metricstest.Scrape(ctx, a)
				if err != nil {
					errs[i] = err
					return
				}
				s.bytes[i], _ = f.Value("fpt_van_received_bytes_total", map[string]string{"peer_role": "worker"})
			})
		}
		wg.Wait()
		return s, errors.Join(errs[:]...)
	}
	// drain queues every tensor at once (one FPTPush each) and samples the
	// servers until every sum is back: the first sample is taken before the
	// pushes, the last after the sums, which it checks.
	drain := func(shaped bool) ([]sample, error) {
		mode := "unshaped"
		if shaped {
			mode = "shaped"
		}
		v.SetShaping(shaped)
		v.SetWeight(servers[0], o.weights[0])
		v.SetWeight(servers[1], o.weights[1])
		base, err := read()
		if err != nil {
			return nil, err
		}
		samples := []sample{base}
		var reqs []int
		for i := range keys {
			ts, err := kv.FPTPush(keys[i:i+1], grads[i*n:(i+1)*n], nil, 0, nil)
			if err != nil {
				return nil, err
			}
			reqs = append(reqs, ts)
		}
		pull, err := kv.FPTPull(keys, sums, lens, nil)
		if err != nil {
			return nil, err
		}
		pulled := make(chan error, 1)
		go func() { pulled <- kv.Wait(pull) }()
		tick := time.NewTicker(sampleEvery)
		defer tick.Stop()
		said := base.at
		for done := false; !done; {
			select {
			case err := <-pulled:
				if err != nil {
					return nil, err
				}
				done = true
			case <-tick.C:
				s, err := read()
				if err != nil {
					return nil, err
				}
				samples = append(samples, s)
				if s.at.Sub(said) >= time.Second {
					said = s.at
					fmt.Fprintf(progressOut, "%s: the servers received %.1f and %.1f MB, %.1fs\n", mode,
						(s.bytes[0]-base.bytes[0])/1e6, (s.bytes[1]-base.bytes[1])/1e6, s.at.Sub(base.at).Seconds())
				}
			}
		}
		for _, ts := range reqs {
			if err := kv.Wait(ts); err != nil {
				return nil, err
			}
		}
		// One worker: each sum is the value it pushed.
		for i, s := range sums {
			if s != grads[i] {
				return nil, fmt.Errorf("element %d of the pulled sums is %v, want %v", i, s, grads[i])
			}
		}
		final, err := read()
		return append(samples, final), err
	}
	// The same run unshaped first: the baseline the ratio is read against.
	fmt.Fprintf(progressOut, "draining %d tensors (%.1f MB) unshaped\n", len(keys), float64(len(grads)*4)/1e6)
	samples, err := drain(false)
	if err != nil {
		return res, fmt.Errorf("shaping: unshaped run: %w", err)
	}
	unshaped, err := backloggedWindow(samples)
	if err != nil {
		return res, fmt.Errorf("shaping: unshaped run: %w", err)
	}
	fmt.Fprintf(progressOut, "draining them again shaped %g:%g\n", o.weights[0], o.weights[1])
	if samples, err = drain(true); err != nil {
		return res, fmt.Errorf("shaping: shaped run: %w", err)
	}
	shaped, err := backloggedWindow(samples)
	if err != nil {
		return res, fmt.Errorf("shaping: shaped run: %w", err)
	}
	res.Unshaped, res.ByteRatio, res.WindowSecs = unshaped.ratio, shaped.ratio, shaped.length.Seconds()
	res.Bytes = [2]uint64{uint64(shaped.bytes[0]), uint64(shaped.bytes[1])}
	return res, nil
}

// window is what two flows delivered over part of a run.
type window struct {
	ratio  float64    // bytes[0] / bytes[1]
	bytes  [2]float64 // delivered in the window
	length time.Duration
}

// backloggedWindow picks, from samples taken while two flows drained (the
// first before anything was sent, the last after everything arrived), the
// window in which both were still sending: from the first sample where the
// flow that ends first had 10 % of its bytes to the last where it had at
// most 85 %.
func backloggedWindow(samples []sample) (window, error) {
	if len(samples) < 2 {
		return window{}, errors.New("fewer than two samples")
	}
	base, final := samples[0], samples[len(samples)-1]
	var total [2]float64
	for i := range total {
		total[i] = final.bytes[i] - base.bytes[i]
	}
	frac := func(s sample, flow int) float64 { return (s.bytes[flow] - base.bytes[flow]) / total[flow] }
	// The flow that finishes first reaches 85 % of its total first.
	first := 0
	for _, s := range samples {
		if f0, f1 := frac(s, 0), frac(s, 1); f0 >= 0.85 || f1 >= 0.85 {
			if f1 > f0 {
				first = 1
			}
			break
		}
	}
	from, to := -1, -1
	for i, s := range samples {
		f := frac(s, first)
		if from < 0 && f >= 0.10 {
			from = i
		}
		if f <= 0.85 {
			to = i
		}
	}
	if from < 0 || to <= from {
		return window{}, fmt.Errorf("too few samples in the backlogged window (%d samples over %v): queue more bytes (--iters, --tensor-bytes) or lower --rate",
			len(samples), final.at.Sub(base.at).Round(time.Millisecond))
	}
	w := window{length: samples[to].at.Sub(samples[from].at)}
	for i := range w.bytes {
		w.bytes[i] = samples[to].bytes[i] - samples[from].bytes[i]
	}
	if w.bytes[1] <= 0 {
		return w, errors.New("the second server received nothing in the window")
	}
	w.ratio = w.bytes[0] / w.bytes[1]
	return w, nil
}

// priorityWorker pushes a low- and a high-priority tensor of equal size at
// the same moment (low first) and times, from then, when each one's sum
// arrives; then the same two with equal priorities. Medians over o.iters
// rounds.
func priorityWorker(ctx context.Context, w *worker.Worker, o scenarioOptions, progressOut io.Writer) (priorityResult, error) {
	res := priorityResult{Scenario: scenarioPriority, Rate: o.rate, TensorBytes: o.tensorBytes, Rounds: o.iters}
	kv := worker.NewKV[float32](w)
	n := int(o.tensorBytes / 4)
	const low, high = 0, 1
	keys := []uint64{low, high}
	for _, k := range keys {
		if err := kv.Declare(k, n, 0); err != nil {
			return res, err
		}
	}
	vals := make([]float32, 2*n)
	for i := range vals {
		vals[i] = float32(i % 509)
	}
	sums := make([]float32, 2*n)
	lens := []int{n, n}
	if err := kv.Init(ctx, keys, sums, lens); err != nil {
		return res, err
	}
	// round pushes low then high with the given priorities and returns
	// when each sum had arrived, counted from the first push.
	round := func(lowPrio, highPrio int32) (lowDone, highDone time.Duration, err error) {
		var mu sync.Mutex
		start := time.Now()
		var pushes []int
		for i, p := range []int32{lowPrio, highPrio} {
			ts, err := kv.FPTPush(keys[i:i+1], vals[i*n:(i+1)*n], nil, p, nil)
			if err != nil {
				return 0, 0, err
			}
			pushes = append(pushes, ts)
		}
		var pulls []int
		for i, done := range []*time.Duration{&lowDone, &highDone} {
			ts, err := kv.FPTPull(keys[i:i+1], sums[i*n:(i+1)*n], nil, func(error) {
				mu.Lock()
				*done = time.Since(start)
				mu.Unlock()
			})
			if err != nil {
				return 0, 0, err
			}
			pulls = append(pulls, ts)
		}
		for _, ts := range append(pushes, pulls...) {
			if err := kv.Wait(ts); err != nil {
				return 0, 0, err
			}
		}
		for i, s := range sums {
			if s != vals[i] {
				return 0, 0, fmt.Errorf("priority: element %d of the sums is %v, want %v", i, s, vals[i])
			}
		}
		mu.Lock()
		defer mu.Unlock()
		return lowDone, highDone, nil
	}
	var highs, lows, noprio, noprioLow []float64
	start := time.Now()
	for i := range o.iters {
		fmt.Fprintf(progressOut, "round %d/%d, %.1fs\n", i+1, o.iters, time.Since(start).Seconds())
		l, h, err := round(0, 100)
		if err != nil {
			return res, err
		}
		if h < l {
			res.HighFirstInRounds++
		}
		lows, highs = append(lows, ms(l)), append(highs, ms(h))
		l, h, err = round(0, 0)
		if err != nil {
			return res, err
		}
		noprioLow, noprio = append(noprioLow, ms(l)), append(noprio, ms(h))
	}
	res.HighDoneMs, res.LowDoneMs = median(highs), median(lows)
	res.NoPriorityDoneMs, res.NoPriorityLowMs = median(noprio), median(noprioLow)
	return res, nil
}

// scenarioMain runs "fpt bench --scenario shaping|priority": in the
// parent, the emulated network and the cluster; in the bench's worker
// process, the scenario's worker. --tensor-bytes and --iters get the
// scenario's own defaults unless given. The result is a table, or one
// JSON line with --json.
func scenarioMain(f *flags) int {
	so := f.scen
	switch so.name {
	case scenarioShaping:
		so.tensorBytes, so.iters = 16<<20, 6
	case scenarioPriority:
		so.tensorBytes, so.iters = 16<<20, 3
	default:
		return usageError("unknown scenario %q (want %s, %s, %s, %s, %s, %s or %s)", so.name, scenarioShaping, scenarioPriority,
			strings.Join(lbScenarios, ", "), scenarioServerLoss, scenarioServerJoin, scenarioWorkerWait, scenarioFailover)
	}
	if f.set("tensor-bytes") {
		so.tensorBytes = f.goodput.tensorBytes
	}
	if f.set("iters") {
		so.iters = f.goodput.iters
	}
	so.partitionBytes = scenarioPartitionBytes
	if f.goodput.partitionBytes > 0 {
		so.partitionBytes = f.goodput.partitionBytes
	}
	if so.tensorBytes < 4 || so.tensorBytes%4 != 0 || so.iters < 1 {
		return usageError("--tensor-bytes %d, --iters %d: want a positive multiple of 4 and a positive count", so.tensorBytes, so.iters)
	}
	w0, w1, ok := strings.Cut(f.weights, ":")
	var err0, err1 error
	so.weights[0], err0 = strconv.ParseFloat(w0, 64)
	so.weights[1], err1 = strconv.ParseFloat(w1, 64)
	if !ok || err0 != nil || err1 != nil || !(so.weights[0] > 0) || !(so.weights[1] > 0) {
		return usageError("--weights %q: want two positive numbers, as 3:1", f.weights)
	}
	if _, err := netem.ParseHostSpec(so.rate); err != nil || strings.Contains(so.rate, "/") {
		return usageError("--rate %q: want one tc rate, as 200mbit", so.rate)
	}
	if isChild() {
		return runWorker(func(ctx context.Context, w *worker.Worker) error {
			return scenarioWorker(ctx, w, so, os.Stdout, marked(os.Stderr))
		})
	}
	res, err := runScenario(so, newProgress(os.Stderr))
	if err != nil {
		return failed(so.name, err)
	}
	header := shapingHeader
	if so.name == scenarioPriority {
		header = priorityHeader
	}
	results := resultWriter{w: os.Stdout, jsonOut: f.goodput.jsonOut, header: header, plot: f.plot}
	if err := results.add(res); err != nil {
		return failed(so.name, err)
	}
	if err := results.flush(); err != nil {
		return failed("table", err)
	}
	return launch.ExitOK
}
