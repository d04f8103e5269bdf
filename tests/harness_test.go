package tests

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/internal/localcluster"
)

// binaries built once for the whole package by TestMain, in dir.
type binaries struct{ dir, fpt, app string }

var bin binaries

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fpt-tests-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	build := exec.Command("go", "build", "-o", dir+"/", "./cmd/fpt", "./tests/test_kv_app")
	build.Dir = ".."
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building the binaries:", err)
		os.Exit(1)
	}
	bin = binaries{dir: dir, fpt: filepath.Join(dir, "fpt"), app: filepath.Join(dir, "test_kv_app")}
	// A whole run builds the C library twice (libPrograms), minutes on a
	// small machine: the builds start now, beside the first tests, which
	// mostly wait on their clusters. A run of chosen tests builds only
	// what they ask for.
	flag.Parse()
	prebuilt := make(chan struct{})
	if flag.Lookup("test.run").Value.String() == "" {
		go func() {
			defer close(prebuilt)
			libDefault()
			libCgocheck2()
		}()
	} else {
		close(prebuilt)
	}
	code := m.Run()
	<-prebuilt
	os.RemoveAll(dir)
	os.Exit(code)
}

// spec describes a test cluster: fpt runs the scheduler and servers,
// test_kv_app the workers.
type spec struct {
	servers, workers int
	env              []string // extra KEY=VALUE
	appArgs          []string // test_kv_app flags
}

type cluster struct {
	*localcluster.Cluster
	t *testing.T
}

func startCluster(t *testing.T, s spec) *cluster {
	t.Helper()
	lc, err := localcluster.Start(localcluster.Spec{
		Servers: s.servers, Workers: s.workers,
		Scheduler: []string{bin.fpt}, Server: []string{bin.fpt},
		Worker: append([]string{bin.app}, s.appArgs...),
		Env:    append([]string{"PS_VERBOSE=1", "FPT_START_TIMEOUT=60"}, s.env...),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lc.Kill)
	return &cluster{Cluster: lc, t: t}
}

func (c *cluster) proc(name string) *localcluster.Proc {
	c.t.Helper()
	p := c.Proc(name)
	if p == nil {
		c.t.Fatalf("no process %s", name)
	}
	return p
}

// waitAll fails the test, showing every process's output, unless all exit 0
// within timeout.
func (c *cluster) waitAll(timeout time.Duration) {
	c.t.Helper()
	if err := c.Wait(timeout); err != nil {
		c.dump()
		c.t.Fatal(err)
	}
}

func (c *cluster) dump() {
	for _, p := range c.Procs {
		c.t.Logf("---- %s stdout:\n%s\n---- %s stderr:\n%s", p.Name, tail(p.Stdout.String()), p.Name, tail(p.Stderr.String()))
	}
}

// tail is the end of a process's output; a crash's first lines (a Go
// panic or fatal error, whose goroutine dump would push them out) are
// kept ahead of it.
func tail(s string) string {
	const max = 4000
	if len(s) <= max {
		return s
	}
	end := "..." + s[len(s)-max:]
	for _, mark := range []string{"panic: ", "fatal error: ", "SIGSEGV", "unexpected signal"} {
		if i := strings.Index(s, mark); i >= 0 && i < len(s)-max {
			return s[i:min(i+max/2, len(s)-max)] + "\n" + end
		}
	}
	return end
}

// waitOutput waits until p's stdout or stderr matches re.
func waitOutput(ctx context.Context, p *localcluster.Proc, re *regexp.Regexp) ([]string, error) {
	for {
		if m := re.FindStringSubmatch(p.Stdout.String() + p.Stderr.String()); m != nil {
			return m, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%s never printed %q: %w", p.Name, re, ctx.Err())
		case <-p.Done():
			if m := re.FindStringSubmatch(p.Stdout.String() + p.Stderr.String()); m != nil {
				return m, nil
			}
			return nil, fmt.Errorf("%s exited (%d) without printing %q", p.Name, p.ExitCode(), re)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

var (
	controlRe = regexp.MustCompile(`msg=registering .*control=tcp://([0-9.]+:[0-9]+)`)
	dataRe    = regexp.MustCompile(`msg=registering .*data=([0-9.]+:[0-9]+)`)
)

// killMidRun kills the named process with SIGKILL once worker0 is into its
// third iteration, and returns the victim's control address (which the
// survivors' errors name) and when it was killed.
func (c *cluster) killMidRun(victim string) (addr string, killed time.Time) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := c.proc(victim)
	m, err := waitOutput(ctx, p, controlRe)
	if err != nil {
		c.t.Fatal(err)
	}
	if _, err := waitOutput(ctx, c.proc("worker0"), regexp.MustCompile(`iteration 3/`)); err != nil {
		c.dump()
		c.t.Fatal(err)
	}
	killed = time.Now()
	if err := p.Kill(); err != nil {
		c.t.Fatal(err)
	}
	return m[1], killed
}

// awaitFailed waits for each named process to exit with status 1 within
// 30 s of killed (a peer's death must end it, not hang it or crash it) and
// returns its stderr.
func (c *cluster) awaitFailed(killed time.Time, name string) (stderr string) {
	c.t.Helper()
	p := c.proc(name)
	if !p.Wait(30*time.Second - time.Since(killed)) {
		c.dump()
		c.t.Fatalf("%s still running 30 s after the kill", name)
	}
	if p.ExitCode() != 1 {
		c.dump()
		c.t.Fatalf("%s exited %d, want 1", name, p.ExitCode())
	}
	stderr = p.Stderr.String()
	c.t.Logf("%s exited 1 after %s: %s", name, p.ExitedAt().Sub(killed).Round(time.Millisecond), lastLine(stderr))
	return stderr
}

func mustContain(t *testing.T, what, s string, subs ...string) {
	t.Helper()
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			t.Errorf("%s does not contain %q:\n%s", what, sub, tail(s))
		}
	}
}
