// Package epollwait waits for an epoll set on the Go runtime's poller.
//
// An epoll set is itself pollable, so a duplicate of its descriptor is
// registered with the runtime, and the goroutine waiting for the set parks
// there, holding no processor and no thread, until the set has an event.
// A thread blocked in epoll_wait instead holds its processor in a system
// call, which the runtime's sysmon takes back and hands off whenever the
// other processors are busy, and each time starts polling every 20 µs
// again; the waiter then has to win a processor back on waking. The epoll
// van's receiver and the control plane's loop both wait this way.
package epollwait

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Waiter waits for the events of one epoll set, from one goroutine at a
// time.
type Waiter struct {
	epfd int
	f    *os.File // the duplicate, registered with the runtime's poller
	rc   syscall.RawConn
}

// New returns a Waiter for the epoll set epfd, which stays the caller's
// (to add descriptors to and to close).
func New(epfd int) (*Waiter, error) {
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
	return &Waiter{epfd: epfd, f: f, rc: rc}, nil
}

// Wait fills events with the set's ready ones, waiting up to ms
// milliseconds for one as epoll_wait(2) does (-1: without a limit, 0: not
// at all). It returns 0 when the time is up.
func (w *Waiter) Wait(events []unix.EpollEvent, ms int) (int, error) {
	n, err := epollNow(w.epfd, events)
	if n > 0 || ms == 0 || (err != nil && !errors.Is(err, unix.EINTR)) {
		return max(n, 0), err
	}
	return w.park(events, ms)
}

// park is Wait's slow half, apart so that the fast one allocates nothing
// (its closure).
func (w *Waiter) park(events []unix.EpollEvent, ms int) (int, error) {
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

// Close releases the duplicate descriptor; the set itself stays open.
func (w *Waiter) Close() error { return w.f.Close() }
