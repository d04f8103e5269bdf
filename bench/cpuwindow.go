package bench

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"sync"
	"time"
)

// The goodput bench's CPU per GB over the whole run counts what moving
// bytes does not: starting the processes, the init round (which keeps a
// copy of the values), the warm-up. Raw TCP's counts the transfer alone.
// So the bench also measures the cluster's CPU over the timed iterations
// only: worker rank 0 says when they start and end (after the barriers
// that bound them on every worker), and the bench reads every process's
// CPU time from /proc at each mark.
const (
	markTimedStart = "timed iterations start"
	markTimedEnd   = "timed iterations end"
)

// userHZ is the unit of /proc/PID/stat's CPU times (USER_HZ, 100 on
// every Linux ABI).
const userHZ = 100

// statCPU parses the user+sys CPU time out of /proc/PID/stat content: the
// 14th and 15th fields, counted after the command name, which is in
// parentheses and may hold any byte.
func statCPU(stat []byte) (time.Duration, error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("no command name")
	}
	f := bytes.Fields(stat[i+1:])
	// After the name: state is field 3, utime 14, stime 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("%d fields after the command name", len(f))
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(string(s), 10, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("CPU time %q", s)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// cpuWindow sums the CPU of a set of processes between the two marks.
type cpuWindow struct {
	mu    sync.Mutex
	pids  []int
	start time.Duration
	total time.Duration
	state int // 0 before the start mark, 1 within, 2 after the end mark
	err   error
	// gone are the processes whose /proc entry had vanished at the end
	// mark: the line carrying the mark is read from a pipe, and another
	// process may leave the job and be reaped before it is. Their CPU
	// comes from their exit status (result's final), which counts their
	// few milliseconds of shutting down too.
	gone []int
}

// setPids gives the processes to watch (once they run).
func (w *cpuWindow) setPids(pids []int) {
	w.mu.Lock()
	w.pids = pids
	w.mu.Unlock()
}

// writer returns a writer for worker rank 0's stderr that acts on the
// marks among its lines.
func (w *cpuWindow) writer() io.Writer {
	return &lineWriter{line: func(l string) {
		switch {
		case bytes.HasSuffix([]byte(l), []byte(markTimedStart)):
			w.mark(0)
		case bytes.HasSuffix([]byte(l), []byte(markTimedEnd)):
			w.mark(1)
		}
	}}
}

func (w *cpuWindow) mark(state int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return
	}
	if w.state != state || len(w.pids) == 0 {
		w.err = fmt.Errorf("bench: CPU window mark %d out of order (state %d, %d processes)", state, w.state, len(w.pids))
		return
	}
	var sum time.Duration
	for _, pid := range w.pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if state == 1 && errors.Is(err, fs.ErrNotExist) {
			w.gone = append(w.gone, pid)
			continue
		}
		if err != nil {
			w.err = fmt.Errorf("bench: CPU of process %d: %w", pid, err)
			return
		}
		cpu, err := statCPU(b)
		if err != nil {
			w.err = fmt.Errorf("bench: CPU of process %d: %w", pid, err)
			return
		}
		sum += cpu
	}
	if state == 0 {
		w.start = sum
	} else {
		w.total = sum - w.start
	}
	w.state++
}

// result is the CPU between the marks, or why there is none. final gives
// the whole CPU of a process that has exited (its rusage), for those gone
// at the end mark; call it once every process has been waited for.
func (w *cpuWindow) result(final func(pid int) time.Duration) (time.Duration, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil && w.state != 2 {
		return 0, errors.New("bench: worker rank 0 did not mark its timed iterations")
	}
	total := w.total
	for _, pid := range w.gone {
		total += final(pid)
	}
	return total, w.err
}
