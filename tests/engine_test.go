package tests

import (
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fptps/fpt/internal/localcluster"
)

// engineJob runs "fpt run test_kv_app" once per task, each with the
// variables task(i) gives, as a cluster engine starts the one command of
// a job once per task; it fails the test unless every task exits 0, and
// returns each task's output.
func engineJob(t *testing.T, tasks int, task func(i int) []string) []string {
	t.Helper()
	return engineJobOf(t, []string{bin.fpt, "run", "--"}, tasks, task)
}

// engineEnviron is this process's environment without what an engine or
// fpt would read (so the host's own Slurm or MPI job cannot leak in), plus
// extra.
func engineEnviron(extra ...string) []string {
	return append(environWithout("FPT_", "PS_", "DMLC_", "SLURM_", "OMPI_", "JOB_COMPLETION_INDEX", "RANK", "WORLD_SIZE", "LOCAL_"), extra...)
}

// engineJobOf is engineJob with the launcher launch (fpt run --, or
// fptrun) in front of test_kv_app.
func engineJobOf(t *testing.T, launch []string, tasks int, task func(i int) []string) []string {
	t.Helper()
	secret, err := localcluster.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	outs := make([]string, tasks)
	codes := make([]int, tasks)
	var wg sync.WaitGroup
	for i := range tasks {
		argv := append(append([]string(nil), launch...), bin.app, "-iters", "3", "-max-bytes", "65536", "-quiet")
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = append(engineEnviron("FPT_CLUSTER_SECRET="+secret, "FPT_START_TIMEOUT=60", "PS_VERBOSE=1"), task(i)...)
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			timer := time.AfterFunc(60*time.Second, func() { cmd.Process.Kill() })
			defer timer.Stop()
			cmd.Wait()
			codes[i], outs[i] = cmd.ProcessState.ExitCode(), out.String()
		}()
	}
	wg.Wait()
	for i, c := range codes {
		if c != 0 {
			t.Errorf("task %d exited %d:\n%s", i, c, tail(outs[i]))
		}
	}
	return outs
}

// Under Slurm (its variables, as srun sets them for a job of 3 tasks on
// each of 2 hosts, both this one) every task takes its role from the
// mapping: a server and 2 workers per host, the scheduler with task 0;
// the workers get torchrun's variables; the job passes.
func TestEngineSlurmMapping(t *testing.T) {
	const perHost, hosts = 3, 2
	jobID := strconv.Itoa(int(time.Now().UnixNano() % 1e6))
	outs := engineJob(t, perHost*hosts, func(i int) []string {
		return []string{"SLURM_PROCID=" + strconv.Itoa(i), "SLURM_NTASKS=" + strconv.Itoa(perHost*hosts),
			"SLURM_LOCALID=" + strconv.Itoa(i%perHost), "SLURM_NODEID=" + strconv.Itoa(i/perHost),
			"SLURM_JOB_NODELIST=localhost,127.0.0.1", "SLURM_JOB_ID=" + jobID, "SLURM_STEP_ID=0"}
	})
	mustContain(t, "task 0", outs[0], "fpt run: engine slurm", "DMLC_ROLE=server", "this task also runs the scheduler")
	mustContain(t, "task 3", outs[3], "DMLC_ROLE=server", "DMLC_SERVER_ID=1")
	mustContain(t, "task 5", outs[5], "DMLC_ROLE=worker", "RANK=3", "WORLD_SIZE=4", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2", "PASS")
	for _, i := range []int{1, 2, 4} {
		mustContain(t, fmt.Sprintf("task %d", i), outs[i], "PASS")
	}
}

// Under Open MPI (one host, 3 ranks): a server with the scheduler, and 2
// workers; the 4 processes on the host serve their metrics on ports apart
// from the one FPT_METRICS_ADDR gives.
func TestEngineOpenMPIMapping(t *testing.T) {
	jobID := strconv.Itoa(int(time.Now().UnixNano()%1e6) + 1)
	port, err := localcluster.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	outs := engineJob(t, 3, func(i int) []string {
		return []string{"OMPI_COMM_WORLD_RANK=" + strconv.Itoa(i), "OMPI_COMM_WORLD_SIZE=3",
			"OMPI_COMM_WORLD_LOCAL_RANK=" + strconv.Itoa(i), "OMPI_COMM_WORLD_LOCAL_SIZE=3", "OMPI_MCA_ess_base_jobid=" + jobID,
			fmt.Sprintf("FPT_METRICS_ADDR=127.0.0.1:%d", port)}
	})
	mustContain(t, "rank 0", outs[0], "fpt run: engine openmpi",
		fmt.Sprintf("this task also runs the scheduler FPT_METRICS_ADDR=127.0.0.1:%d", port+3))
	mustContain(t, "rank 2", outs[2], "RANK=1", fmt.Sprintf("FPT_METRICS_ADDR=127.0.0.1:%d", port+2), "PASS")
}

// fptrun under Slurm runs each task's share as fpt run maps it (here 4
// tasks on one host: the scheduler and a server, 3 workers).
func TestFptrunUnderSlurm(t *testing.T) {
	jobID := strconv.Itoa(int(time.Now().UnixNano()%1e6) + 2)
	outs := engineJobOf(t, []string{"../scripts/fptrun"}, 4, func(i int) []string {
		return []string{"FPT_BIN=" + bin.fpt, "SLURM_PROCID=" + strconv.Itoa(i), "SLURM_NTASKS=4", "SLURM_LOCALID=" + strconv.Itoa(i),
			"SLURM_NODEID=0", "SLURM_JOB_NODELIST=localhost", "SLURM_JOB_ID=" + jobID, "SLURM_STEP_ID=0"}
	})
	mustContain(t, "task 0", outs[0], "fpt run: engine slurm", "this task also runs the scheduler")
	mustContain(t, "task 3", outs[3], "LOCAL_RANK=2", "LOCAL_WORLD_SIZE=3", "PASS")
}

// The scheduler that task 0 runs beside its server cannot listen (its
// port is taken): the task ends at once with the scheduler's status and
// says why, instead of its server waiting out FPT_START_TIMEOUT.
func TestEngineSchedulerFailureEndsTask(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	port := held.Addr().(*net.TCPAddr).Port
	cmd := exec.Command(bin.fpt, "run", "--", bin.app, "-iters", "3")
	cmd.Env = engineEnviron("OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=3", "OMPI_COMM_WORLD_LOCAL_RANK=0", "OMPI_COMM_WORLD_LOCAL_SIZE=3",
		"OMPI_MCA_ess_base_jobid=7", "DMLC_PS_ROOT_PORT="+strconv.Itoa(port), "FPT_START_TIMEOUT=60")
	start := time.Now()
	timer := time.AfterFunc(50*time.Second, func() { cmd.Process.Kill() }) // a hang guard, not a speed bound
	defer timer.Stop()
	out, _ := cmd.CombinedOutput()
	if code := cmd.ProcessState.ExitCode(); code <= 0 {
		t.Fatalf("the task exited %d after %s, want the scheduler's failure:\n%s", code, time.Since(start).Round(time.Millisecond), out)
	}
	mustContain(t, "task 0", string(out), "the scheduler cannot listen", "the scheduler beside this task failed")
}
