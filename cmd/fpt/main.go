// Command fpt runs the scheduler or a server of an fpt cluster, as the
// ps-lite launch environment (DMLC_ROLE and friends) says, and measures
// clusters with "fpt bench" (package bench) and "fpt netem" (package netem).
// Workers are training programs that use package worker, such as
// tests/test_kv_app.
package main

import (
	"fmt"
	"os"

	"github.com/fptps/fpt/bench"
	"github.com/fptps/fpt/launch"
	"github.com/fptps/fpt/netem"
	"github.com/fptps/fpt/trace"
)

const usage = `usage:
  fpt                 run the node DMLC_ROLE names (scheduler or server)
  fpt bench [flags]   run a local cluster and print throughput and CPU cost (fpt bench -h)
  fpt netem [flags]   run a command or a cluster on emulated hosts with shaped links (fpt netem -h)
  fpt trace merge OUT IN...  merge the nodes' FPT_TRACE_FILE timelines into one (fpt trace -h)
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
		case "-h", "-help", "--help", "help":
			fmt.Fprint(os.Stdout, usage)
			return
		default:
			fmt.Fprintf(os.Stderr, "fpt: unknown command %q\n%s", os.Args[1], usage)
			os.Exit(launch.ExitUsage)
		}
	}
	os.Exit(launch.Main("fpt", os.LookupEnv, os.Stderr, nil))
}
