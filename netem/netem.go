// Package netem emulates a network of K hosts with links of different
// rates on one Linux machine, so that fpt's clusters can be run and
// measured over heterogeneous links without K machines.
//
// Each host is a network namespace with one interface, eth0, addressed
// 198.18.0.<i+1>/15 (the range reserved for benchmarking) and joined to
// the others through a veth pair and a Linux bridge in the root namespace.
// A host's rates are enforced with tc's tbf (netem's delay is not
// available on the machines fpt runs on; tbf is). tbf shapes only what an
// interface sends, so a host's upload is shaped on its eth0 and its
// download on the bridge side of its veth pair.
//
// It needs root. Every object's name carries the pid of the process that
// made it; New first removes what dead processes left behind, so a run
// killed before it could tear down does not leak namespaces for long.
//
// Main is the "fpt netem" command: a command, or a cluster of
// scripts/run_test.sh, run on every emulated host.
package netem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// teardownTimeout bounds Close and the cleanup after a failed New; their
// commands run even when the caller's context is done.
const teardownTimeout = time.Minute

// Network is a running emulated network. Its methods are safe for
// concurrent use.
type Network struct {
	names names
	run   runner

	mu    sync.Mutex // guards hosts, and orders SetRate calls
	hosts []HostSpec

	closeOnce sync.Once
	closeErr  error
}

// runner runs one command, stdin on its standard input, and returns its
// standard output; the error carries its standard error.
type runner func(ctx context.Context, args []string, stdin string) (string, error)

// cmdError is a failed command with what it printed on standard error.
type cmdError struct {
	args   []string
	err    error
	stderr string
}

func (e *cmdError) Error() string {
	msg := strings.Join(e.args, " ") + ": " + e.err.Error()
	if e.stderr != "" {
		msg += ": " + e.stderr
	}
	return msg
}

func (e *cmdError) Unwrap() error { return e.err }

// stderrHas tells whether err is a command that failed saying any of subs.
func stderrHas(err error, subs ...string) bool {
	var ce *cmdError
	if !errors.As(err, &ce) {
		return false
	}
	for _, s := range subs {
		if strings.Contains(ce.stderr, s) {
			return true
		}
	}
	return false
}

// noQdisc is how tc says a device has no root qdisc to delete.
func noQdisc(err error) bool {
	return stderrHas(err, "handle of zero", "No such file or directory", "Invalid handle")
}

// exists and gone are how ip says an object already exists or is missing.
func exists(err error) bool { return stderrHas(err, "File exists") }

func gone(err error) bool {
	// "No such device": the link was there when ip looked it up, and the
	// kernel removed it before the delete (a namespace deleted just before
	// takes its veth pair with it, asynchronously).
	return stderrHas(err, "Cannot find device", "No such device", "No such file or directory", "does not exist")
}

func execRunner(ctx context.Context, args []string, stdin string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", &cmdError{args: args, err: err, stderr: strings.TrimSpace(stderr.String())}
	}
	return stdout.String(), nil
}

// Available tells why this process cannot build networks, or nil if it
// can: it must be root and have ip and tc (iproute2).
func Available() error {
	if uid := os.Geteuid(); uid != 0 {
		return fmt.Errorf("netem: network namespaces and tc need root (running as uid %d)", uid)
	}
	for _, tool := range []string{"ip", "tc"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("netem: %s not found (install iproute2): %w", tool, err)
		}
	}
	return nil
}

// New creates a network of len(hosts) hosts, host i shaped as hosts[i].
// On any error it tears down what it made and returns an error naming the
// failing command and what it printed.
func New(ctx context.Context, hosts []HostSpec) (*Network, error) {
	// Check the specs first: a bad spec is a mistake whoever runs it.
	if _, err := setupPlan(namesFor(os.Getpid(), 0), hosts); err != nil {
		return nil, err
	}
	if err := Available(); err != nil {
		return nil, err
	}
	return create(ctx, execRunner, os.Getpid(), processAlive, hosts)
}

// processAlive tells whether pid runs (signal 0 checks without sending).
// A zombie counts as dead: an orphan killed with SIGKILL can stay one for a
// while, until init reaps it.
func processAlive(pid int) bool {
	if errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return !errors.Is(err, fs.ErrNotExist)
	}
	return !zombie(stat)
}

// create sweeps leftovers, claims a free slot and builds the network.
func create(ctx context.Context, run runner, pid int, alive func(int) bool, hosts []HostSpec) (*Network, error) {
	if err := sweep(ctx, run, alive); err != nil {
		return nil, err
	}
	for slot := range maxSlots {
		n := &Network{names: namesFor(pid, slot), hosts: append([]HostSpec(nil), hosts...), run: run}
		plan, err := setupPlan(n.names, hosts)
		if err != nil {
			return nil, err
		}
		// The bridge is the claim: if it exists, another network of this
		// process (or of an earlier one with the same pid) has the slot.
		if _, err := run(ctx, plan[0].args, plan[0].stdin); exists(err) {
			continue
		} else if err != nil {
			return nil, fmt.Errorf("netem: %s: %w", plan[0].what, err)
		}
		for _, s := range plan[1:] {
			if _, err := run(ctx, s.args, s.stdin); err != nil {
				err = fmt.Errorf("netem: %s: %w", s.what, err)
				if cerr := n.Close(); cerr != nil {
					err = errors.Join(err, fmt.Errorf("netem: tearing down after the failure: %w", cerr))
				}
				return nil, err
			}
		}
		return n, nil
	}
	return nil, fmt.Errorf("netem: all %d network slots of process %d are taken", maxSlots, pid)
}

