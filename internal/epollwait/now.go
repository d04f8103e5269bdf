//go:build !race

package epollwait

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// epollNow is epoll_wait on epfd without waiting, as a raw system call:
// it never blocks, and an ordinary call from an idle process would wake
// the runtime's sysmon into polling again. (Built with -race, the
// ordinary call is used: it tells the race detector what the kernel
// wrote.)
func epollNow(epfd int, events []unix.EpollEvent) (int, error) {
	n, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(epfd), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), 0, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}
