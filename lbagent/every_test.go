package lbagent

import (
	"testing"
	"time"

	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/node"
)

// Under a retry policy every iteration is reported at once: a worker's
// pull may wait for the LB's Done past its iteration, which the pace
// would hold back by up to ReportEvery per step (and for ever, for the
// last step before the wait). Otherwise a server reports once per
// ServerReportEvery, a worker once per half of its FPT_LB_AHEAD (the
// horizon a report earns covers that much), at least ReportEvery
// (outside a probe).
func TestReportEvery(t *testing.T) {
	tests := []struct {
		name string
		cfg  config.Config
		want time.Duration
	}{
		{"fail", config.Config{LB: true, Role: node.Worker, LBAhead: config.DefaultLBAhead}, config.DefaultLBAhead / 2},
		{"fail, FPT_LB_AHEAD=0.04", config.Config{LB: true, Role: node.Worker, LBAhead: 40 * time.Millisecond}, 20 * time.Millisecond},
		{"fail, FPT_LB_AHEAD=0.004", config.Config{LB: true, Role: node.Worker, LBAhead: 4 * time.Millisecond}, ReportEvery},
		{"fail, FPT_LB_AHEAD=0", config.Config{LB: true, Role: node.Worker}, ReportEvery},
		{"fail, a server", config.Config{LB: true, Role: node.Server}, ServerReportEvery},
		{"workers continue", config.Config{LB: true, Role: node.Worker, WorkerLoss: config.WorkerLossContinue, LBAhead: config.DefaultLBAhead}, 0},
		{"workers continue, a server", config.Config{LB: true, Role: node.Server, WorkerLoss: config.WorkerLossContinue}, 0},
		{"workers wait", config.Config{Role: node.Worker, WorkerLoss: config.WorkerLossWait}, 0},
		{"servers retry", config.Config{LB: true, Role: node.Worker, RetryServerLoss: true}, 0},
		{"servers retry, a server", config.Config{LB: true, Role: node.Server, RetryServerLoss: true}, 0},
	}
	for _, tt := range tests {
		if got := reportEvery(tt.cfg); got != tt.want {
			t.Errorf("%s: reports every %v; want %v", tt.name, got, tt.want)
		}
	}
}
