package bench

import (
	"os"
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
	if _, err := w.result(); err == nil {
		t.Fatal("a window without marks has a result")
	}
	w.setPids([]int{selfPid()})
	out := w.writer()
	out.Write([]byte("progress: " + markTimedStart + "\n"))
	for deadline := time.Now().Add(300 * time.Millisecond); time.Now().Before(deadline); {
	}
	out.Write([]byte("progress: " + markTimedEnd + "\n"))
	got, err := w.result()
	if err != nil || got <= 0 || got > time.Minute {
		t.Fatalf("window %v, %v; want the CPU of a busy loop", got, err)
	}
	var late cpuWindow
	late.setPids([]int{selfPid()})
	late.writer().Write([]byte(markTimedEnd + "\n"))
	if _, err := late.result(); err == nil || !strings.Contains(err.Error(), "out of order") {
		t.Fatalf("an end without a start: %v", err)
	}
}

func selfPid() int { return os.Getpid() }
