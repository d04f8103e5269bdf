package lbagent

import (
	"testing"
	"time"

	"github.com/fptps/fpt/config"
)

// Under a retry policy every iteration is reported at once: a worker's
// pull may wait for the LB's Done past its iteration, which the pace
// would hold back by up to ReportEvery per step (and for ever, for the
// last step before the wait).
func TestReportEvery(t *testing.T) {
	tests := []struct {
		name string
		cfg  config.Config
		want time.Duration
	}{
		{"fail", config.Config{LB: true}, ReportEvery},
		{"workers continue", config.Config{LB: true, WorkerLoss: config.WorkerLossContinue}, 0},
		{"workers wait", config.Config{WorkerLoss: config.WorkerLossWait}, 0},
		{"servers retry", config.Config{LB: true, RetryServerLoss: true}, 0},
	}
	for _, tt := range tests {
		if got := reportEvery(tt.cfg); got != tt.want {
			t.Errorf("%s: reports every %v; want %v", tt.name, got, tt.want)
		}
	}
}
