// Package localcluster starts a whole fpt cluster of separate processes on
// loopback, each configured only through the ps-lite launch environment
// (DMLC_*), and collects their output and exit status. The integration tests
// and "fpt bench" use it; it is how a user would start a cluster by hand.
package localcluster

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Spec describes a cluster.
type Spec struct {
	Servers, Workers int
	// Scheduler and Server are the command (path and arguments) that runs
	// those roles; Worker runs a worker. The role comes from DMLC_ROLE.
	Scheduler, Server, Worker []string
	// Env is extra KEY=VALUE settings for every process. Unless it (or
	// this process's environment) sets FPT_CLUSTER_SECRET or
	// FPT_CLUSTER_SECRET_FILE, or NoSecret is set, Start gives the cluster
	// a random secret of its own, as scripts/run_test.sh does.
	Env []string
	// NoSecret runs the cluster without a secret (protected mode: loopback
	// only), to test that mode.
	NoSecret bool
	// RootURI is the scheduler's address as the others reach it
	// (default 127.0.0.1).
	RootURI string
	// Command, if set, makes the command of each named process, to run
	// it elsewhere (in an emulated host, say); nil runs argv as it is.
	// Settings in the command's Env are added to the process's, last.
	Command func(name string, argv []string) *exec.Cmd
	// Stdout and Stderr, if set, give a writer per process name that also
	// receives that stream as it is written (to show progress live); the
	// Proc's buffers get everything either way. nil writers are skipped.
	Stdout, Stderr func(name string) io.Writer
}

// Proc is one process of the cluster.
type Proc struct {
	Name     string
	Cmd      *exec.Cmd
	Stdout   Buffer
	Stderr   Buffer
	done     chan struct{}
	code     int
	exitedAt time.Time
	cpu      time.Duration
}

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// ExitCode is the exit status once Done is closed (-1 if killed by a signal).
func (p *Proc) ExitCode() int { <-p.done; return p.code }

// ExitedAt is when the process exited, once Done is closed.
func (p *Proc) ExitedAt() time.Time { <-p.done; return p.exitedAt }

// CPU is the user plus system CPU time the process used, once Done is
// closed (its rusage; children it waited for included, as the kernel
// counts them).
func (p *Proc) CPU() time.Duration { <-p.done; return p.cpu }

// Wait waits up to timeout for the process to exit.
func (p *Proc) Wait(timeout time.Duration) bool {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
		return true
	case <-t.C:
		return false
	}
}

// Kill sends SIGKILL.
func (p *Proc) Kill() error { return p.Cmd.Process.Signal(syscall.SIGKILL) }

// Terminate sends the process SIGTERM, as a launcher scaling a job down
// does.
func (p *Proc) Terminate() error { return p.Cmd.Process.Signal(syscall.SIGTERM) }

// Cluster is a running cluster.
type Cluster struct {
	Port  int     // the scheduler's port
	Procs []*Proc // scheduler, servers, then workers, then those Add started

	spec    Spec
	env     []string // every process's environment but DMLC_ROLE
	command func(name string, argv []string) *exec.Cmd
	started map[string]int // processes started per role
}

// Start starts the scheduler, the servers and the workers, named
// "scheduler", "server0".., "worker0".. (process names, not ranks: the
// scheduler assigns ranks).
func Start(s Spec) (*Cluster, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	root := s.RootURI
	if root == "" {
		root = "127.0.0.1"
	}
	command := s.Command
	if command == nil {
		command = func(_ string, argv []string) *exec.Cmd { return exec.Command(argv[0], argv[1:]...) }
	}
	env := append(os.Environ(),
		"DMLC_PS_ROOT_URI="+root,
		"DMLC_PS_ROOT_PORT="+strconv.Itoa(port),
		"DMLC_NUM_SERVER="+strconv.Itoa(s.Servers),
		"DMLC_NUM_WORKER="+strconv.Itoa(s.Workers),
	)
	env = append(env, s.Env...)
	if !s.NoSecret && !hasSecret(env) {
		secret, err := NewSecret()
		if err != nil {
			return nil, err
		}
		env = append(env, "FPT_CLUSTER_SECRET="+secret)
	}
	c := &Cluster{Port: port, spec: s, env: env, command: command, started: make(map[string]int)}
	_, err = c.start("scheduler", "scheduler", s.Scheduler)
	for i := 0; err == nil && i < s.Servers; i++ {
		_, err = c.Add("server")
	}
	for i := 0; err == nil && i < s.Workers; i++ {
		_, err = c.Add("worker")
	}
	if err != nil {
		c.Kill()
		return nil, err
	}
	return c, nil
}

// Add starts one more server or worker (role) with the cluster's
// environment, secret and command, as a user would start a process by hand
// into a running job (a server joining it, say). It is named after its
// role and how many of that role the cluster started before: the third
// server is "server2", whatever became of the first two. Add is not safe
// for use alongside the Cluster's other methods.
func (c *Cluster) Add(role string) (*Proc, error) {
	var argv []string
	switch role {
	case "server":
		argv = c.spec.Server
	case "worker":
		argv = c.spec.Worker
	default:
		return nil, fmt.Errorf("localcluster: add a %q: want a server or a worker", role)
	}
	return c.start(fmt.Sprintf("%s%d", role, c.started[role]), role, argv)
}

