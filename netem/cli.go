package netem

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fptps/fpt/config"
)

// Exit statuses of Main, as a shell and package launch count them.
const (
	exitOK     = 0
	exitFailed = 1
	exitUsage  = 2
)

const (
	// stopGrace is how long a host's processes get between SIGTERM and
	// SIGKILL once the run is being stopped.
	stopGrace = 3 * time.Second
	// outputDelay bounds the wait for a host's output after its command
	// exited: something it started in the background may hold the pipe.
	outputDelay = 2 * time.Second
	// maxLine is the longest line held back waiting for its newline.
	maxLine = 64 << 10
)

// cliOptions are the flags of "fpt netem".
type cliOptions struct {
	hosts   []HostSpec
	cluster bool
	port    int
	script  string
	words   []string // the command, or run_test.sh's -- arguments with --cluster
}

const cliUsage = `usage: fpt netem --hosts SPEC,SPEC,... [flags] -- COMMAND [ARGS...]
       fpt netem --hosts SPEC,SPEC,... --cluster [flags] [-- test_kv_app flags...]

Emulates one host per SPEC (network namespaces joined by a bridge, addresses
198.18.0.1, 198.18.0.2, ..., each link shaped with tc tbf), runs COMMAND in
every host at once, and removes the network afterwards, also on failure or
interrupt. Needs root.

SPEC is a rate in tc syntax for both directions ("200mbit", "1gbit"), UP/DOWN
("100mbit/1gbit"), or "0" or "none" for no limit.

COMMAND sees FPT_NETEM_HOST (its host's index), FPT_NETEM_HOSTS (how many),
FPT_NETEM_ADDR (its address), FPT_NETEM_ROOT (host 0's address) and
FPT_NETEM_IFACE (its interface). Output lines are prefixed [h<index>]. The
exit status is 0 if every host's command exits 0, else the first failure's,
and the first failure stops the other hosts.

With --cluster, every host runs scripts/run_test.sh: one server and one
worker each, the scheduler on host 0.

Flags:
`

func parseCLIArgs(args []string, output io.Writer) (cliOptions, error) {
	var o cliOptions
	fs := flag.NewFlagSet("fpt netem", flag.ContinueOnError)
	fs.SetOutput(output)
	fs.Func("host", "one host's `SPEC` (repeat for each host)", func(s string) error {
		h, err := ParseHostSpec(s)
		o.hosts = append(o.hosts, h)
		return err
	})
	fs.Func("hosts", "comma-separated host `SPECs`, one per host", func(s string) error {
		for _, spec := range strings.Split(s, ",") {
			h, err := ParseHostSpec(spec)
			if err != nil {
				return err
			}
			o.hosts = append(o.hosts, h)
		}
		return nil
	})
	fs.BoolVar(&o.cluster, "cluster", false, "run an fpt cluster (scripts/run_test.sh on every host) instead of COMMAND")
	fs.IntVar(&o.port, "port", 9000, "the scheduler's port on host 0 with --cluster")
	fs.StringVar(&o.script, "script", "", "`path` of run_test.sh with --cluster (default: ../scripts/run_test.sh from this binary, else ./scripts/run_test.sh)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), cliUsage)
		fs.PrintDefaults()
		// COMMAND, and with --cluster the nodes, inherit the environment.
		fmt.Fprintln(fs.Output())
		config.WriteHelp(fs.Output())
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	o.words = fs.Args()
	switch {
	case len(o.hosts) == 0:
		return o, errors.New("no hosts: give --hosts SPEC,SPEC,... or --host SPEC for each")
	case len(o.hosts) > MaxHosts:
		return o, fmt.Errorf("%d hosts, at most %d", len(o.hosts), MaxHosts)
	case !o.cluster && len(o.words) == 0:
		return o, errors.New("no command: give -- COMMAND [ARGS...] or --cluster")
	case o.port < 1 || o.port > 65534:
		return o, fmt.Errorf("port %d: want 1 to 65534 (the data port is the next one)", o.port)
	}
	return o, nil
}

// clusterArgs are run_test.sh's arguments on host i of k: one server and one
// worker per host, both of rank i, the scheduler on host 0 at root.
func clusterArgs(i, k int, root, iface string, appArgs []string) []string {
	var args []string
	if i == 0 {
		args = append(args, "--scheduler")
	}
	args = append(args, "-s", "1", "-w", "1", "--first-server", strconv.Itoa(i), "--first-worker", strconv.Itoa(i), "--root", root,
		"--num-servers", strconv.Itoa(k), "--num-workers", strconv.Itoa(k), "--iface", iface)
	if len(appArgs) > 0 {
		args = append(append(args, "--"), appArgs...)
	}
	return args
}

// hostEnv is what tells host i's command where it runs.
func hostEnv(i, k int, addr, root, iface string) []string {
	return []string{
		"FPT_NETEM_HOST=" + strconv.Itoa(i),
		"FPT_NETEM_HOSTS=" + strconv.Itoa(k),
		"FPT_NETEM_ADDR=" + addr,
		"FPT_NETEM_ROOT=" + root,
		"FPT_NETEM_IFACE=" + iface,
	}
}

// findScript locates run_test.sh: bin/fpt is built next to scripts/.
func findScript(given string) (string, error) {
	if given != "" {
		return filepath.Abs(given)
	}
	var candidates []string
	if exe, err := os.Executable(); err == nil {
		if exe, err := filepath.EvalSymlinks(exe); err == nil {
			candidates = append(candidates, filepath.Join(filepath.Dir(exe), "..", "scripts", "run_test.sh"))
		}
	}
	candidates = append(candidates, filepath.Join("scripts", "run_test.sh"))
	for _, c := range candidates {
		if _, err := os.Stat(c); err == nil {
			return filepath.Abs(c)
		}
	}
	return "", fmt.Errorf("scripts/run_test.sh not found (looked at %s); give --script", strings.Join(candidates, ", "))
}

// linePrefixer writes whole lines to w, each behind prefix. Writers to the
// same output share mu so that hosts' lines never interleave mid-line.
type linePrefixer struct {
	mu     *sync.Mutex
	w      io.Writer
	prefix string
	buf    []byte
}

func (p *linePrefixer) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.buf = append(p.buf, b...)
	for {
		i := bytes.IndexByte(p.buf, '\n')
		if i < 0 && len(p.buf) < maxLine {
			return len(b), nil
		}
		if i < 0 {
			i = maxLine - 1
		}
		if err := p.emit(p.buf[:i+1]); err != nil {
			return len(b), err
		}
		p.buf = p.buf[i+1:]
	}
}

