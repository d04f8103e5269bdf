package tests

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/internal/localcluster"
)

// A whole cluster of real processes trains and every worker verifies
// every value, on both vans and both float types.
func TestClusterTrainsAndVerifies(t *testing.T) {
	tests := []struct {
		name string
		env  []string
		args []string
	}{
		{"epoll-float32", []string{"FPT_VAN=epoll"}, nil},
		{"netconn-float32", []string{"FPT_VAN=netconn"}, nil},
		{"epoll-float64-small-partitions", []string{"FPT_VAN=epoll", "FPT_PARTITION_BYTES=65536"}, []string{"-dtype", "float64", "-tensors", "5"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"-iters", "5", "-max-bytes", "4194304"}, tt.args...)
			c := startCluster(t, spec{servers: 2, workers: 2, env: tt.env, appArgs: args})
			c.waitAll(3 * time.Minute)
			for _, w := range []string{"worker0", "worker1"} {
				out := c.proc(w).Stdout.String()
				mustContain(t, w+" stdout", out, "iteration 5/5 verified", "PASS", "classic Push/Pull/PushPull over 2 servers verified")
			}
		})
	}
}

// Uneven clusters: more servers than workers and a single worker.
func TestClusterShapes(t *testing.T) {
	for _, s := range []spec{{servers: 3, workers: 1}, {servers: 1, workers: 3}} {
		t.Run(fmt.Sprintf("%ds%dw", s.servers, s.workers), func(t *testing.T) {
			s.appArgs = []string{"-iters", "3", "-max-bytes", "1048576", "-quiet"}
			c := startCluster(t, s)
			c.waitAll(3 * time.Minute)
			for i := range s.workers {
				mustContain(t, "worker stdout", c.proc(fmt.Sprintf("worker%d", i)).Stdout.String(), "PASS")
			}
		})
	}
}

// kill -9 of a server or a worker mid-run: every other process exits
// non-zero within 30 s, naming the dead node.
func TestKillNodeStopsEveryone(t *testing.T) {
	for _, victimName := range []string{"server1", "worker1"} {
		t.Run(victimName, func(t *testing.T) {
			c := startCluster(t, spec{servers: 2, workers: 2, appArgs: []string{"-iters", "100000", "-max-bytes", "1048576"}})
			addr, killed := c.killMidRun(victimName)
			victim := c.proc(victimName)
			for _, p := range c.Procs {
				if p == victim {
					continue
				}
				if !p.Wait(30*time.Second - time.Since(killed)) {
					c.dump()
					t.Fatalf("%s still running 30 s after %s was killed", p.Name, victimName)
				}
				if p.ExitCode() == 0 {
					t.Errorf("%s exited 0 after %s died", p.Name, victimName)
				}
				t.Logf("%s exited %d after %s", p.Name, p.ExitCode(), p.ExitedAt().Sub(killed).Round(time.Millisecond))
				mustContain(t, p.Name+" stderr", p.Stderr.String(), addr)
			}
		})
	}
}

// kill -9 of the scheduler: the servers and workers notice the silence and
// exit non-zero within 30 s, also under FPT_ON_SERVER_LOSS=retry (a
// restartable scheduler is out of scope: its loss ends the job).
func TestKillSchedulerStopsEveryone(t *testing.T) {
	for _, onLoss := range []string{"fail", "retry"} {
		t.Run(onLoss, func(t *testing.T) {
			c := startCluster(t, spec{servers: 1, workers: 2, appArgs: []string{"-iters", "100000", "-max-bytes", "65536"},
				env: []string{"PS_HEARTBEAT_TIMEOUT=5", "FPT_ON_SERVER_LOSS=" + onLoss}})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if _, err := waitOutput(ctx, c.proc("worker0"), regexp.MustCompile(`init: `)); err != nil {
				c.dump()
				t.Fatal(err)
			}
			killed := time.Now()
			if err := c.proc("scheduler").Kill(); err != nil {
				t.Fatal(err)
			}
			for _, p := range c.Procs[1:] {
				if !p.Wait(30*time.Second - time.Since(killed)) {
					c.dump()
					t.Fatalf("%s still running 30 s after the scheduler was killed", p.Name)
				}
				if p.ExitCode() == 0 {
					t.Errorf("%s exited 0 after the scheduler died", p.Name)
				}
				mustContain(t, p.Name+" stderr", p.Stderr.String(), "scheduler")
			}
		})
	}
}