// sweep removes the namespaces and links that processes now dead left
// behind, killing whatever still runs in those namespaces.
func sweep(ctx context.Context, run runner, alive func(int) bool) error {
	out, err := run(ctx, []string{"ip", "netns", "list"}, "")
	if err != nil {
		return fmt.Errorf("netem: list namespaces: %w", err)
	}
	var errs []error
	for _, ns := range leftovers(parseNetnsList(out), alive) {
		if err := killIn(ctx, run, ns); err != nil {
			errs = append(errs, err)
		}
		if _, err := run(ctx, []string{"ip", "netns", "del", ns}, ""); err != nil && !gone(err) {
			errs = append(errs, fmt.Errorf("netem: delete leftover namespace %s: %w", ns, err))
		}
	}
	out, err = run(ctx, []string{"ip", "-o", "link", "show"}, "")
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("netem: list links: %w", err))...)
	}
	for _, link := range leftovers(parseLinkList(out), alive) {
		if _, err := run(ctx, []string{"ip", "link", "del", link}, ""); err != nil && !gone(err) {
			errs = append(errs, fmt.Errorf("netem: delete leftover link %s: %w", link, err))
		}
	}
	return errors.Join(errs...)
}

// killIn kills every process in namespace ns: a namespace outlives its
// name while any process is in it, and so would its veth pair.
func killIn(ctx context.Context, run runner, ns string) error {
	out, err := run(ctx, []string{"ip", "netns", "pids", ns}, "")
	if gone(err) {
		return nil
	} else if err != nil {
		return fmt.Errorf("netem: list processes in %s: %w", ns, err)
	}
	for _, pid := range parsePids(out) {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("netem: kill process %d in %s: %w", pid, ns, err)
		}
	}
	return nil
}

// Len is the number of hosts.
func (n *Network) Len() int { return len(n.hosts) }

// Addr is host i's address, "198.18.0.<i+1>".
func (n *Network) Addr(i int) string { return addr(i) }

// HostAddr is the address host i of every network gets, as Addr: known
// before the network is made, to lay nodes out on the hosts.
func HostAddr(i int) string { return addr(i) }

// Iface is the name of the interface inside every host.
func (n *Network) Iface() string { return iface }

// Namespace is host i's network namespace, for "ip netns exec" and the like.
func (n *Network) Namespace(i int) string { return n.names.namespace(i) }

// Host is host i's spec: the one New was given, or the last SetRate's.
func (n *Network) Host(i int) HostSpec {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.hosts[i]
}

// SetRate reshapes host i's link to h while the network runs. Processes in
// the host keep their connections; the packets the old shapers held
// queued (at most their latency's worth) are dropped, and TCP resends
// them. On an error the host may be half reshaped, and Host still reports
// the old spec.
func (n *Network) SetRate(ctx context.Context, i int, h HostSpec) error {
	if i < 0 || i >= n.Len() {
		return fmt.Errorf("netem: host %d of %d", i, n.Len())
	}
	plan, err := ratePlan(n.names, i, h)
	if err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, s := range plan {
		// Deleting a qdisc that is not there: the side was unlimited.
		if _, err := n.run(ctx, s.args, s.stdin); err != nil && !(slices.Contains(s.args, "del") && noQdisc(err)) {
			return fmt.Errorf("netem: %s: %w", s.what, err)
		}
	}
	n.hosts[i] = h
	return nil
}

// Command is exec.CommandContext for a command run in host i (through
// "ip netns exec", which execs it: the process is the command itself).
func (n *Network) Command(ctx context.Context, i int, name string, arg ...string) *exec.Cmd {
	if i < 0 || i >= len(n.hosts) {
		panic(fmt.Sprintf("netem: host %d of %d", i, len(n.hosts)))
	}
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.Namespace(i), name}, arg...)...)
}

// Close kills whatever still runs in the hosts and removes the namespaces,
// the veth pairs and the bridge. It runs once; later calls return the
// first call's result.
func (n *Network) Close() error {
	n.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), teardownTimeout)
		defer cancel()
		var errs []error
		for i := range n.hosts {
			if err := killIn(ctx, n.run, n.Namespace(i)); err != nil {
				errs = append(errs, err)
			}
		}
		for _, s := range teardownPlan(n.names, len(n.hosts)) {
			if _, err := n.run(ctx, s.args, s.stdin); err != nil && !gone(err) {
				errs = append(errs, fmt.Errorf("netem: %s: %w", s.what, err))
			}
		}
		n.closeErr = errors.Join(errs...)
	})
	return n.closeErr
}
