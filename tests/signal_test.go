package tests

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"
)

// SIGTERM on a worker (a cluster engine preempting it, or scaling the job
// down) is handled as FPT_ON_WORKER_LOSS says: under fail the job ends,
// every other node naming the worker; under continue the others run to
// their end, every value exact.
func TestWorkerSIGTERM(t *testing.T) {
	tests := []struct {
		policy string
		passed int // workers that pass
	}{
		{"fail", 0},
		{"continue", 2},
	}
	for _, tt := range tests {
		t.Run(tt.policy, func(t *testing.T) {
			c := startCluster(t, spec{servers: 2, workers: 3, env: []string{"FPT_ON_WORKER_LOSS=" + tt.policy},
				appArgs: []string{"-iters", "60", "-compute", "20ms", "-max-bytes", "65536", "-classic", "0"}})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			victim := c.proc("worker2")
			if _, err := waitOutput(ctx, victim, regexp.MustCompile(`iteration 5/`)); err != nil {
				c.dump()
				t.Fatal(err)
			}
			if err := victim.Terminate(); err != nil {
				t.Fatal(err)
			}
			if !victim.Wait(30 * time.Second) {
				t.Fatal("the worker still runs 30 s after SIGTERM")
			}
			if victim.ExitCode() == 0 {
				t.Errorf("the worker sent SIGTERM mid-run exited 0")
			}
			passed := 0
			for _, p := range c.Procs {
				if p == victim {
					continue
				}
				if !p.Wait(60 * time.Second) {
					c.dump()
					t.Fatalf("%s still runs 60 s after the worker was sent SIGTERM", p.Name)
				}
				if strings.Contains(p.Stdout.String(), "PASS: 60 iterations") {
					passed++
				}
				switch {
				case tt.passed > 0 && p.ExitCode() != 0:
					t.Errorf("%s exited %d under FPT_ON_WORKER_LOSS=continue:\n%s", p.Name, p.ExitCode(), tail(p.Stderr.String()))
				case tt.passed == 0 && p.ExitCode() == 0:
					t.Errorf("%s exited 0 after a worker's SIGTERM under FPT_ON_WORKER_LOSS=fail", p.Name)
				}
			}
			if passed != tt.passed {
				t.Errorf("%d workers passed, want %d", passed, tt.passed)
			}
		})
	}
}
