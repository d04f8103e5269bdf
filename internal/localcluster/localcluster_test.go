package localcluster

import (
	"io"
	"strings"
	"testing"
	"time"
)

// Every process's CPU time is its rusage, and a stream given a tee reaches
// both the tee and the process's buffer.
func TestCPUAndTee(t *testing.T) {
	spin := `i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; echo "$DMLC_ROLE done" >&2`
	sh := []string{"sh", "-c", spin}
	var seen Buffer
	c, err := Start(Spec{
		Servers: 1, Workers: 1, Scheduler: sh, Server: sh, Worker: sh,
		Stderr: func(name string) io.Writer {
			if name == "worker0" {
				return &seen
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Wait(time.Minute); err != nil {
		t.Fatal(err)
	}
	var sum time.Duration
	for _, p := range c.Procs {
		if p.CPU() <= 0 {
			t.Errorf("%s: CPU %v after a busy loop, want positive", p.Name, p.CPU())
		}
		sum += p.CPU()
	}
	if c.CPU() != sum {
		t.Errorf("cluster CPU %v, want the sum %v", c.CPU(), sum)
	}
	if got := seen.String(); got != "worker done\n" {
		t.Errorf("worker0's tee got %q, want %q", got, "worker done\n")
	}
	if got := c.Proc("worker0").Stderr.String(); got != "worker done\n" {
		t.Errorf("worker0's buffer got %q", got)
	}
	if got := c.Proc("server0").Stderr.String(); got != "server done\n" {
		t.Errorf("server0's buffer got %q", got)
	}
}

// WaitExcept judges every process but the one the caller killed: that
// one's death is no failure, another's non-zero exit is.
func TestWaitExcept(t *testing.T) {
	for _, tc := range []struct {
		name    string
		worker  string // the worker's shell command
		wantErr bool
	}{
		{"survivors exit 0", "exit 0", false},
		{"a survivor fails", "exit 3", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Start(Spec{Servers: 1, Workers: 1,
				Scheduler: []string{"true"}, Server: []string{"sleep", "60"}, Worker: []string{"sh", "-c", tc.worker}})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Kill()
			victim := c.Proc("server0")
			if err := victim.Kill(); err != nil {
				t.Fatal(err)
			}
			err = c.WaitExcept(time.Minute, victim)
			if (err != nil) != tc.wantErr {
				t.Errorf("WaitExcept = %v, want an error: %v", err, tc.wantErr)
			}
			if err := c.Wait(time.Minute); err == nil {
				t.Error("Wait judging the killed server too: no error")
			}
		})
	}
}

// A process Add starts into a running cluster gets the cluster's
// environment (root, secret, sizes) and its role, and the next name of
// that role; only servers and workers are added.
func TestAdd(t *testing.T) {
	echo := []string{"sh", "-c", `echo "$DMLC_ROLE $DMLC_PS_ROOT_PORT $DMLC_NUM_SERVER $FPT_CLUSTER_SECRET"`}
	c, err := Start(Spec{Servers: 2, Workers: 1, Scheduler: []string{"true"}, Server: echo, Worker: echo})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Kill()
	for _, tc := range []struct{ role, name string }{
		{"server", "server2"},
		{"worker", "worker1"},
		{"server", "server3"},
	} {
		p, err := c.Add(tc.role)
		if err != nil {
			t.Fatal(err)
		}
		if p.Name != tc.name || c.Proc(tc.name) != p {
			t.Errorf("Add(%q) started %q, want %q, found by name", tc.role, p.Name, tc.name)
		}
	}
	if _, err := c.Add("scheduler"); err == nil {
		t.Error("Add(scheduler): no error")
	}
	if err := c.Wait(time.Minute); err != nil {
		t.Fatal(err)
	}
	first := c.Proc("server0").Stdout.String()
	if !strings.HasPrefix(first, "server ") || len(strings.Fields(first)) != 4 {
		t.Fatalf("server0 printed %q, want its role, root port, server count and secret", first)
	}
	for name, want := range map[string]string{"server3": first, "worker1": "worker" + strings.TrimPrefix(first, "server")} {
		if got := c.Proc(name).Stdout.String(); got != want {
			t.Errorf("%s printed %q, want %q", name, got, want)
		}
	}
}
