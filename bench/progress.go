package bench

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// progressMark starts the lines a bench worker writes to its stderr for
// the bench to relay as progress: the worker's stderr also carries its
// log, which is not progress.
const progressMark = "fpt-bench-progress: "

// progress writes progress lines to w (stderr): time since the bench
// started, which run, and what it is doing.
type progress struct {
	mu    sync.Mutex
	w     io.Writer
	start time.Time
	now   func() time.Time
}

func newProgress(w io.Writer) *progress {
	return &progress{w: w, start: time.Now(), now: time.Now}
}

// printf writes one line about run.
func (p *progress) printf(run, format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "fpt bench: [%6.1fs] %s: %s\n", p.now().Sub(p.start).Seconds(), run, fmt.Sprintf(format, args...))
}

// relay is a writer for a worker's stderr that passes its progress lines
// on as run's progress and drops the rest.
func (p *progress) relay(run string) io.Writer {
	return &lineWriter{line: func(l string) {
		if msg, ok := strings.CutPrefix(l, progressMark); ok {
			p.printf(run, "%s", msg)
		}
	}}
}

// marked is a writer, for a worker, that writes each line to w behind
// progressMark.
func marked(w io.Writer) io.Writer {
	var mu sync.Mutex
	return &lineWriter{line: func(l string) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(w, "%s%s\n", progressMark, l)
	}}
}

// lineWriter calls line with each whole line written to it (without the
// newline).
type lineWriter struct {
	mu   sync.Mutex
	buf  []byte
	line func(string)
}

func (lw *lineWriter) Write(b []byte) (int, error) {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	lw.buf = append(lw.buf, b...)
	for {
		i := bytes.IndexByte(lw.buf, '\n')
		if i < 0 {
			return len(b), nil
		}
		lw.line(string(lw.buf[:i]))
		lw.buf = lw.buf[i+1:]
	}
}

// ticker says when a loop's next progress line is due: the first and last
// step, and at most one a second between.
type ticker struct {
	every time.Duration
	last  time.Time
}

// due tells whether step i of n (from 1) at now deserves a line.
func (t *ticker) due(i, n int, now time.Time) bool {
	if i == 1 || i == n || now.Sub(t.last) >= t.every {
		t.last = now
		return true
	}
	return false
}
