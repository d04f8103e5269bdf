package tests

import (
	"fmt"
	"net"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/internal/localcluster"
)

// tracker runs a job the way dmlc-core's local tracker (dmlc-submit
// --cluster local, tracker/dmlc_tracker/local.py and tracker.py) does:
// one command line for every process, run by bash; the scheduler gets
// DMLC_ROLE=scheduler, DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT,
// DMLC_NUM_WORKER and DMLC_NUM_SERVER; task i gets the same but the role,
// plus DMLC_TASK_ID=i, DMLC_ROLE (worker for i < DMLC_NUM_WORKER, server
// after) and DMLC_JOB_CLUSTER=local. taskOf maps localcluster's process
// names to task ids; env adds settings per process (nil: none).
type tracker struct {
	servers, workers int
	command          string
	taskOf           map[string]int
	env              map[string][]string
	common           []string
}

func (tr tracker) start(t *testing.T) *cluster {
	t.Helper()
	argv := []string{"bash", "-c", tr.command}
	lc, err := localcluster.Start(localcluster.Spec{
		Servers: tr.servers, Workers: tr.workers,
		Scheduler: argv, Server: argv, Worker: argv,
		Env: tr.common,
		Command: func(name string, argv []string) *exec.Cmd {
			cmd := exec.Command(argv[0], argv[1:]...)
			cmd.Env = tr.env[name]
			if task, ok := tr.taskOf[name]; ok {
				cmd.Env = append(cmd.Env, fmt.Sprintf("DMLC_TASK_ID=%d", task), "DMLC_JOB_CLUSTER=local")
			}
			return cmd
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lc.Kill)
	return &cluster{Cluster: lc, t: t}
}

// freePorts are n free control ports, each with its data port (the next
// one) free too, ascending.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	for len(ports) < n {
		p, err := localcluster.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(ports, func(q int) bool { return q >= p-1 && q <= p+1 }) {
			continue
		}
		if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+1)); err == nil {
			l.Close()
			ports = append(ports, p)
		}
	}
	slices.Sort(ports)
	return ports
}

var (
	workerRankRe  = regexp.MustCompile(`(?m)^worker (\d+): PASS`)
	startedRankRe = regexp.MustCompile(`msg=started .*?id=(server|worker)(\d+)\(`)
)

// A job launched as dmlc-submit --cluster local launches it, "fpt run
// test_kv_app" for every role, passes with each node at the rank its
// DMLC_TASK_ID gives (workers 0..W-1, servers W..W+S-1). The processes
// start in an order other than their ranks, on ports whose order gives
// ps-lite's (host, port) ranks the other way round, so that a rank not
// taken from DMLC_TASK_ID shows.
func TestDMLCLocalTracker(t *testing.T) {
	// localcluster starts server0, server1, worker0, worker1 in that order,
	// on ascending ports; the task ids run against it.
	taskOf := map[string]int{"worker0": 1, "worker1": 0, "server0": 3, "server1": 2}
	ports := freePorts(t, 4)
	env := map[string][]string{}
	for i, name := range []string{"server0", "server1", "worker0", "worker1"} {
		env[name] = []string{fmt.Sprintf("FPT_NODE_PORT=%d", ports[i])}
	}
	c := tracker{
		servers: 2, workers: 2, taskOf: taskOf, env: env,
		command: fmt.Sprintf("%s run %s -iters 2 -max-bytes 65536 -classic 1", bin.fpt, bin.app),
		common:  []string{"PS_VERBOSE=1", "FPT_START_TIMEOUT=60"},
	}.start(t)
	c.waitAll(2 * time.Minute)

	for name, task := range taskOf {
		p := c.proc(name)
		if strings.Contains(p.Stderr.String(), "unknown variable") {
			t.Errorf("%s warned about a variable the tracker sets:\n%s", name, p.Stderr.String())
		}
		if strings.HasPrefix(name, "worker") {
			m := workerRankRe.FindStringSubmatch(p.Stdout.String())
			if m == nil || m[1] != fmt.Sprint(task) {
				t.Errorf("%s (DMLC_TASK_ID=%d) passed as %v, want worker %d:\n%s", name, task, m, task, tail(p.Stdout.String()))
			}
			continue
		}
		m := startedRankRe.FindStringSubmatch(p.Stderr.String())
		if want := fmt.Sprint(task - 2); m == nil || m[1] != "server" || m[2] != want {
			t.Errorf("%s (DMLC_TASK_ID=%d) started as %v, want server %s", name, task, m, want)
		}
	}
	// The scheduler ran the node, not test_kv_app.
	if out := c.proc("scheduler").Stdout.String(); strings.Contains(out, "PASS") {
		t.Errorf("the scheduler ran the worker program:\n%s", out)
	}
}

// Two workers pinned to one rank (DMLC_WORKER_ID, as Kubernetes and
// BytePS launches set it): the start fails at once, every process exits
// non-zero, and the scheduler names the rank and both nodes.
func TestDuplicateRank(t *testing.T) {
	c := tracker{
		servers: 1, workers: 2,
		command: fmt.Sprintf("%s run %s -iters 2", bin.fpt, bin.app),
		env: map[string][]string{
			"worker0": {"DMLC_WORKER_ID=0", "DMLC_SERVER_ID=0"},
			"worker1": {"DMLC_WORKER_ID=0", "DMLC_SERVER_ID=0"},
			"server0": {"DMLC_SERVER_ID=0"},
		},
		common: []string{"PS_VERBOSE=1", "FPT_START_TIMEOUT=60"},
	}.start(t)
	for _, p := range c.Procs {
		if !p.Wait(30 * time.Second) {
			c.dump()
			t.Fatalf("%s still running 30 s after a duplicate rank", p.Name)
		}
		if p.ExitCode() == 0 {
			c.dump()
			t.Errorf("%s exited 0", p.Name)
		}
	}
	mustContain(t, "scheduler's stderr", c.proc("scheduler").Stderr.String(), "worker rank 0 asked for twice: by worker0(9)@127.0.0.1:", "and by worker0(9)@127.0.0.1:")
	for _, name := range []string{"worker0", "worker1"} {
		mustContain(t, name+"'s stderr", c.proc(name).Stderr.String(), "worker rank 0 asked for twice")
	}
}