// Flush writes a last line that had no newline.
func (p *linePrefixer) Flush() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.buf) == 0 {
		return nil
	}
	err := p.emit(p.buf)
	p.buf = nil
	return err
}

func (p *linePrefixer) emit(line []byte) error {
	out := append([]byte(p.prefix), line...)
	if out[len(out)-1] != '\n' {
		out = append(out, '\n')
	}
	_, err := p.w.Write(out)
	return err
}

// exitStatus is a finished command's status the way a shell reports it.
func exitStatus(err error) int {
	var ee *exec.ExitError
	switch {
	case err == nil, errors.Is(err, exec.ErrWaitDelay):
		return 0
	case errors.As(err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return exitFailed
}

// signalError is the cause of the run's context when a signal stopped it.
type signalError struct{ sig syscall.Signal }

func (e signalError) Error() string { return "caught " + e.sig.String() }

// Main runs "fpt netem" with args (those after "netem") and returns the
// exit status: the emulated hosts, each running a command or one node pair
// of a cluster, torn down afterwards.
func Main(args []string) int {
	o, err := parseCLIArgs(args, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	} else if err != nil {
		fmt.Fprintf(os.Stderr, "fpt netem: %v\n", err)
		return exitUsage
	}

	// A signal cancels whatever stage is running; teardown still happens.
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		select {
		case s := <-sigs:
			cancel(signalError{s.(syscall.Signal)})
		case <-ctx.Done():
		}
	}()
	status := func(code int) int {
		var se signalError
		if errors.As(context.Cause(ctx), &se) {
			return 128 + int(se.sig)
		}
		return code
	}

	var script string
	if o.cluster {
		if script, err = findScript(o.script); err != nil {
			fmt.Fprintf(os.Stderr, "fpt netem: %v\n", err)
			return exitUsage
		}
		// Build once here: run_test.sh builds stale binaries, and K hosts
		// doing so at once would race on bin/.
		build := exec.CommandContext(ctx, filepath.Join(filepath.Dir(script), "build.sh"))
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "fpt netem: building the binaries: %v\n", err)
			return status(exitFailed)
		}
	}

	n, err := New(ctx, o.hosts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "fpt netem: %v\n", err)
		return status(exitFailed)
	}
	k := n.Len()
	for i := range k {
		h := n.Host(i)
		fmt.Fprintf(os.Stderr, "fpt netem: h%d %s in %s, up %s, down %s\n", i, n.Addr(i), n.Namespace(i), rateText(h.Up), rateText(h.Down))
	}
	code := runHosts(ctx, n, o, script)
	if err := n.Close(); err != nil {
		fmt.Fprintf(os.Stderr, "fpt netem: removing the network: %v\n", err)
		if code == 0 {
			code = exitFailed
		}
	} else {
		fmt.Fprintf(os.Stderr, "fpt netem: network of %d hosts removed\n", k)
	}
	return status(code)
}

