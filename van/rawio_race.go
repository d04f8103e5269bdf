//go:build race

package van

import "golang.org/x/sys/unix"

// Under the race detector the van's reads and writes are ordinary system
// calls, which tell it what the kernel read and wrote (rawio.go).

func ioWritev(fd int, bufs [][]byte, iov []unix.Iovec) (int, []unix.Iovec, error) {
	n, err := unix.Writev(fd, bufs)
	return n, iov, err
}

func ioReadv(fd int, bufs [][]byte, iov []unix.Iovec) (int, []unix.Iovec, error) {
	if len(bufs) == 1 {
		n, err := unix.Read(fd, bufs[0])
		return n, iov, err
	}
	n, err := unix.Readv(fd, bufs)
	return n, iov, err
}