// Random bytes, a truncated header and a header announcing a huge payload,
// sent to a server's data port while the cluster trains, do not bring it
// down: the run completes and verifies.
func TestGarbageOnDataPort(t *testing.T) {
	c := startCluster(t, spec{servers: 2, workers: 2, appArgs: []string{"-iters", "20", "-max-bytes", "1048576", "-quiet"}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, err := waitOutput(ctx, c.proc("server0"), dataRe)
	if err != nil {
		t.Fatal(err)
	}
	junk := make([]byte, 1<<20)
	rand.Read(junk)
	huge := make([]byte, 72)
	binary.LittleEndian.PutUint32(huge, 0x31545046)
	huge[4] = 1
	binary.LittleEndian.PutUint64(huge[48:], 1<<62)
	for _, payload := range [][]byte{junk, junk[:13], huge, []byte("GET / HTTP/1.0\r\n\r\n")} {
		conn, err := net.Dial("tcp", m[1])
		if err != nil {
			t.Fatal(err)
		}
		conn.Write(payload)
		conn.Close()
	}
	c.waitAll(3 * time.Minute)
	mustContain(t, "worker0 stdout", c.proc("worker0").Stdout.String(), "PASS")
}

// A missing or invalid variable: a message naming it and exit code 2.
func TestBadEnvironment(t *testing.T) {
	full := []string{"DMLC_ROLE=server", "DMLC_PS_ROOT_URI=127.0.0.1", "DMLC_PS_ROOT_PORT=9000", "DMLC_NUM_SERVER=1", "DMLC_NUM_WORKER=1"}
	tests := []struct {
		name   string
		bin    string
		drop   string
		set    string
		expect string
	}{
		{"no role", bin.fpt, "DMLC_ROLE", "", "DMLC_ROLE"},
		{"no root", bin.fpt, "DMLC_PS_ROOT_URI", "", "DMLC_PS_ROOT_URI"},
		{"bad port", bin.fpt, "", "DMLC_PS_ROOT_PORT=http", "DMLC_PS_ROOT_PORT"},
		{"bad workers", bin.app, "", "DMLC_NUM_WORKER=-1", "DMLC_NUM_WORKER"},
		{"bad van", bin.app, "", "FPT_VAN=rdma", "FPT_VAN"},
		{"worker role for fpt", bin.fpt, "", "DMLC_ROLE=worker", "workers are training programs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var env []string
			for _, kv := range full {
				if tt.drop == "" || !strings.HasPrefix(kv, tt.drop+"=") {
					env = append(env, kv)
				}
			}
			if tt.set != "" {
				env = append(env, tt.set)
			}
			cmd := exec.Command(tt.bin)
			cmd.Env = env
			out, err := cmd.CombinedOutput()
			ee, ok := err.(*exec.ExitError)
			if !ok || ee.ExitCode() != 2 {
				t.Fatalf("exit = %v; want status 2\n%s", err, out)
			}
			mustContain(t, "output", string(out), tt.expect)
		})
	}
}

// A scheduler whose port is taken says so and exits non-zero at once.
func TestSchedulerPortInUse(t *testing.T) {
	l, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	cmd := exec.Command(bin.fpt)
	cmd.Env = []string{"DMLC_ROLE=scheduler", "DMLC_PS_ROOT_URI=127.0.0.1", fmt.Sprintf("DMLC_PS_ROOT_PORT=%d", port), "DMLC_NUM_SERVER=1", "DMLC_NUM_WORKER=1"}
	done := make(chan struct{})
	var out []byte
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		t.Fatal("scheduler did not exit with its port taken")
	}
	if err == nil {
		t.Fatal("scheduler exited 0 with its port taken")
	}
	mustContain(t, "output", string(out), "DMLC_PS_ROOT_PORT", "in use")
}

// A cluster that never completes (one worker of two never comes): when the
// scheduler gives up, the nodes that did register exit at once, saying why,
// instead of waiting out their own start timeout.
func TestIncompleteClusterGivesUp(t *testing.T) {
	port, err := localcluster.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	env := []string{"DMLC_PS_ROOT_URI=127.0.0.1", fmt.Sprintf("DMLC_PS_ROOT_PORT=%d", port), "DMLC_NUM_SERVER=1", "DMLC_NUM_WORKER=2"}
	run := func(role, path, timeout string) *exec.Cmd {
		cmd := exec.Command(path)
		cmd.Env = append(append([]string{"DMLC_ROLE=" + role, "FPT_START_TIMEOUT=" + timeout}, env...), "PATH="+os.Getenv("PATH"))
		return cmd
	}
	sched := run("scheduler", bin.fpt, "2")
	server := run("server", bin.fpt, "60")
	worker := run("worker", bin.app, "60")
	var outs [3]localcluster.Buffer
	start := time.Now()
	for i, cmd := range []*exec.Cmd{sched, server, worker} {
		cmd.Stdout, cmd.Stderr = &outs[i], &outs[i]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer cmd.Process.Kill()
	}
	for i, cmd := range []*exec.Cmd{sched, server, worker} {
		err := cmd.Wait()
		if err == nil {
			t.Errorf("%s exited 0", cmd.Args[0])
		}
		if i > 0 {
			mustContain(t, "node output", outs[i].String(), "gave up", "1 of 2 workers")
		}
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("took %s to give up", d)
	}
}
