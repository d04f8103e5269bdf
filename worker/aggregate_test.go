package worker_test

import (
	"context"
	"fmt"
	"io"
	"testing"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/trainer"
	"github.com/fptps/fpt/worker"
)

// Decisions that move tensors between servers and workers, forced at
// chosen iterations on every worker (the LB is off, so nothing else
// decides): every pulled value is checked exactly, across each switch,
// with workers aggregating their own share in place.
func TestWorkerAggregatorsAcrossSwitches(t *testing.T) {
	s0, s1 := uint32(node.ServerID(0)), uint32(node.ServerID(1))
	w0, w1, w2 := uint32(node.WorkerID(0)), uint32(node.WorkerID(1)), uint32(node.WorkerID(2))
	decisions := []lb.Decision{
		{Version: 1, Iteration: 2, Aggregators: []uint32{w0, w1, w2}, Shares: []float64{0.5, 0.3, 0.2}},
		{Version: 2, Iteration: 4, Aggregators: []uint32{s0, w1, s1}, Shares: []float64{0.1, 0.6, 0.3}},
		{Version: 3, Iteration: 5, Aggregators: []uint32{w2}, Shares: []float64{1}},
		{Version: 4, Iteration: 7, Aggregators: []uint32{s0, s1}, Shares: []float64{0.5, 0.5}},
		{Version: 5, Iteration: 8, Aggregators: []uint32{s1, w0, s0, w2, w1}, Shares: []float64{0.2, 0.2, 0.2, 0.2, 0.2}},
	}
	c := mustStart(t, 2, 3, map[string]string{"FPT_LB": "off", "FPT_PARTITION_BYTES": "16384"})
	for _, w := range c.workers {
		for _, d := range decisions {
			if err := w.Follow(lb.Directive{Decision: &d, Shaping: true}); err != nil {
				t.Fatal(err)
			}
		}
	}
	o := trainer.Options{Iterations: 10, Tensors: 6, MinBytes: 4, MaxBytes: 600 << 10, DType: frame.Float32, Classic: 1, Quiet: true}
	err := c.each(func(w *worker.Worker) error {
		_, err := trainer.Run(context.Background(), w, o, io.Discard)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	mustFinish(t, c)
}

// A decision out of sequence is refused: a worker missing one would cut
// tensors differently from the others.
func TestFollowRefusesGaps(t *testing.T) {
	c := mustStart(t, 1, 1, map[string]string{"FPT_LB": "off"})
	w := c.workers[0]
	d := lb.Even(2, 5, []uint32{uint32(node.ServerID(0))})
	if err := w.Follow(lb.Directive{Decision: &d}); err == nil {
		t.Fatal("decision v2 after v0 accepted")
	}
	d = lb.Even(1, 5, []uint32{uint32(node.ServerID(0))})
	if err := w.Follow(lb.Directive{Decision: &d}); err != nil {
		t.Fatal(err)
	}
	mustFinish(t, c)
}

// The LB on, probing again every 2 balanced iterations, so that the
// decision changes every few iterations for 200 iterations, under the race
// detector: every pulled value is checked exactly by the trainer.
func TestSwitchingStressInProcess(t *testing.T) {
	iters := 200
	if testing.Short() {
		iters = 40
	}
	c := mustStart(t, 2, 3, map[string]string{"FPT_LB_PROBE_EVERY": "2", "FPT_PARTITION_BYTES": "8192"})
	o := trainer.Options{Iterations: iters, Tensors: 4, MinBytes: 4, MaxBytes: 300 << 10, DType: frame.Float32, Quiet: true}
	var versions []uint32
	err := c.each(func(w *worker.Worker) error {
		s, err := trainer.Run(context.Background(), w, o, io.Discard)
		if err == nil && s.Iterations != iters {
			err = fmt.Errorf("ran %d iterations", s.Iterations)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range c.workers {
		versions = append(versions, w.DecisionVersion())
	}
	mustFinish(t, c)
	t.Logf("%d decisions in %d iterations", versions[0], iters)
	// Warm-up 2, probe 2, then a probe every 2 balanced iterations: one
	// switch about every 4 to 8 iterations.
	for i, v := range versions {
		if v < uint32(iters/10) {
			t.Errorf("worker %d saw %d decisions in %d iterations; the LB should have switched more often", i, v, iters)
		}
		if v != versions[0] {
			t.Errorf("workers saw different decisions: %v", versions)
		}
	}
}
