//go:build !race

package van

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// The epoll van's sockets are non-blocking, so its reads and writes never
// wait: each is the kernel copying bytes, CPU work like a copy in Go. They
// are made as raw system calls, without the runtime's entersyscall and
// exitsyscall. An ordinary call from a process whose processors are all
// idle wakes the runtime's sysmon from its long sleep, and each wake by a
// system call starts it polling every 20 µs again for a millisecond or
// more, which a node that goes idle between iterations would pay on every
// return to work. A raw call keeps its P for the length of the copy, as a
// copy in Go would. (Built with -race, the ordinary calls are used: they
// tell the race detector what the kernel read and wrote.)

// ioWritev writes bufs to the non-blocking socket fd; iov is scratch
// space for the kernel's iovec array, returned to be reused.
func ioWritev(fd int, bufs [][]byte, iov []unix.Iovec) (int, []unix.Iovec, error) {
	iov = toIovec(iov[:0], bufs)
	if len(iov) == 0 {
		return 0, iov, nil
	}
	n, _, e := unix.RawSyscall(unix.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
	if e != 0 {
		return 0, iov, e
	}
	return int(n), iov, nil
}

// ioReadv reads from the non-blocking socket fd into bufs.
func ioReadv(fd int, bufs [][]byte, iov []unix.Iovec) (int, []unix.Iovec, error) {
	iov = toIovec(iov[:0], bufs)
	if len(iov) == 0 {
		return 0, iov, nil
	}
	n, _, e := unix.RawSyscall(unix.SYS_READV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
	if e != 0 {
		return 0, iov, e
	}
	return int(n), iov, nil
}

// toIovec appends bufs to dst as iovecs, skipping empty ones.
func toIovec(dst []unix.Iovec, bufs [][]byte) []unix.Iovec {
	for _, b := range bufs {
		if len(b) == 0 {
			continue
		}
		v := unix.Iovec{Base: &b[0]}
		v.SetLen(len(b))
		dst = append(dst, v)
	}
	return dst
}
