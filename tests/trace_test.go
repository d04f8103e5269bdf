package tests

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// traceEvent is what the test reads of a Chrome trace event.
type traceEvent struct {
	Name string   `json:"name"`
	Ph   string   `json:"ph"`
	Pid  *int     `json:"pid"`
	Tid  *int     `json:"tid"`
	Ts   *float64 `json:"ts"`
	Dur  *float64 `json:"dur"`
	Args struct {
		Key       *uint64 `json:"key"`
		Partition uint32  `json:"partition"`
		Iteration uint64  `json:"iteration"`
		Bytes     uint64  `json:"bytes"`
		Agg       int     `json:"aggregator"`
		LB        *uint32 `json:"lb_version"`
		Clock     string  `json:"fpt_clock"`
	} `json:"args"`
}

// readTrace parses a trace file strictly (a whole JSON array) and checks
// the fields every event must have.
func readTrace(t *testing.T, path string) []traceEvent {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var evs []traceEvent
	if err := json.Unmarshal(data, &evs); err != nil {
		t.Fatalf("%s is not a Chrome trace (JSON array): %v", path, err)
	}
	for i, e := range evs {
		if e.Name == "" || e.Ph == "" || e.Pid == nil || e.Tid == nil {
			t.Fatalf("%s: event %d lacks name, ph, pid or tid: %+v", path, i, e)
		}
		if e.Ph == "X" && (e.Ts == nil || e.Dur == nil || *e.Dur < 0 || e.Args.Key == nil || e.Args.LB == nil && !perRequest(e.Name)) {
			t.Fatalf("%s: span %d lacks ts, dur, key or lb_version: %+v", path, i, e)
		}
	}
	return evs
}

// perRequest reports whether a span is an FPTPush's or FPTPull's (call,
// settle, wait), not a partition's.
func perRequest(name string) bool { return name == "call" || name == "settle" || name == "wait" }

type partIter struct {
	key  uint64
	part uint32
	iter uint64
}

