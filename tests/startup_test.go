package tests

import (
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/internal/localcluster"
)

// Under a cluster engine the servers and workers often start before their
// scheduler: they wait for it (its port refuses them meanwhile), and the
// job runs once it is up.
func TestStartBeforeScheduler(t *testing.T) {
	const late = 5 * time.Second
	lc, err := localcluster.Start(localcluster.Spec{
		Servers: 2, Workers: 2,
		Scheduler: []string{bin.fpt}, Server: []string{bin.fpt},
		Worker: []string{bin.app, "-iters", "3", "-max-bytes", "65536", "-quiet"},
		Env:    []string{"PS_VERBOSE=1", "FPT_START_TIMEOUT=60"},
		// The scheduler starts late, the others at once.
		Command: func(name string, argv []string) *exec.Cmd {
			if name != "scheduler" {
				return exec.Command(argv[0], argv[1:]...)
			}
			return exec.Command("sh", append([]string{"-c", `sleep 5 && exec "$@"`, "sh"}, argv...)...)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lc.Kill)
	c := &cluster{Cluster: lc, t: t}
	c.waitAll(late + 30*time.Second)
	mustContain(t, "server0 stderr", c.proc("server0").Stderr.String(), "the scheduler does not take connections yet")
	mustContain(t, "worker0 stdout", c.proc("worker0").Stdout.String(), "PASS")
}

// A scheduler that never comes fails the node after FPT_START_TIMEOUT
// with status 1 (a failure to start, which a restart policy retries; 2 is
// for configuration errors), naming the address: a name that never
// resolves (the scheduler waits for its own the same way), or a port
// that refuses every connection.
func TestStartNoScheduler(t *testing.T) {
	const host = "fpt-no-such-host.invalid"
	port, err := localcluster.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, role, root string
		wants            []string
	}{
		{"server, name never resolves", "server", host,
			[]string{"DMLC_PS_ROOT_URI=" + host, "does not resolve after 1.5s", "waiting for a name to resolve"}},
		{"scheduler, own name never resolves", "scheduler", host,
			[]string{"DMLC_PS_ROOT_URI=" + host, "does not resolve after 1.5s", "waiting for a name to resolve"}},
		{"server, port refuses", "server", "127.0.0.1",
			[]string{fmt.Sprintf("the scheduler at 127.0.0.1:%d never took a connection in 1.5s", port), "does not take connections yet"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(bin.fpt)
			cmd.Env = []string{"DMLC_ROLE=" + tt.role, "DMLC_PS_ROOT_URI=" + tt.root, "DMLC_PS_ROOT_PORT=" + strconv.Itoa(port),
				"DMLC_NUM_SERVER=1", "DMLC_NUM_WORKER=1", "FPT_START_TIMEOUT=1.5", "FPT_CLUSTER_SECRET=0123456789abcdef0123456789abcdef"}
			start := time.Now()
			out, err := cmd.CombinedOutput()
			took := time.Since(start)
			code := cmd.ProcessState.ExitCode()
			if code != 1 {
				t.Fatalf("exit status %d (%v), want 1:\n%s", code, err, out)
			}
			if took < 1500*time.Millisecond {
				t.Errorf("gave up after %s, before FPT_START_TIMEOUT (1.5 s):\n%s", took, out)
			}
			for _, want := range tt.wants {
				if !strings.Contains(string(out), want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
		})
	}
}
