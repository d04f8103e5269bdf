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