// start starts one process of the cluster.
func (c *Cluster) start(name, role string, argv []string) (*Proc, error) {
	if len(argv) == 0 {
		return nil, fmt.Errorf("localcluster: no command for the %s", role)
	}
	p := &Proc{Name: name, done: make(chan struct{})}
	p.Cmd = c.command(name, argv)
	// What the Command hook set comes last, so it wins.
	p.Cmd.Env = append(append(append([]string(nil), c.env...), "DMLC_ROLE="+role), p.Cmd.Env...)
	p.Cmd.Stdout, p.Cmd.Stderr = tee(&p.Stdout, c.spec.Stdout, name), tee(&p.Stderr, c.spec.Stderr, name)
	// Children die with the parent, whatever kills it.
	p.Cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.Cmd.Start(); err != nil {
		return nil, fmt.Errorf("localcluster: start %s: %w", name, err)
	}
	go func() {
		err := p.Cmd.Wait()
		p.exitedAt = time.Now()
		if ps := p.Cmd.ProcessState; ps != nil {
			if ru, ok := ps.SysUsage().(*syscall.Rusage); ok {
				p.cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
			}
		}
		var ee *exec.ExitError
		switch {
		case err == nil:
		case errors.As(err, &ee):
			p.code = ee.ExitCode()
		default:
			p.code = -1
		}
		close(p.done)
	}()
	c.started[role]++
	c.Procs = append(c.Procs, p)
	return p, nil
}

// tee is buf, and also extra(name)'s writer when there is one.
func tee(buf *Buffer, extra func(string) io.Writer, name string) io.Writer {
	if extra == nil {
		return buf
	}
	w := extra(name)
	if w == nil {
		return buf
	}
	return io.MultiWriter(buf, w)
}

// CPU is the user plus system CPU time of every process, once all have
// exited.
func (c *Cluster) CPU() time.Duration {
	var sum time.Duration
	for _, p := range c.Procs {
		sum += p.CPU()
	}
	return sum
}

// Proc returns the process with the given name, or nil.
func (c *Cluster) Proc(name string) *Proc {
	for _, p := range c.Procs {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// Wait waits up to timeout for every process and reports the first that
// is still running or exited non-zero.
func (c *Cluster) Wait(timeout time.Duration) error { return c.WaitExcept(timeout, nil) }

// WaitExcept is Wait for every process but lost (one the caller killed,
// say), whose exit it does not wait for or judge; nil waits for all.
func (c *Cluster) WaitExcept(timeout time.Duration, lost *Proc) error {
	deadline := time.Now().Add(timeout)
	for _, p := range c.Procs {
		if p != lost && !p.Wait(time.Until(deadline)) {
			return fmt.Errorf("localcluster: %s still running after %s", p.Name, timeout)
		}
	}
	for _, p := range c.Procs {
		if p != lost && p.code != 0 {
			return fmt.Errorf("localcluster: %s exited with status %d: %s", p.Name, p.code, lastLine(p.Stderr.String()))
		}
	}
	return nil
}

// Kill kills every process still running and waits for them.
func (c *Cluster) Kill() {
	for _, p := range c.Procs {
		select {
		case <-p.done:
		default:
			_ = p.Kill()
			<-p.done
		}
	}
}

// FreePort returns a TCP port, and the one after it, that nothing
// listens on now, below Linux's ephemeral ports (32768 and up) and the
// engines' (20000 and up): a port the kernel hands out for :0 is one any
// outgoing connection may take before the test's node binds it.
func FreePort() (int, error) {
	const first, last = 10000, 19998
	for range 200 {
		p := first + 2*mrand.IntN((last-first)/2+1)
		if bindable(p) && bindable(p+1) {
			return p, nil
		}
	}
	return 0, fmt.Errorf("localcluster: free port: none free among 200 tries in %d-%d", first, last+1)
}

// bindable reports whether port can be listened on, on every interface.
func bindable(port int) bool {
	l, err := net.Listen("tcp", fmt.Sprintf(":%d", port))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// Buffer collects a process's output while it runs.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func lastLine(s string) string {
	s = string(bytes.TrimSpace([]byte(s)))
	if i := bytes.LastIndexByte([]byte(s), '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// NewSecret returns a fresh random cluster secret (32 hex digits).
func NewSecret() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("localcluster: cluster secret: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// hasSecret reports whether env (KEY=VALUE) names a cluster secret.
func hasSecret(env []string) bool {
	for _, kv := range env {
		if strings.HasPrefix(kv, "FPT_CLUSTER_SECRET=") || strings.HasPrefix(kv, "FPT_CLUSTER_SECRET_FILE=") {
			return true
		}
	}
	return false
}
