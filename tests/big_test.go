//go:build !race

package tests

import (
	"testing"
	"time"
)

// One tensor larger than 2 GiB through a real cluster, every value
// checked: lengths and offsets are 64-bit end to end. Too big for the race
// detector's memory and time; scripts/test.sh runs it in its own step.
func TestBigTensorOver2GiB(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 9 GiB and needs about 8 GiB of memory; run without -short")
	}
	// 2 GiB + 64 MiB = 2214592512 bytes.
	c := startCluster(t, spec{servers: 1, workers: 1, appArgs: []string{
		"-tensors", "1", "-min-bytes", "2214592512", "-max-bytes", "2214592512", "-iters", "1", "-classic", "0",
	}})
	c.waitAll(10 * time.Minute)
	mustContain(t, "worker0 stdout", c.proc("worker0").Stdout.String(), "2.06 GiB", "iteration 1/1 verified", "PASS")
}
