package van_test

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/van"
	"github.com/fptps/fpt/van/internal/wiretest"
	"github.com/fptps/fpt/van/vantest"
	"golang.org/x/sys/unix"
)

// threadsInEpollWait counts this process's threads blocked in an
// epoll_wait, from /proc/self/task/*/syscall.
func threadsInEpollWait(t *testing.T) int {
	t.Helper()
	paths, err := filepath.Glob("/proc/self/task/*/syscall")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // the thread exited
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			continue
		}
		switch nr, _ := strconv.Atoi(f[0]); nr {
		case unix.SYS_EPOLL_WAIT, unix.SYS_EPOLL_PWAIT, unix.SYS_EPOLL_PWAIT2:
			n++
		}
	}
	return n
}

// TestEpollIdleReceiversHoldNoThread: an idle epoll van's receiver waits
// on the Go runtime's poller, not in an epoll_wait of its own, so several
// idle vans leave at most the runtime's one poller thread in epoll_wait.
// A receiver blocked in epoll_wait holds a processor in a system call,
// which the runtime takes back and hands off whenever the others are busy
// (docs/benchmarks.md, CPU per byte).
func TestEpollIdleReceiversHoldNoThread(t *testing.T) {
	if _, err := os.Stat("/proc/self/task"); err != nil {
		t.Skip("no /proc/self/task")
	}
	const vans = 4
	// Every van has sent or received a frame, so each receiver loop is
	// past its start.
	b, col := newVan(t, van.KindEpoll, 9, nil)
	for i := range vans - 1 {
		id := node.ID(10 + 2*i)
		a, _ := newVan(t, van.KindEpoll, id, nil)
		vantest.Connect(t, a, id, b, 9)
		p := make([]byte, 100)
		if err := a.Send(&frame.Message{Header: wiretest.PushHeader(id, 9, 0, len(p)), Payload: p}); err != nil {
			t.Fatal(err)
		}
	}
	col.WaitFrames(t, vans-1)
	// A receiver waiting in an epoll_wait of its own is there in every
	// sample; a thread of the runtime's passing through a non-blocking
	// poll, on a loaded machine, only in some: the median tells them apart.
	samples := make([]int, 50)
	for i := range samples {
		samples[i] = threadsInEpollWait(t)
		time.Sleep(5 * time.Millisecond) // samples spread over a quarter second
	}
	slices.Sort(samples)
	if median := samples[len(samples)/2]; median > 1 {
		t.Fatalf("a median of %d threads in epoll_wait at once (at most %d) with %d idle epoll vans, want at most the runtime's poller",
			median, samples[len(samples)-1], vans)
	}
}