func rateText(r string) string {
	if r == "" {
		return "unlimited"
	}
	return r
}

// runHosts runs the command in every host and returns the first failure's
// status, or 0. A failure or ctx's end stops the other hosts: SIGTERM to
// each one's process group, SIGKILL after stopGrace.
func runHosts(ctx context.Context, n *Network, o cliOptions, script string) int {
	k := n.Len()
	type result struct {
		i   int
		err error
	}
	results := make(chan result, k)
	var stdoutMu, stderrMu sync.Mutex
	cmds := make([]*exec.Cmd, k)
	flush := make([]func(), k)
	// The hosts are not loopback: a cluster needs a secret, the same on
	// every host, and a fresh one per run unless the user gave one.
	var secretEnv []string
	if o.cluster && os.Getenv("FPT_CLUSTER_SECRET") == "" && os.Getenv("FPT_CLUSTER_SECRET_FILE") == "" {
		var b [16]byte
		_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux
		secretEnv = []string{"FPT_CLUSTER_SECRET=" + hex.EncodeToString(b[:])}
	}
	for i := range k {
		argv := o.words
		if o.cluster {
			argv = append([]string{script}, clusterArgs(i, k, n.Addr(0)+":"+strconv.Itoa(o.port), n.Iface(), o.words)...)
		}
		// Not ctx: stopping is done below, by process group, with a grace.
		cmd := n.Command(context.Background(), i, argv[0], argv[1:]...)
		cmd.Env = append(append(os.Environ(), hostEnv(i, k, n.Addr(i), n.Addr(0), n.Iface())...), secretEnv...)
		// Its own process group, so that stopping it reaches whatever it
		// started, and a terminal's Ctrl-C reaches only fpt
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		prefix := fmt.Sprintf("[h%d] ", i)
		out := &linePrefixer{mu: &stdoutMu, w: os.Stdout, prefix: prefix}
		errOut := &linePrefixer{mu: &stderrMu, w: os.Stderr, prefix: prefix}
		cmd.Stdout, cmd.Stderr, cmd.WaitDelay = out, errOut, outputDelay
		flush[i] = func() { out.Flush(); errOut.Flush() }
		if err := cmd.Start(); err != nil {
			results <- result{i, err}
			continue
		}
		cmds[i] = cmd
		go func() { results <- result{i, cmd.Wait()} }()
	}

	code := 0
	running := k
	stopping := false
	exited := make([]bool, k)
	signalAll := func(sig syscall.Signal) {
		for i, cmd := range cmds {
			if cmd != nil && !exited[i] {
				// The group may be gone already: nothing to report.
				_ = syscall.Kill(-cmd.Process.Pid, sig)
			}
		}
	}
	var killAfter <-chan time.Time
	stop := func() {
		if !stopping {
			stopping = true
			signalAll(syscall.SIGTERM)
			killAfter = time.After(stopGrace)
		}
	}
	done := ctx.Done()
	for running > 0 {
		select {
		case r := <-results:
			running--
			exited[r.i] = true
			flush[r.i]()
			if c := exitStatus(r.err); c != 0 && !stopping {
				code = c
				fmt.Fprintf(os.Stderr, "fpt netem: h%d failed (%v, status %d); stopping the other hosts\n", r.i, r.err, c)
				stop()
			}
		case <-done:
			done = nil
			fmt.Fprintf(os.Stderr, "fpt netem: %v; stopping the hosts\n", context.Cause(ctx))
			stop()
		case <-killAfter:
			signalAll(syscall.SIGKILL)
		}
	}
	return code
}
