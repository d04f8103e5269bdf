package scheduler

import (
	"testing"

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
