package trace

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
)

// StepSpan is the name of the span a training program records around one
// step's exchange (examples/pytorch/exchange.py --breakdown writes them), in a
// file of its own whose process_name arguments give node_id, the worker it
// ran on, and an args.iteration per span.
const StepSpan = "step"

// Segment names the stretches of a step's critical path, in order: each
// runs from the previous one's end to the latest of its own events, so
// that they add up to the step.
var Segment = []string{
	"python to library",         // step begun → the first call entered the worker
	"calls (push, pull)",        // → the last FPTPush/FPTPull call returned
	"own push: pool, sender",    // → the worker's last frame written
	"other workers' pushes",     // → every worker's last frame written
	"aggregation: receive, sum", // → the last sum complete on its aggregator
	"result: send, receive",     // → the last sum's frame header arrived
	"pull: landing",             // → its bytes landed in the pull buffer
	"settle: completion found",  // → the last request found done
	"settle: callback, release", // → its waiters released, callback returned
	"wait: wake-up",             // → the last Wait returned
	"return to python",          // → the step ended
}

// StepBreakdown is one iteration's critical path on one worker, in
// microseconds per Segment (-1: the events to measure it were not
// recorded).
type StepBreakdown struct {
	Iteration uint64  `json:"iteration"`
	Segments  []int64 `json:"segments_us"`
	Total     int64   `json:"total_us"`
}

// Breakdown is what "fpt trace breakdown" prints: every traced step of one
// worker, and the median and 90th percentile of each segment.
type Breakdown struct {
	Worker   uint32          `json:"worker"`
	Segments []string        `json:"segments"`
	Steps    []StepBreakdown `json:"steps"`
	Median   []int64         `json:"median_us"`
	P90      []int64         `json:"p90_us"`
	// MedianTotal and P90Total are of the steps' totals.
	MedianTotal int64 `json:"median_total_us"`
	P90Total    int64 `json:"p90_total_us"`
	// Aggregate, PushSpan and PullSpan are the median durations of those
	// spans (all nodes for aggregations, the worker's own otherwise),
	// which overlap the critical path's segments.
	Aggregate int64 `json:"median_aggregate_span_us"`
	PushSpan  int64 `json:"median_push_span_us"`
	PullSpan  int64 `json:"median_pull_span_us"`
}

// bdEvent is what the breakdown reads of an event.
type bdEvent struct {
	Name string   `json:"name"`
	Ph   string   `json:"ph"`
	Pid  int64    `json:"pid"`
	Ts   *float64 `json:"ts"`
	Dur  float64  `json:"dur"`
	Args struct {
		Iteration *uint64 `json:"iteration"`
		Role      string  `json:"role"`
		NodeID    *int64  `json:"node_id"`
	} `json:"args"`
}

// instants are the latest (or, for first, earliest) times of one
// iteration's events that the critical path runs through.
type instants struct {
	stepStart, firstCall, lastCall, ownPush, allPush, aggregated float64
	pullStart, pullEnd, settleStart, settleEnd, waitEnd, stepEnd float64
}

