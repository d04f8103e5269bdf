package localagg

import (
	"io"
	"net"
	"testing"

	"github.com/fptps/fpt/frame"
)

// benchBytes is one partition of FPT_PARTITION_BYTES' default, 1 MiB,
// times four: a few partitions, larger than the caches of most cores.
const benchBytes = 4 << 20

func benchSegment(b *testing.B) *Segment {
	seg, _, err := Create(b.TempDir(), Name(job, "bench"), job, dig, Layout{Members: 2, Slots: 1, SlotBytes: benchBytes})
	if err != nil {
		b.Skip("no segment:", err)
	}
	b.Cleanup(func() { seg.Close() })
	return seg
}

// BenchmarkLocalSum adds one member's float32 contribution into the host
// sum in the segment: the cost of local aggregation per byte a member
// contributes.
func BenchmarkLocalSum(b *testing.B) {
	seg := benchSegment(b)
	b.SetBytes(benchBytes)
	for b.Loop() {
		if err := seg.Sum(frame.Float32, 1, 0, benchBytes, false); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMemcpy copies the same bytes within the segment: the floor
// the local sum is measured against (a member writing its contribution
// costs one such copy).
func BenchmarkMemcpy(b *testing.B) {
	seg := benchSegment(b)
	b.SetBytes(benchBytes)
	for b.Loop() {
		copy(seg.HostSum(0), seg.Contribution(1, 0))
	}
}

// BenchmarkLoopbackTCP moves the same bytes through a loopback TCP
// connection: what a member's contribution would cost without shared
// memory (before any sum).
func BenchmarkLoopbackTCP(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Skip(err)
	}
	defer ln.Close()
	done := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		_, err = io.Copy(io.Discard, c)
		done <- err
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, benchBytes)
	b.SetBytes(benchBytes)
	for b.Loop() {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	c.Close()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}
