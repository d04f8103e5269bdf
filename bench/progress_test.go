package bench

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// A worker's progress lines reach the bench's stderr, with the run and the
// time; the rest of its stderr (its log) does not.
func TestProgressRelay(t *testing.T) {
	var out strings.Builder
	p := newProgress(&out)
	clock := p.start
	p.now = func() time.Time { return clock }
	worker := new(strings.Builder)
	progressOut := marked(worker)
	fmt.Fprintf(progressOut, "iteration 1/4\niteration 2")
	fmt.Fprintf(progressOut, "/4, 0.5s\n")
	worker.WriteString("time=... level=WARN msg=\"something\"\n")
	clock = clock.Add(2500 * time.Millisecond)
	relay := p.relay("run 1/2 (epoll van)")
	// In pieces, as a pipe delivers it.
	for s := worker.String(); s != ""; s = s[min(7, len(s)):] {
		relay.Write([]byte(s[:min(7, len(s))]))
	}
	want := "fpt bench: [   2.5s] run 1/2 (epoll van): iteration 1/4\n" +
		"fpt bench: [   2.5s] run 1/2 (epoll van): iteration 2/4, 0.5s\n"
	if out.String() != want {
		t.Errorf("relayed %q, want %q", out.String(), want)
	}
}

func TestTicker(t *testing.T) {
	t0 := time.Unix(100, 0)
	tk := ticker{every: time.Second}
	var due []int
	for i := 1; i <= 10; i++ {
		// Steps 300 ms apart: the first, then one a second, and the last.
		if tk.due(i, 10, t0.Add(time.Duration(i)*300*time.Millisecond)) {
			due = append(due, i)
		}
	}
	if want := []int{1, 5, 9, 10}; fmt.Sprint(due) != fmt.Sprint(want) {
		t.Errorf("lines at steps %v, want %v", due, want)
	}
}
