package localcluster

import (
	"io"
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
