// Command fpt runs the scheduler or a server of an fpt cluster, as the
// ps-lite launch environment (DMLC_ROLE and friends) says, and measures
// clusters with "fpt bench" (package bench) and "fpt netem" (package netem).
// Workers are training programs that use package worker, such as
// tests/test_kv_app; "fpt run PROG" is one command line for every role, as
// dmlc-submit launches a job: the worker runs PROG, the others their node.
package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/fptps/fpt/bench"
	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/launch"
	"github.com/fptps/fpt/launch/engine"
	"github.com/fptps/fpt/netem"
	"github.com/fptps/fpt/trace"
)

// version is fpt's, the Python package's too (python/fpt/_version.py;
// a test checks they agree). A release build may set it with -ldflags
// "-X main.version=V".
var version = "0.1.0"

const usage = `usage:
  fpt                     run the node DMLC_ROLE names (scheduler or server)
  fpt run [--dry-run] [--] PROG [ARGS...]
                          one command for every role, as dmlc-submit, srun, mpirun or a
                          Kubernetes Job runs a job: under Slurm, Open MPI or Kubernetes
                          the role and rank come from the engine (docs/running.md: on
                          every host one server and the other tasks' workers, the
                          scheduler with the first task; DMLC_* set win); with
                          DMLC_ROLE=worker, run PROG ARGS in fpt's place (the training
                          program, with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE);
                          as the scheduler or a server, run that node (PROG is not run);
                          --dry-run prints what the engine's variables set
  fpt bench [flags]       run a local cluster and print throughput and CPU cost (fpt bench -h)
  fpt netem [flags]       run a command or a cluster on emulated hosts with shaped links (fpt netem -h)
  fpt trace merge OUT IN...
                          merge the nodes' FPT_TRACE_FILE timelines into one (fpt trace -h)
  fpt -h | --help | help  this help
  fpt --version           fpt's version

Exit status: 0 done, 1 failed, 2 bad usage or configuration, 3 internal error.

`

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "bench":
			os.Exit(bench.Main(os.Args[2:]))
		case "netem":
			os.Exit(netem.Main(os.Args[2:]))
		case "trace":
			os.Exit(trace.Main(os.Args[2:], os.Stdout, os.Stderr))
		case "run":
			os.Exit(run(os.Args[2:]))
		case "-h", "-help", "--help", "help":
			printUsage(os.Stdout)
			return
		case "--version", "version":
			fmt.Printf("fpt %s\n", version)
			return
		default:
			fmt.Fprintf(os.Stderr, "fpt: unknown command %q (fpt -h lists them)\n", os.Args[1])
			os.Exit(launch.ExitUsage)
		}
	}
	os.Exit(launch.Main("fpt", os.LookupEnv, os.Stderr, nil))
}

func printUsage(w io.Writer) {
	fmt.Fprint(w, usage)
	if err := config.WriteHelp(w); err != nil {
		fmt.Fprintf(os.Stderr, "fpt: %v\n", err)
	}
}

// run is "fpt run PROG ARGS": under a cluster engine (Slurm, mpirun,
// Kubernetes) the task first takes its role and rank from the engine's
// variables (package launch/engine); then a worker becomes PROG (exec, so that
// the launcher sees PROG's exit status and signals reach it), the
// scheduler and servers run their node, and the task the engine's mapping
// gives the scheduler as well runs it as a child process.
func run(args []string) int {
	dry := len(args) > 0 && args[0] == "--dry-run"
	if dry {
		args = args[1:]
	}
	if len(args) > 0 {
		switch args[0] {
		case "--":
			args = args[1:]
		case "-h", "-help", "--help":
			printUsage(os.Stdout)
			return launch.ExitOK
		}
	}
	if len(args) == 0 && !dry {
		fmt.Fprint(os.Stderr, "fpt run: no program: fpt run [--dry-run] [--] PROG [ARGS...]\n")
		return launch.ExitUsage
	}
	plan, err := engine.Detect(os.LookupEnv)
	if err != nil {
		fmt.Fprintf(os.Stderr, "fpt run: %s: %v\n", plan.Engine, err)
		return launch.ExitUsage
	}
	for _, kv := range plan.Env {
		k, v, _ := strings.Cut(kv, "=")
		os.Setenv(k, v)
	}
	if dry {
		printPlan(os.Stdout, plan)
		return launch.ExitOK
	}
	if v := strings.TrimSpace(os.Getenv("PS_VERBOSE")); plan.Engine != "" && v != "" && v != "0" {
		printPlan(os.Stderr, plan)
	}
	if strings.TrimSpace(os.Getenv("DMLC_ROLE")) != "worker" {
		return runNode(plan.Scheduler, plan.SchedulerEnv)
	}
	path, err := exec.LookPath(args[0])
	if err != nil {
		fmt.Fprintf(os.Stderr, "fpt run: DMLC_ROLE=worker: %v\n", err)
		return launch.ExitUsage
	}
	err = syscall.Exec(path, args, os.Environ())
	fmt.Fprintf(os.Stderr, "fpt run: DMLC_ROLE=worker: running %s: %v\n", path, err)
	return launch.ExitFailed
}

