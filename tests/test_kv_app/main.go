// Command test_kv_app is fpt's simulated trainer, a program that, like
// ps-lite's test programs, runs as whichever role DMLC_ROLE names: the
// scheduler, a server, or a worker that trains for N iterations over T
// tensors of mixed sizes and priorities and checks every pulled value
// exactly. It keeps the model's parameters (Init's values plus every
// iteration's sums), so a worker started while the job runs can join it,
// and prints their checksum at the end, equal on every worker. It exits
// non-zero on any mismatch or failure.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/launch"
	"github.com/fptps/fpt/trainer"
	"github.com/fptps/fpt/worker"
)

const usage = `usage: test_kv_app [flags]

fpt's simulated trainer. Run as whichever role DMLC_ROLE names: the
scheduler, a server, or a worker that trains and checks every pulled value
exactly, printing "worker RANK: ..." lines, the parameters' checksum (the
same on every worker) and PASS. A worker started while the job runs joins
it, from the others' parameters. Exits 0 on success, 1 on a mismatch or
failure, 2 on bad flags or environment.

Flags:
`

func main() {
	o := trainer.DefaultOptions()
	fs := flag.NewFlagSet("test_kv_app", flag.ExitOnError)
	fs.IntVar(&o.Iterations, "iters", o.Iterations, "training iterations after init")
	fs.IntVar(&o.Tensors, "tensors", o.Tensors, "tensors per iteration")
	fs.IntVar(&o.MinBytes, "min-bytes", o.MinBytes, "smallest tensor in bytes")
	fs.IntVar(&o.MaxBytes, "max-bytes", o.MaxBytes, "largest tensor in bytes")
	fs.IntVar(&o.Classic, "classic", o.Classic, "rounds of classic Push/Pull/PushPull after training")
	fs.BoolVar(&o.ClassicFirst, "classic-first", false, "also run the classic Push/Pull rounds before training, right after init (by the initial workers; a worker that joins later skips them), so that the servers hold classic values while the job trains and the rounds after training check sums that include them")
	fs.BoolVar(&o.Quiet, "quiet", false, "no line per iteration")
	fs.DurationVar(&o.Compute, "compute", 0, "pause before each iteration, standing for the forward and backward pass (e.g. 200ms)")
	dtype := fs.String("dtype", "float32", "float32 or float64")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
		fmt.Fprintln(fs.Output())
		config.WriteHelp(fs.Output())
	}
	fs.Parse(os.Args[1:])
	d, err := frame.ParseDType(*dtype)
	if err == nil {
		o.DType = d
		err = o.Validate()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "test_kv_app: %v\n", err)
		os.Exit(launch.ExitUsage)
	}
	os.Exit(launch.Main("test_kv_app", os.LookupEnv, os.Stderr, func(ctx context.Context, w *worker.Worker) error {
		_, err := trainer.Run(ctx, w, o, os.Stdout)
		return err
	}))
}
