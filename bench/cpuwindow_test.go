package bench

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestStatCPU(t *testing.T) {
	// Fields after the name: state ppid pgrp session tty tpgid flags
	// minflt cminflt majflt cmajflt utime stime ...
	const tail = " S 1 2 3 4 5 6 7 8 9 10 250 130 0 0 20 0"
	for _, tc := range []struct {
		name, stat string
		want       time.Duration
		err        bool
	}{
		{"plain", "42 (fpt)" + tail, 3800 * time.Millisecond, false},
		{"name with ) and spaces", "42 (a) b (c) d)" + tail, 3800 * time.Millisecond, false},
		{"no name", "42 fpt" + tail, 0, true},
		{"short", "42 (fpt) S 1 2", 0, true},
		{"not a number", "42 (fpt) S 1 2 3 4 5 6 7 8 9 10 x 130", 0, true},
	} {
		got, err := statCPU([]byte(tc.stat))
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("%s: %v, %v; want %v (error %v)", tc.name, got, err, tc.want, tc.err)
		}
	}
}

// The window is the CPU between the marks, read from /proc: this process
// burns some between them.
func TestCPUWindow(t *testing.T) {
	var w cpuWindow
	if _, err := w.result(nil); err == nil {
		t.Fatal("a window without marks has a result")
	}
	w.setPids([]int{selfPid()})
	out := w.writer()
	out.Write([]byte("progress: " + markTimedStart + "\n"))
	for deadline := time.Now().Add(300 * time.Millisecond); time.Now().Before(deadline); {
	}
	out.Write([]byte("progress: " + markTimedEnd + "\n"))
	got, err := w.result(nil)
	if err != nil || got <= 0 || got > time.Minute {
		t.Fatalf("window %v, %v; want the CPU of a busy loop", got, err)
	}
	var late cpuWindow
	late.setPids([]int{selfPid()})
	late.writer().Write([]byte(markTimedEnd + "\n"))
	if _, err := late.result(nil); err == nil || !strings.Contains(err.Error(), "out of order") {
		t.Fatalf("an end without a start: %v", err)
	}
}

// A process of the job that exits, and is reaped, before the end mark's
// line is read has its CPU from its exit status instead of losing the run's
// figure.
func TestCPUWindowProcessGone(t *testing.T) {
	child := exec.Command("sleep", "60")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	var w cpuWindow
	w.setPids([]int{selfPid(), child.Process.Pid})
	out := w.writer()
	out.Write([]byte(markTimedStart + "\n"))
	child.Process.Kill()
	child.Wait() // reaped: its /proc entry is gone
	out.Write([]byte(markTimedEnd + "\n"))
	const exitCPU = 7 * time.Second
	got, err := w.result(func(pid int) time.Duration {
		if pid != child.Process.Pid {
			t.Errorf("final CPU asked of process %d, not the one gone (%d)", pid, child.Process.Pid)
		}
		return exitCPU
	})
	if err != nil {
		t.Fatalf("a process reaped before the end mark: %v", err)
	}
	// This process's few ms within the window, plus the child's exit CPU
	// less the CPU it had at the start mark (a sleep: none).
	if got < exitCPU-time.Second || got > exitCPU+5*time.Second {
		t.Fatalf("window %v; want about the %v the exited process reported", got, exitCPU)
	}
}

func selfPid() int { return os.Getpid() }
