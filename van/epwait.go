package van

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// epollWaiter waits for the van's epoll set on the Go runtime's poller: the
// set is itself pollable, so a duplicate of its descriptor is registered
// there, and the receiver goroutine parks in the runtime, holding no
// processor and no thread, until the set has an event. A thread blocked
// in epoll_wait instead holds its processor in a system call, which the
// runtime's sysmon takes back and hands off whenever the other processors
// are busy, and each time starts polling every 20 µs again; the receiver
// then has to win a processor back on waking.
type epollWaiter struct {
	epfd int
	f    *os.File // the duplicate, registered with the runtime's poller
	rc   syscall.RawConn
}

func newEpollWaiter(epfd int) (*epollWaiter, error) {
	fd, err := unix.FcntlInt(uintptr(epfd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dup epoll: %w", err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("set epoll non-blocking: %w", err)
	}
	f := os.NewFile(uintptr(fd), "epoll")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("epoll raw conn: %w", err)
	}
	return &epollWaiter{epfd: epfd, f: f, rc: rc}, nil
}

// wait fills events with the set's ready ones, waiting up to ms
// milliseconds for one (-1: without a limit). It returns 0 when the time
// is up.
func (w *epollWaiter) wait(events []unix.EpollEvent, ms int) (int, error) {
	n, err := epollNow(w.epfd, events)
	if n > 0 || ms == 0 || (err != nil && !errors.Is(err, unix.EINTR)) {
		return max(n, 0), err
	}
	return w.park(events, ms)
}

// park is wait's slow half: the receiver parks until the set has an event.
func (w *epollWaiter) park(events []unix.EpollEvent, ms int) (int, error) {
	var deadline time.Time
	if ms > 0 {
		deadline = time.Now().Add(time.Duration(ms) * time.Millisecond)
	}
	if err := w.f.SetReadDeadline(deadline); err != nil {
		return 0, fmt.Errorf("epoll deadline: %w", err)
	}
	var n int
	var err error
	rerr := w.rc.Read(func(uintptr) bool {
		n, err = epollNow(w.epfd, events)
		return n > 0 || (err != nil && !errors.Is(err, unix.EINTR))
	})
	switch {
	case errors.Is(rerr, os.ErrDeadlineExceeded):
		return 0, nil
	case rerr != nil:
		return 0, rerr
	}
	return max(n, 0), err
}

func (w *epollWaiter) close() { w.f.Close() }
