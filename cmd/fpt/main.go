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

	"github.com/fptps/fpt/bench"
	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/launch"
	"github.com/fptps/fpt/netem"
	"github.com/fptps/fpt/trace"
)

const usage = `usage:
  fpt                     run the node DMLC_ROLE names (scheduler or server)
  fpt run [--] PROG [ARGS...]
                          one command for every role, as dmlc-submit runs a job: with
                          DMLC_ROLE=worker, run PROG ARGS in fpt's place (the training
                          program); as the scheduler or a server, run that node (PROG is
                          not run)
  fpt bench [flags]       run a local cluster and print throughput and CPU cost (fpt bench -h)
  fpt netem [flags]       run a command or a cluster on emulated hosts with shaped links (fpt netem -h)
  fpt trace merge OUT IN...
                          merge the nodes' FPT_TRACE_FILE timelines into one (fpt trace -h)
  fpt -h | --help | help  this help

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

// run is "fpt run PROG ARGS": a worker becomes PROG (exec, so that the
// launcher sees PROG's exit status and signals reach it), the scheduler
// and servers run their node.
func run(args []string) int {
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, "fpt run: no program: fpt run [--] PROG [ARGS...]\n")
		return launch.ExitUsage
	}
	switch args[0] {
	case "-h", "-help", "--help":
		printUsage(os.Stdout)
		return launch.ExitOK
	}
	if strings.TrimSpace(os.Getenv("DMLC_ROLE")) != "worker" {
		// DMLC_ROLE unset or wrong is Main's configuration error.
		return launch.Main("fpt", os.LookupEnv, os.Stderr, nil)
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
