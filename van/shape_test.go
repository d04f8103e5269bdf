package van

import (
	"github.com/fptps/fpt/node"

	"io"
	"math"
	"net"
	"testing"

	"golang.org/x/sys/unix"
)

func TestReadBudgetFor(t *testing.T) {
	tests := []struct {
		weight, max float64
		want        int
	}{
		{1, 1, readBudget},
		{3, 3, readBudget},
		{1, 4, readBudget / 4},
		{3, 4, readBudget * 3 / 4},
		{0, 4, minReadBudget},          // never paused
		{1e-9, 1, minReadBudget},       // floor
		{5, 4, readBudget},             // above the max: capped
		{1, 0, readBudget},             // no max: unshaped
		{1, math.NaN(), readBudget},    // garbage max: unshaped
		{-1, 2, minReadBudget},         // negative weight: the floor
		{1, 1 << 40, minReadBudget},    // a huge spread: the floor
		{1 << 20, 1 << 20, readBudget}, // huge equal weights
		{0.5, 1, readBudget / 2},       // fractional
		{1, 64, max(readBudget/64, minReadBudget)},
	}
	for _, tc := range tests {
		if got := readBudgetFor(tc.weight, tc.max); got != tc.want {
			t.Errorf("readBudgetFor(%v, %v) = %d, want %d", tc.weight, tc.max, got, tc.want)
		}
	}
}

func TestRecvShaper(t *testing.T) {
	s := recvShaper{weights: make(map[node.ID]float64)}
	if b := s.budget(8); b != readBudget {
		t.Fatalf("no weights: budget %d, want %d", b, readBudget)
	}
	s.setWeight(8, 3)
	s.setWeight(10, 1)
	s.setWeight(12, math.NaN())
	for _, tc := range []struct {
		peer node.ID
		want int
	}{{8, readBudget}, {10, readBudget / 3}, {12, minReadBudget}, {14, readBudget / 3}} {
		if got := s.budget(tc.peer); got != tc.want {
			t.Errorf("shaping on: budget(%d) = %d, want %d", tc.peer, got, tc.want)
		}
	}
	s.setShaping(false)
	for _, p := range []node.ID{8, 10, 12} {
		if got := s.budget(p); got != readBudget {
			t.Errorf("shaping off: budget(%d) = %d, want %d", p, got, readBudget)
		}
	}
	s.setShaping(true)
	s.setWeight(8, 1) // the largest weight drops: 12 stays at the floor, the rest equal
	if got := s.budget(10); got != readBudget {
		t.Errorf("after lowering the max: budget(10) = %d, want %d", got, readBudget)
	}
}

// TestLimitUnsent: the bound is set on a connection (and left alone for
// n <= 0), as the kernel reports it back.
func TestLimitUnsent(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		if c, err := l.Accept(); err == nil {
			defer c.Close()
			io.Copy(io.Discard, c)
		}
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tc := c.(*net.TCPConn)
	get := func() int {
		rc, err := tc.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var v int
		var gerr error
		rc.Control(func(fd uintptr) { v, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_NOTSENT_LOWAT) })
		if gerr != nil {
			t.Fatal(gerr)
		}
		return v
	}
	before := get()
	if err := limitUnsentConn(tc, -1); err != nil || get() != before {
		t.Fatalf("n = -1 changed the setting to %d (%v), want %d", get(), err, before)
	}
	if err := limitUnsentConn(tc, 123456); err != nil || get() != 123456 {
		t.Fatalf("TCP_NOTSENT_LOWAT = %d (%v), want 123456", get(), err)
	}
}
