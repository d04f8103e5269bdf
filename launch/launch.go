// Package launch turns a ps-lite launch environment (DMLC_*) into a
// running node. Start is the one way any program starts a node of any
// role: the fpt binaries through Main and Run, the C library (package
// capi) directly. It sets up the node's metrics (FPT_METRICS_ADDR) and
// where the scheduler's LB decisions go, so that a node behaves the same
// whichever program runs it. Main also reads the configuration, sets up
// logging, hands a worker to the training program, and maps the outcome to
// an exit code (0 done, 1 failed, 2 bad configuration, 3 internal error).
//
// A panic is a bug, never a configuration error: one on Main's goroutine
// (starting the node, the training program) is recovered and exits 3,
// saying so, with the stack. Go's runtime exits 2 on a panic no goroutine
// recovers, and no program can change that code from inside; the goroutines
// that read the network validate their input so that it cannot panic them.
package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/control"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/worker"
)

// Exit codes.
const (
	ExitOK     = 0
	ExitFailed = 1
	ExitUsage  = 2
	// ExitBug is a panic: an internal error, never a configuration one.
	ExitBug = 3
)

// Train is a training program's body, run on a started worker. Returning
// nil leaves the cluster in order (final barrier); an error fails the node.
type Train func(ctx context.Context, w *worker.Worker) error

// Main runs the node DMLC_ROLE names, reading the environment through
// lookup, logging to stderr, and returns the exit code. It first warns
// about any FPT_*, PS_* or DMLC_* variable of the process environment that
// fpt does not know (config.Unknown). A nil train makes a
// worker role a usage error: workers are training programs.
func Main(name string, lookup func(string) (string, bool), stderr io.Writer, train Train) (code int) {
	defer func() {
		if p := recover(); p != nil {
			// Deliver what the control plane queued (a failure notice).
			control.Shutdown()
			stack := debug.Stack()
			if b, ok := p.(trainPanic); ok {
				p, stack = b.value, b.stack
			}
			fmt.Fprintf(stderr, "%s: internal error (a bug): panic: %v\n%s", name, p, stack)
			code = ExitBug
		}
	}()
	// A mistyped name is otherwise silently ignored: say so first, as it
	// may be why a required variable is missing.
	for _, w := range config.Unknown(os.Environ()) {
		fmt.Fprintf(stderr, "%s: warning: %s\n", name, w)
	}
	cfg, err := config.FromEnv(lookup)
	if err != nil {
		for _, e := range unjoin(err) {
			fmt.Fprintf(stderr, "%s: %v\n", name, e)
		}
		return ExitUsage
	}
	if cfg.Role == node.Worker && train == nil {
		fmt.Fprintf(stderr, "%s: DMLC_ROLE=worker: workers are training programs (e.g. test_kv_app); %s runs the scheduler and servers (fpt run PROG runs PROG as the worker)\n", name, name)
		return ExitUsage
	}
	log := Logger(stderr, cfg)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		// The first signal ends ctx (a server under FPT_ON_SERVER_LOSS=retry
		// then leaves in order); a second one kills, as by default.
		<-ctx.Done()
		stop()
	}()
	err = Run(ctx, cfg, Deps{Log: log, Decisions: os.Stdout}, train)
	// Deliver the last control messages before the process exits.
	control.Shutdown()
	if err != nil {
		fmt.Fprintf(stderr, "%s: %s: %v\n", name, cfg.Role, err)
		var ve *config.VarError
		if errors.As(err, &ve) {
			return ExitUsage
		}
		return ExitFailed
	}
	return ExitOK
}

var errNoTrain = errors.New("launch: a worker needs a training program")

// Run runs one node of the given configuration until it leaves the cluster:
// Start, then n.Run. Main passes stdout for the scheduler's LB decisions.
func Run(ctx context.Context, cfg config.Config, deps Deps, train Train) error {
	if cfg.Role == node.Worker && train == nil {
		return errNoTrain
	}
	n, err := Start(ctx, cfg, deps)
	if err != nil {
		return err
	}
	return n.Run(ctx, train)
}

// Run runs a started node until it leaves the cluster: for a worker the
// training program, then Finalize. A worker's program that fails or
// panics fails the node first, so that the cluster names it.
func (n *Node) Run(ctx context.Context, train Train) error {
	if w := n.Worker(); w != nil {
		if train == nil {
			n.Fail(errNoTrain)
			return errNoTrain
		}
		defer func() {
			if p := recover(); p != nil {
				// Tell the cluster before the process goes, so that
				// everyone names this node rather than a lost connection.
				n.Fail(fmt.Errorf("launch: internal error (a bug) in the training program: panic: %v", p))
				panic(trainPanic{value: p, stack: debug.Stack()})
			}
		}()
		if err := train(ctx, w); err != nil {
			n.Fail(err)
			return err
		}
	}
	return n.Finalize(ctx)
}

// trainPanic carries a training program's panic, with the stack where it
// happened, from Run's recover (which fails the node) to Main's.
type trainPanic struct {
	value any
	stack []byte
}

// Logger is the node's logger: text to w, at a level set by PS_VERBOSE
// (0 warnings and errors, 1 progress, 2 debug), tagged with the role.
func Logger(w io.Writer, cfg config.Config) *slog.Logger {
	level := slog.LevelWarn
	switch cfg.Verbose {
	case 1:
		level = slog.LevelInfo
	case 2:
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level})).With("role", cfg.Role.String())
}

func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}