// Analyze computes the breakdown of worker (a node id; 0: the worker a
// step file names, or else the worker of lowest id) from trace files
// (each node's, or one merged file). Only iterations with the worker's
// Call spans count; the init round (0) is left out.
func Analyze(inputs []Input, worker uint32) (Breakdown, error) {
	var evs []bdEvent
	roles := make(map[int64]string)
	stepNode := int64(-1)
	for _, in := range inputs {
		raws, err := parseEvents(in.Data)
		if err != nil {
			return Breakdown{}, fmt.Errorf("trace breakdown: %s: %w", in.Name, err)
		}
		for i, raw := range raws {
			var e bdEvent
			if err := json.Unmarshal(raw, &e); err != nil {
				return Breakdown{}, fmt.Errorf("trace breakdown: %s: event %d: %w", in.Name, i, err)
			}
			if e.Ph == "M" && e.Name == "process_name" {
				roles[e.Pid] = e.Args.Role
				if e.Args.Role == "step" && e.Args.NodeID != nil && stepNode < 0 {
					stepNode = *e.Args.NodeID
				}
				continue
			}
			if e.Ph == "X" && e.Ts != nil && e.Args.Iteration != nil && *e.Args.Iteration > 0 {
				evs = append(evs, e)
			}
		}
	}
	w := int64(worker)
	if w == 0 {
		w = stepNode
	}
	if w <= 0 {
		for pid, r := range roles {
			if r == "worker" && (w <= 0 || pid < w) {
				w = pid
			}
		}
	}
	if w <= 0 {
		return Breakdown{}, errors.New("trace breakdown: no worker's trace among the files")
	}
	stepOf := func(pid int64) bool { return roles[pid] == "step" }
	its := make(map[uint64]*instants)
	get := func(it uint64) *instants {
		if p := its[it]; p != nil {
			return p
		}
		p := &instants{stepStart: -1, firstCall: math.Inf(1)}
		for _, f := range []*float64{&p.lastCall, &p.ownPush, &p.allPush, &p.aggregated, &p.pullStart,
			&p.pullEnd, &p.settleStart, &p.settleEnd, &p.waitEnd, &p.stepEnd} {
			*f = -1
		}
		its[it] = p
		return p
	}
	late := func(f *float64, t float64) { *f = max(*f, t) }
	var aggs, pushes, pulls []float64
	for _, e := range evs {
		it, start := *e.Args.Iteration, *e.Ts
		end := start + e.Dur
		own := e.Pid == w
		switch {
		case e.Name == StepSpan && stepOf(e.Pid):
			p := get(it)
			p.stepStart, p.stepEnd = start, end
		case e.Name == "aggregate":
			late(&get(it).aggregated, end)
			aggs = append(aggs, e.Dur)
		case e.Name == "push" && roles[e.Pid] == "worker":
			late(&get(it).allPush, end)
			if own {
				late(&get(it).ownPush, end)
				pushes = append(pushes, e.Dur)
			}
		case !own:
		case e.Name == "pull":
			p := get(it)
			late(&p.pullStart, start)
			late(&p.pullEnd, end)
			pulls = append(pulls, e.Dur)
		case e.Name == "call":
			p := get(it)
			p.firstCall = min(p.firstCall, start)
			late(&p.lastCall, end)
		case e.Name == "settle":
			p := get(it)
			late(&p.settleStart, start)
			late(&p.settleEnd, end)
		case e.Name == "wait":
			late(&get(it).waitEnd, end)
		}
	}
	b := Breakdown{Worker: uint32(w), Segments: Segment}
	keys := make([]uint64, 0, len(its))
	for it, p := range its {
		if !math.IsInf(p.firstCall, 1) {
			keys = append(keys, it)
		}
	}
	slices.Sort(keys)
	for _, it := range keys {
		p := its[it]
		marks := []float64{p.firstCall, p.lastCall, p.ownPush, p.allPush, p.aggregated, p.pullStart,
			p.pullEnd, p.settleStart, p.settleEnd, p.waitEnd, p.stepEnd}
		s := StepBreakdown{Iteration: it, Segments: make([]int64, len(Segment))}
		begin := p.stepStart
		if begin < 0 {
			begin = p.firstCall
		}
		from := begin
		for i, m := range marks {
			if m < 0 || i == 0 && p.stepStart < 0 {
				s.Segments[i] = -1
				continue
			}
			s.Segments[i] = round(max(m-from, 0))
			from = max(from, m)
		}
		s.Total = round(from - begin)
		b.Steps = append(b.Steps, s)
	}
	if len(b.Steps) == 0 {
		return b, fmt.Errorf("trace breakdown: no traced FPTPush/FPTPull call of worker %d (is its trace file among the inputs, FPT_TRACE_FILE set on it?)", w)
	}
	b.Median, b.P90 = make([]int64, len(Segment)), make([]int64, len(Segment))
	for i := range Segment {
		var xs []float64
		for _, s := range b.Steps {
			if s.Segments[i] >= 0 {
				xs = append(xs, float64(s.Segments[i]))
			}
		}
		b.Median[i], b.P90[i] = quantile(xs, 0.5), quantile(xs, 0.9)
	}
	totals := make([]float64, len(b.Steps))
	for i, s := range b.Steps {
		totals[i] = float64(s.Total)
	}
	b.MedianTotal, b.P90Total = quantile(totals, 0.5), quantile(totals, 0.9)
	b.Aggregate, b.PushSpan, b.PullSpan = quantile(aggs, 0.5), quantile(pushes, 0.5), quantile(pulls, 0.5)
	return b, nil
}

func round(us float64) int64 { return int64(math.Round(us)) }

// quantile is the q-quantile of xs (the nearest rank below), -1 if empty.
func quantile(xs []float64, q float64) int64 {
	if len(xs) == 0 {
		return -1
	}
	ys := slices.Clone(xs)
	sort.Float64s(ys)
	return round(ys[min(len(ys)-1, int(q*float64(len(ys))))])
}

// Print writes b as a table: one row per segment, median and p90 in
// microseconds.
func (b Breakdown) Print(w io.Writer) {
	fmt.Fprintf(w, "worker %d, %d steps: critical path of a step (µs)\n", b.Worker, len(b.Steps))
	fmt.Fprintf(w, "%-28s %8s %8s\n", "segment", "median", "p90")
	for i, name := range b.Segments {
		if b.Median[i] < 0 {
			fmt.Fprintf(w, "%-28s %8s %8s\n", name, "-", "-")
			continue
		}
		fmt.Fprintf(w, "%-28s %8d %8d\n", name, b.Median[i], b.P90[i])
	}
	fmt.Fprintf(w, "%-28s %8d %8d\n", "step (total)", b.MedianTotal, b.P90Total)
	fmt.Fprintf(w, "overlapping spans (median): push %d, aggregate %d, pull %d\n", b.PushSpan, b.Aggregate, b.PullSpan)
}
