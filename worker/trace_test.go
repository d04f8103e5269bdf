package worker_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/node"
)

// The timeline of an in-process cluster whose decisions are forced (the LB
// off): every span carries the decision in force at its iteration, and the
// aggregate spans are on the nodes that decision names, workers included.
func TestInMemoryTraceFollowsDecisions(t *testing.T) {
	s0, s1 := node.ServerID(0), node.ServerID(1)
	w0, w1 := node.WorkerID(0), node.WorkerID(1)
	decisions := forcedDecisions()[:3]
	// in force: iterations 0-1 v0 (servers), 2 v1, 3-4 v2, 5- v3.
	inForce := func(it uint64) lb.Decision {
		d := lb.Even(0, 0, []node.ID{s0, s1})
		for _, x := range decisions {
			if it >= x.Iteration {
				d = x
			}
		}
		return d
	}
	const first, last = 1, 6
	dir := t.TempDir()
	c := startMem(t, 2, 2, map[string]string{"FPT_LB": "off", "FPT_PARTITION_BYTES": memPartitionBytes,
		"FPT_TRACE_FILE": filepath.Join(dir, "{role}{rank}.json"), "FPT_TRACE_ITERS": "1-6"})
	for _, w := range c.Workers {
		for _, d := range decisions {
			if err := w.Follow(lb.Directive{Decision: &d, Shaping: true}); err != nil {
				t.Fatal(err)
			}
		}
	}
	fptRounds(t, c.Workers, 8, hooks{})
	finishMem(t, c)
	c.Close() // the workers' nodes close their trace files

	type span struct {
		Name string `json:"name"`
		Ph   string `json:"ph"`
		Pid  int    `json:"pid"`
		Args struct {
			Iteration uint64 `json:"iteration"`
			Agg       int    `json:"aggregator"`
			LB        uint32 `json:"lb_version"`
		} `json:"args"`
	}
	counts := map[string]int{}
	aggregatedBy := map[uint64]map[int]bool{} // iteration → aggregators seen
	for _, f := range []string{"server0", "server1", "worker0", "worker1"} {
		data, err := os.ReadFile(filepath.Join(dir, f+".json"))
		if err != nil {
			t.Fatal(err)
		}
		var evs []span
		if err := json.Unmarshal(data, &evs); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, e := range evs {
			if e.Ph != "X" {
				continue
			}
			it := e.Args.Iteration
			d := inForce(it)
			if it < first || it > last {
				t.Errorf("%s: %s span of iteration %d, outside the window", f, e.Name, it)
			}
			counts[f+" "+e.Name]++
			if e.Name == "call" || e.Name == "settle" || e.Name == "wait" {
				continue // a request's, not a partition's
			}
			if e.Args.LB != d.Version {
				t.Errorf("%s: %s span of iteration %d says decision v%d; v%d is in force", f, e.Name, it, e.Args.LB, d.Version)
			}
			if !slices.Contains(d.Aggregators, node.ID(e.Args.Agg)) {
				t.Errorf("%s: %s span of iteration %d names aggregator %d, not one of v%d's %v", f, e.Name, it, e.Args.Agg, d.Version, d.Aggregators)
			}
			if e.Name == "aggregate" {
				if aggregatedBy[it] == nil {
					aggregatedBy[it] = map[int]bool{}
				}
				aggregatedBy[it][e.Pid] = true
			}
		}
	}
	// Where a decision gives workers all of it, they record every sum
	// (a small share, like server 0's in v2, may get no partition at all).
	for it, want := range map[uint64][]node.ID{1: {s0, s1}, 2: {w0, w1}, 5: {w0}, 6: {w0}} {
		for _, a := range want {
			if !aggregatedBy[it][int(a)] {
				t.Errorf("iteration %d: no aggregate span on %s, an aggregator of v%d", it, a, inForce(it).Version)
			}
		}
	}
	for _, w := range []string{"worker0", "worker1"} {
		if counts[w+" push"] == 0 || counts[w+" push"] != counts[w+" pull"] {
			t.Errorf("%s: %d push and %d pull spans", w, counts[w+" push"], counts[w+" pull"])
		}
		// Each FPTPush and FPTPull call in the window, and its settling.
		if counts[w+" call"] == 0 || counts[w+" call"] != counts[w+" settle"] {
			t.Errorf("%s: %d call and %d settle spans", w, counts[w+" call"], counts[w+" settle"])
		}
	}
	t.Logf("spans: %v", counts)
}
