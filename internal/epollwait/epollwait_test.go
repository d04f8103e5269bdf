package epollwait_test

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fptps/fpt/internal/epollwait"
)

// newSet returns an epoll set watching one eventfd, and the eventfd.
func newSet(t *testing.T) (epfd, efd int) {
	t.Helper()
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	efd, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(efd); unix.Close(epfd) })
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(efd)}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, efd, &ev); err != nil {
		t.Fatal(err)
	}
	return epfd, efd
}

func TestWait(t *testing.T) {
	epfd, efd := newSet(t)
	w, err := epollwait.New(epfd)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	events := make([]unix.EpollEvent, 4)

	// Nothing ready: no wait at all, then a bounded one, each 0 events.
	for _, ms := range []int{0, 20} {
		if n, err := w.Wait(events, ms); n != 0 || err != nil {
			t.Fatalf("Wait(%d ms) on an idle set: %d events, %v", ms, n, err)
		}
	}

	// A waiter parked without a limit wakes for an event that comes later.
	got := make(chan int, 1)
	go func() {
		n, err := w.Wait(events, -1)
		if err != nil {
			t.Error(err)
		}
		got <- n
	}()
	time.Sleep(20 * time.Millisecond) // let it park; it wakes either way
	if _, err := unix.Write(efd, []byte{1, 0, 0, 0, 0, 0, 0, 0}); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-got:
		if n != 1 || int(events[0].Fd) != efd {
			t.Fatalf("woke with %d events (fd %d), want the eventfd %d", n, events[0].Fd, efd)
		}
	case <-time.After(time.Minute):
		t.Fatal("a parked Wait did not wake for an event")
	}

	// Still ready (the set is level-triggered): returned without parking.
	if n, err := w.Wait(events, -1); n != 1 || err != nil {
		t.Fatalf("Wait on a ready set: %d events, %v", n, err)
	}
}

// The set stays the caller's: closing the Waiter leaves it usable.
func TestCloseKeepsSet(t *testing.T) {
	epfd, _ := newSet(t)
	w, err := epollwait.New(epfd)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.EpollWait(epfd, make([]unix.EpollEvent, 1), 0); err != nil {
		t.Fatalf("the set after Close: %v", err)
	}
}
