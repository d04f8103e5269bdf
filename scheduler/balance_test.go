package scheduler

import (
	"testing"

	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/node"
)

// The decision line has one owner: what DecisionLine writes,
// ParseDecisionLine reads back, whatever the directive's details.
func TestDecisionLineRoundTrip(t *testing.T) {
	for _, d := range []lb.Directive{
		{Horizon: 9, Decision: &lb.Decision{Version: 1, Iteration: 5,
			Aggregators: []node.ID{node.ServerID(0), node.WorkerID(1)}, Shares: []float64{0.8, 0.2}}, Shaping: true, Reason: "warm-up done"},
		{Decision: &lb.Decision{Version: 42, Iteration: 1 << 40, Aggregators: []node.ID{node.ServerID(3)}, Shares: []float64{1}},
			Probe: true, Reason: "probe every 3"},
		{Decision: &lb.Decision{Version: 7, Iteration: 0}},
	} {
		line := DecisionLine(d)
		v, it, ok := ParseDecisionLine(line)
		if !ok || v != d.Decision.Version || it != d.Decision.Iteration {
			t.Errorf("ParseDecisionLine(%q) = %d, %d, %v; want %d, %d, true", line, v, it, ok, d.Decision.Version, d.Decision.Iteration)
		}
		// As a reader sees it: a line of output, newline and all.
		if v, _, ok := ParseDecisionLine(line + "\n"); !ok || v != d.Decision.Version {
			t.Errorf("ParseDecisionLine(%q + newline) = %d, %v", line, v, ok)
		}
	}
}

func TestParseDecisionLineRejects(t *testing.T) {
	for _, line := range []string{
		"",
		"lb decision",
		"lb decision horizon 9, no change",
		"lb decision v1 from iteration x:",
		"lb decision v1 from iteration 5",
		"lb decision v1 from iteration 5 S0",
		`time=2026-01-01T00:00:00Z level=INFO msg="lb decision" version=1 from_iteration=3`,
		"[scheduler] lb decision v1 from iteration 5: S0 100.0%",
		"fpt: started",
	} {
		if v, it, ok := ParseDecisionLine(line); ok {
			t.Errorf("ParseDecisionLine(%q) = %d, %d, true; want not a decision", line, v, it)
		}
	}
}

// At PS_VERBOSE=0 the decisions writer gets only the decisions that change
// what the job settles on; at 1 every decision.
func TestWriteDecision(t *testing.T) {
	even := lb.Decision{Aggregators: []node.ID{8, 10}, Shares: []float64{0.5, 0.5}}
	skew := lb.Decision{Aggregators: []node.ID{8, 10}, Shares: []float64{0.8, 0.2}}
	drift := lb.Decision{Aggregators: []node.ID{8, 10}, Shares: []float64{0.77, 0.23}}
	others := lb.Decision{Aggregators: []node.ID{8, 9}, Shares: []float64{0.8, 0.2}}
	with := func(d lb.Decision, probe, retry bool, workers ...node.ID) lb.Directive {
		d.Workers = workers
		return lb.Directive{Decision: &d, Probe: probe, Retry: retry}
	}
	seq := []struct {
		name  string
		d     lb.Directive
		quiet bool // written at PS_VERBOSE=0
	}{
		{"the first decision", with(even, false, false), true},
		{"a probe", with(even, true, false), false},
		{"the fall-back to the written split", with(even, false, false), false},
		{"a balanced split", with(skew, false, false), true},
		{"a probe again", with(even, true, false), false},
		{"the same balanced split", with(skew, false, false), false},
		{"a split that drifted a little", with(drift, false, false), false},
		{"a retry on the same split", with(skew, false, true), true},
		{"a worker change on the same split", with(skew, false, false, 9, 11), true},
		{"other aggregators", with(others, false, false), true},
		{"back to even", with(even, false, false), true},
	}
	for _, verbose := range []int{0, 1} {
		c := &core{cfg: config.Config{Verbose: verbose}}
		for _, s := range seq {
			want := s.quiet || verbose >= 1
			if got := c.writeDecision(s.d); got != want {
				t.Errorf("PS_VERBOSE=%d, %s: written %v, want %v", verbose, s.name, got, want)
			}
		}
	}
}
