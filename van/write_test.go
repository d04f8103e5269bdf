package van

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/van/internal/peerstat"
)

// TestWritevPartial: the epoll van's writev through a socket that takes a
// few KiB per call (a socketpair with a small SO_SNDBUF, read in small
// pieces) resumes every partial write at the exact byte, through buffers
// of every size, empty ones included, more of them than one writev takes.
func TestWritevPartial(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[1])
	if err := unix.SetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_SNDBUF, 4096); err != nil {
		t.Fatal(err)
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		t.Fatal(err)
	}
	c := newEpConn(fds[0], -1, "socketpair", cutter{})
	defer c.close()

	r := rand.New(rand.NewPCG(7, 8))
	var want []byte
	var bufs [][]byte
	for range 3 * iovMax {
		b := make([]byte, r.IntN(512))
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		if r.IntN(8) == 0 {
			b = nil
		}
		want = append(want, b...)
		bufs = append(bufs, b)
	}
	got := make(chan []byte, 1)
	go func() {
		var all []byte
		buf := make([]byte, 1500)
		for {
			n, err := unix.Read(fds[1], buf[:1+len(all)%len(buf)])
			if n > 0 {
				all = append(all, buf[:n]...)
			}
			if n == 0 || err != nil && !errors.Is(err, unix.EINTR) {
				got <- all
				return
			}
		}
	}()
	n, calls, err := c.writev(bufs, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	unix.Shutdown(fds[0], unix.SHUT_WR)
	all := <-got
	t.Logf("%d bytes in %d buffers: %d writes", len(want), len(bufs), calls)
	if n != len(want) || !bytes.Equal(all, want) {
		t.Fatalf("wrote %d bytes, read %d, want %d; equal %v", n, len(all), len(want), bytes.Equal(all, want))
	}
	if calls < 4 {
		t.Fatalf("%d writes for %d bytes through a 4 KiB socket buffer: no partial write tested", calls, len(want))
	}
}

// cutLink is a link that takes the first limit bytes written to it, then
// fails.
type cutLink struct {
	limit   int
	wrote   bytes.Buffer
	aborted atomic.Bool
}

var errCut = errors.New("cut")

func (l *cutLink) writev(bufs [][]byte, timeout time.Duration) (int, int, error) {
	n := 0
	for _, b := range bufs {
		k := min(len(b), l.limit-l.wrote.Len())
		l.wrote.Write(b[:k])
		n += k
	}
	if l.wrote.Len() >= l.limit && n < size(bufs) {
		return n, 1, errCut
	}
	return n, 1, nil
}

func (l *cutLink) abort() { l.aborted.Store(true) }

// TestWriteRunDone: the frames of one write are written back to back as
// the wire has them (each header its frame's, payloads gathered from every
// part), and when the write fails, each frame written whole is done (nil)
// and counted, the rest fail with the error, and the peer is failed.
func TestWriteRunDone(t *testing.T) {
	sizes := []int{40, 0, 1000, 8}
	frameEnd := func(i int) int { // bytes up to the end of frame i
		n := 0
		for _, s := range sizes[:i+1] {
			n += frame.HeaderSize + s
		}
		return n
	}
	tests := []struct {
		name  string
		limit int
		whole int // frames written whole
	}{
		{"all", 1 << 20, 4},
		{"none", 0, 0},
		{"in a header", frame.HeaderSize / 2, 0},
		{"after a frame", frameEnd(1), 2},
		{"in a payload", frameEnd(1) + frame.HeaderSize + 500, 2},
		{"before the last", frameEnd(2), 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := &core{cfg: Config{Self: 3, IOTimeout: time.Second}}
			c.self.Store(3)
			l := &cutLink{limit: tc.limit}
			p := &peer{id: 9, links: []link{l}, st: new(peerstat.Counters), byes: make([]atomic.Bool, 1)}
			s := newSender(1)
			var msgs []*frame.Message
			var wire []byte
			results := make([]error, len(sizes))
			called := make([]int, len(sizes))
			for i, size := range sizes {
				pl := bytes.Repeat([]byte{byte(i + 1)}, size)
				h := frame.Header{Type: frame.Push, DType: frame.Float32, Recipient: 9, Key: uint64(i), Total: uint64(size)}
				m := &frame.Message{Header: h, Payload: pl[:size/2], More: [][]byte{nil, pl[size/2:]}, Done: func(err error) {
					results[i] = err
					called[i]++
				}}
				msgs = append(msgs, m)
				h.Sender, h.Length = 3, uint64(size)
				var hdr [frame.HeaderSize]byte
				h.Encode(hdr[:])
				wire = append(append(wire, hdr[:]...), pl...)
			}
			c.writeRun(s, p, 0, msgs)
			if w := wire[:min(len(wire), tc.limit)]; !bytes.Equal(l.wrote.Bytes(), w) {
				t.Fatalf("wrote %d bytes, not the %d of the frames on the wire", l.wrote.Len(), len(w))
			}
			for i := range sizes {
				if called[i] != 1 {
					t.Fatalf("frame %d: Done called %d times", i, called[i])
				}
				if whole := i < tc.whole; whole != (results[i] == nil) || !whole && !errors.Is(results[i], errCut) {
					t.Fatalf("frame %d: Done(%v); written whole: %v", i, results[i], whole)
				}
			}
			wantBytes := 0
			if tc.whole > 0 {
				wantBytes = frameEnd(tc.whole - 1)
			}
			if f, b := p.st.SentFrames.Load(), p.st.SentBytes.Load(); f != uint64(tc.whole) || b != uint64(wantBytes) {
				t.Fatalf("counted %d frames, %d bytes; want %d, %d", f, b, tc.whole, wantBytes)
			}
			if failed := tc.whole < len(sizes); l.aborted.Load() != failed || failed != (p.reason(nil) != nil) {
				t.Fatalf("peer failed: %v (%v), want %v", l.aborted.Load(), p.reason(nil), failed)
			}
		})
	}
}