// TestTraceTimeline runs 2 servers and 2 workers with FPT_TRACE_FILE and
// FPT_TRACE_ITERS on every node: each worker's file has a push and a pull
// span for every partition of every traced iteration, exactly one
// aggregator (server or worker) has its aggregate span, nothing outside
// the window is traced, and on the merged file each partition's spans come
// in causal order: push start ≤ aggregate end ≤ pull end.
func TestTraceTimeline(t *testing.T) {
	const tensors, first, last = 4, 2, 5
	dir := t.TempDir()
	c := startCluster(t, spec{servers: 2, workers: 2,
		env: []string{"FPT_TRACE_FILE=" + filepath.Join(dir, "{role}{rank}.json"),
			fmt.Sprintf("FPT_TRACE_ITERS=%d-%d", first, last), "FPT_PARTITION_BYTES=262144"},
		appArgs: []string{"-iters", "7", "-tensors", fmt.Sprint(tensors), "-max-bytes", "1048576", "-quiet"}})
	c.waitAll(2 * time.Minute)

	files := []string{"server0", "server1", "worker0", "worker1"}
	type spanKey struct {
		pid   int
		phase string
		p     partIter
	}
	spans := make(map[spanKey]traceEvent)
	perFile := 0
	var paths []string
	workerPids := map[int]bool{}
	requests := map[string]int{} // file and per-request phase → spans
	for _, f := range files {
		path := filepath.Join(dir, f+".json")
		paths = append(paths, path)
		evs := readTrace(t, path)
		clock := ""
		for _, e := range evs {
			if e.Ph == "M" && e.Name == "process_name" {
				clock = e.Args.Clock
				if strings.HasPrefix(f, "worker") {
					workerPids[*e.Pid] = true
				}
			}
			if e.Ph != "X" {
				continue
			}
			if perRequest(e.Name) {
				requests[f+" "+e.Name]++
				continue
			}
			perFile++
			if it := e.Args.Iteration; it < first || it > last {
				t.Errorf("%s: span of iteration %d, outside FPT_TRACE_ITERS", f, it)
			}
			k := spanKey{*e.Pid, e.Name, partIter{*e.Args.Key, e.Args.Partition, e.Args.Iteration}}
			if _, dup := spans[k]; dup {
				t.Errorf("%s: two %s spans of %+v", f, e.Name, k.p)
			}
			spans[k] = e
		}
		if clock != "unix_us" {
			t.Errorf("%s: clock metadata %q, want unix_us", f, clock)
		}
	}
	if len(workerPids) != 2 {
		t.Fatalf("worker pids %v", workerPids)
	}
	// The partitions every aggregator summed, and by whom.
	aggOf := map[partIter]int{}
	for k := range spans {
		if k.phase == "aggregate" {
			if prev, ok := aggOf[k.p]; ok {
				t.Errorf("%+v aggregated by both %d and %d", k.p, prev, k.pid)
			}
			aggOf[k.p] = k.pid
		}
	}
	// Every (key, iteration) has partitions 0..n-1, every tensor every
	// traced iteration.
	parts := map[[2]uint64]int{}
	for p := range aggOf {
		parts[[2]uint64{p.key, p.iter}]++
	}
	if len(parts) != tensors*(last-first+1) {
		t.Errorf("%d (tensor, iteration) pairs aggregated, want %d", len(parts), tensors*(last-first+1))
	}
	for p := range aggOf {
		if int(p.part) >= parts[[2]uint64{p.key, p.iter}] {
			t.Errorf("key %d iteration %d: partition %d of %d: some are missing", p.key, p.iter, p.part, parts[[2]uint64{p.key, p.iter}])
		}
	}
	// Each worker pushed and pulled each partition, to and from its aggregator.
	multi := false
	for p, agg := range aggOf {
		multi = multi || p.part > 0
		for pid := range workerPids {
			push, ok1 := spans[spanKey{pid, "push", p}]
			pull, ok2 := spans[spanKey{pid, "pull", p}]
			if !ok1 || !ok2 {
				t.Errorf("worker pid %d: push %v, pull %v of %+v", pid, ok1, ok2, p)
				continue
			}
			if push.Args.Agg != agg || pull.Args.Agg != agg {
				t.Errorf("%+v: aggregated by %d, pushed to %d, pulled from %d", p, agg, push.Args.Agg, pull.Args.Agg)
			}
		}
	}
	if !multi {
		t.Error("no tensor had more than one partition: the test checks less than it should")
	}
	if n := len(aggOf) * (1 + 2*len(workerPids)); n != len(spans) {
		t.Errorf("%d spans, want %d (an aggregate and each worker's push and pull of %d partitions)", len(spans), n, len(aggOf))
	}

	// The merged file holds the union, on which causality holds.
	out := filepath.Join(dir, "merged.json")
	cmd := exec.Command(bin.fpt, append([]string{"trace", "merge", out}, paths...)...)
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("fpt trace merge: %v\n%s", err, msg)
	} else {
		t.Logf("%s", msg)
	}
	merged := map[spanKey]traceEvent{}
	for _, e := range readTrace(t, out) {
		if e.Ph == "X" && !perRequest(e.Name) {
			merged[spanKey{*e.Pid, e.Name, partIter{*e.Args.Key, e.Args.Partition, e.Args.Iteration}}] = e
		}
	}
	if len(merged) != len(spans) || perFile != len(spans) {
		t.Errorf("merged file has %d spans, the files %d", len(merged), perFile)
	}
	end := func(e traceEvent) float64 { return *e.Ts + *e.Dur }
	for p, agg := range aggOf {
		a := merged[spanKey{agg, "aggregate", p}]
		for pid := range workerPids {
			push, pull := merged[spanKey{pid, "push", p}], merged[spanKey{pid, "pull", p}]
			if push.Ts == nil || pull.Ts == nil || a.Ts == nil {
				t.Fatalf("%+v missing from the merged file", p)
			}
			if !(*push.Ts <= end(a) && end(a) <= end(pull)) {
				t.Errorf("%+v on worker pid %d: push at %v, aggregate ends %v, pull ends %v: not in causal order", p, pid, *push.Ts, end(a), end(pull))
			}
		}
	}
	// Every traced iteration's calls settled, and the breakdown reads
	// worker 0's steps from the files.
	for _, w := range []string{"worker0", "worker1"} {
		if n := requests[w+" call"]; n == 0 || n != requests[w+" settle"] {
			t.Errorf("%s: %d call and %d settle spans", w, n, requests[w+" settle"])
		}
	}
	msg, err := exec.Command(bin.fpt, append([]string{"trace", "breakdown", "-json"}, paths...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("fpt trace breakdown: %v\n%s", err, msg)
	}
	var b struct {
		Steps []struct {
			Iteration uint64 `json:"iteration"`
		} `json:"steps"`
	}
	if err := json.Unmarshal(msg, &b); err != nil || len(b.Steps) != last-first+1 || b.Steps[0].Iteration != first {
		t.Errorf("fpt trace breakdown: %v; want iterations %d-%d:\n%s", err, first, last, msg)
	}
	if info, err := os.Stat(out); err == nil {
		t.Logf("%d partitions × %d iterations traced; merged trace %d bytes", len(aggOf)/(last-first+1), last-first+1, info.Size())
	}
}
