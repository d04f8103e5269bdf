package worker_test

import (
	"testing"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/trainer"
)

// Decisions that move tensors between servers and workers, forced at
// chosen iterations on every worker (the LB is off, so nothing else
// decides): every pulled value is checked exactly, across each switch,
// with workers aggregating their own share in place.
func TestWorkerAggregatorsAcrossSwitches(t *testing.T) {
	s0, s1 := node.ServerID(0), node.ServerID(1)
	w0, w1, w2 := node.WorkerID(0), node.WorkerID(1), node.WorkerID(2)
	decisions := []lb.Decision{
		{Version: 1, Iteration: 2, Aggregators: []node.ID{w0, w1, w2}, Shares: []float64{0.5, 0.3, 0.2}},
		{Version: 2, Iteration: 4, Aggregators: []node.ID{s0, w1, s1}, Shares: []float64{0.1, 0.6, 0.3}},
		{Version: 3, Iteration: 5, Aggregators: []node.ID{w2}, Shares: []float64{1}},
		{Version: 4, Iteration: 7, Aggregators: []node.ID{s0, s1}, Shares: []float64{0.5, 0.5}},
		{Version: 5, Iteration: 8, Aggregators: []node.ID{s1, w0, s0, w2, w1}, Shares: []float64{0.2, 0.2, 0.2, 0.2, 0.2}},
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
	c.train(t, o)
	mustFinish(t, c)
}

// A decision out of sequence is refused: a worker missing one would cut
// tensors differently from the others.
func TestFollowRefusesGaps(t *testing.T) {
	c := mustStart(t, 1, 1, map[string]string{"FPT_LB": "off"})
	w := c.workers[0]
	d := lb.Even(2, 5, []node.ID{node.ServerID(0)})
	if err := w.Follow(lb.Directive{Decision: &d}); err == nil {
		t.Fatal("decision v2 after v0 accepted")
	}
	d = lb.Even(1, 5, []node.ID{node.ServerID(0)})
	if err := w.Follow(lb.Directive{Decision: &d}); err != nil {
		t.Fatal(err)
	}
	mustFinish(t, c)
}