// printPlan writes what the engine's mapping set, one line each.
func printPlan(w io.Writer, plan engine.Plan) {
	if plan.Engine == "" {
		fmt.Fprintln(w, "fpt run: no cluster engine found (Slurm, Open MPI, Kubernetes): the DMLC_* variables say the role")
		return
	}
	fmt.Fprintf(w, "fpt run: engine %s\n", plan.Engine)
	for _, kv := range plan.Env {
		fmt.Fprintf(w, "fpt run: %s\n", kv)
	}
	if plan.Scheduler {
		fmt.Fprintln(w, strings.TrimSpace("fpt run: this task also runs the scheduler "+strings.Join(plan.SchedulerEnv, " ")))
	}
}

// runNode runs the node DMLC_ROLE names, with the scheduler beside it in
// a child process when withScheduler; the task fails when either does.
func runNode(withScheduler bool, schedEnv []string) int {
	if !withScheduler {
		// DMLC_ROLE unset or wrong is Main's configuration error.
		return launch.Main("fpt", os.LookupEnv, os.Stderr, nil)
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "fpt run: starting the scheduler: %v\n", err)
		return launch.ExitFailed
	}
	sched := exec.Command(self)
	sched.Env = append(append(os.Environ(), schedEnv...), "DMLC_ROLE=scheduler")
	sched.Stdout, sched.Stderr = os.Stdout, os.Stderr
	// The scheduler goes with the task, whatever ends it.
	sched.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := sched.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "fpt run: starting the scheduler: %v\n", err)
		return launch.ExitFailed
	}
	done := make(chan error, 1)
	nodeEnded := make(chan struct{})
	go func() {
		err := sched.Wait()
		if err == nil { // the cluster is done: the node ends in a moment
			<-nodeEnded
		}
		select {
		case <-nodeEnded:
			done <- err
		default:
			// The scheduler failed while this task's node runs (its port
			// taken, a bad setting): the node would wait for it until
			// FPT_START_TIMEOUT or its heartbeat timeout; the task ends now.
			fmt.Fprintf(os.Stderr, "fpt run: the scheduler beside this task failed (%v); ending the task\n", err)
			os.Exit(schedulerStatus(err))
		}
	}()
	code := launch.Main("fpt", os.LookupEnv, os.Stderr, nil)
	close(nodeEnded)
	// The scheduler ends with the cluster; it has had its signal too
	// when the engine stopped the task.
	select {
	case err = <-done:
	case <-time.After(schedulerLinger):
		fmt.Fprintf(os.Stderr, "fpt run: the scheduler still runs %s after this task's node ended; stopping it\n", schedulerLinger)
		_ = sched.Process.Signal(syscall.SIGTERM)
		err = <-done
	}
	if code == launch.ExitOK && err != nil {
		fmt.Fprintf(os.Stderr, "fpt run: scheduler: %v\n", err)
		return schedulerStatus(err)
	}
	return code
}

// schedulerStatus is the task's exit status for the scheduler's failure
// err: the scheduler's own status, or ExitFailed when it has none (killed
// by a signal, never waited for).
func schedulerStatus(err error) int {
	if ee, ok := err.(*exec.ExitError); ok && ee.ExitCode() > 0 {
		return ee.ExitCode()
	}
	return launch.ExitFailed
}

// schedulerLinger bounds how long a task waits for the scheduler it runs
// beside its own node once that node ended: the scheduler ends with the
// cluster, moments later.
const schedulerLinger = 10 * time.Second
