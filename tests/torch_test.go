package tests

import (
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/internal/localcluster"
)

const pyGPUChecks = "../python/tests/gpu_checks.py"

// startGPUChecks starts fpt's scheduler and a server with workers running
// gpu_checks.py in mode.
func startGPUChecks(t *testing.T, py pyEnv, workers int, mode string) *cluster {
	t.Helper()
	return &cluster{Cluster: startProcs(t, localcluster.Spec{Servers: 1, Workers: workers,
		Scheduler: []string{bin.fpt}, Server: []string{bin.fpt},
		Worker: []string{py.python, pyGPUChecks, mode}, Env: py.env}), t: t}
}

// bfloat16 keys sum exactly where the values are representable and within
// one rounding otherwise; float32 keys over a bf16 or fp16 wire give the
// float32 sum of the rounded values, rounded once; fpt.allreduce sums over
// 3 workers exactly at any size, averages, and checks names and steps;
// fpt.broadcast gives worker 0's tensor. gpu_checks.py asserts each.
func TestPythonCollective(t *testing.T) {
	py := needPython(t)
	c := startGPUChecks(t, py, 3, "collective")
	c.waitAll(3 * time.Minute)
	for _, w := range []string{"worker0", "worker1", "worker2"} {
		out := c.proc(w).Stdout.String()
		mustContain(t, w+" stdout", out, "COLLECTIVE PASS", "bfloat16 sums of representable values are exact",
			"allreduce of 100003 elements sums exactly",
			"allreduce of a non-contiguous tensor sums in place", "a torch.bfloat16 wire gives", "a torch.float16 wire gives",
			"broadcast gives worker 0's values")
		if strings.Contains(out, "FAIL") {
			t.Errorf("%s:\n%s", w, out)
		}
	}
}

// A 2-worker DDP program whose buckets go through fpt.torch.comm_hook, and
// DistributedOptimizer accumulating two backward passes per step, equal
// one process trained on the whole batch within 1e-5; over a bf16 wire
// within bfloat16 rounding; bad models are refused naming the parameter.
func TestPythonTrainGPUPaths(t *testing.T) {
	py := needPython(t)
	c := startGPUChecks(t, py, 2, "train")
	c.waitAll(3 * time.Minute)
	for _, w := range []string{"worker0", "worker1"} {
		out := c.proc(w).Stdout.String()
		mustContain(t, w+" stdout", out, "TRAIN PASS", "DDP's buckets went through fpt.torch.comm_hook", "DDP with fpt.torch.comm_hook on 2 workers equals one process",
			"backward_passes_per_step=2 on 2 workers equals one process", "a bf16 wire stays within", "DDP with comm_hook over a bf16 wire stays within",
			"a parameter on the meta device raises TypeError", "a sparse gradient is refused naming the parameter",
			"the staged (CUDA) path on 2 workers equals one process",
			"the staged path's bf16 wire (rounded on the device) trains the same parameters bit for bit")
	}
}
