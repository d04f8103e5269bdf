package van

import (
	"github.com/fptps/fpt/node"

	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/van/internal/wiretest"
)

// rx is a frame the cutter emitted, payload copied.
type rx struct {
	h frame.Header
	p []byte
}

// pushStream is a connection's bytes from peer to self: a Hello, a push
// of each size (key i, filled by wiretest.Fill) and a Bye.
func pushStream(self, peer node.ID, sizes []int) []byte {
	stream := wiretest.Encode(frame.Header{Type: frame.Hello, Sender: uint32(peer), Recipient: uint32(self)}, nil)
	for i, n := range sizes {
		p := make([]byte, n)
		wiretest.Fill(p, uint64(i))
		stream = append(stream, wiretest.Encode(wiretest.PushHeader(peer, self, uint64(i), n), p)...)
	}
	return append(stream, wiretest.Encode(frame.Header{Type: frame.Bye, Sender: uint32(peer), Recipient: uint32(self)}, nil)...)
}

func TestCutterStream(t *testing.T) {
	const self, peer = 8, 9
	sizes := []int{0, 4, 100, 65536, 4}
	stream := pushStream(self, peer, sizes)

	r := rand.New(rand.NewPCG(5, 6))
	for trial := 0; trial < 50; trial++ {
		c := newCutter(self, 0, false, 1<<20, nil)
		var got []rx
		// Feed in random pieces, as reads would return them.
		data := stream
		for len(data) > 0 {
			k := min(len(data), 1+r.IntN(3*frame.HeaderSize))
			if err := c.feed(data[:k], func(h *frame.Header, p []byte) {
				got = append(got, rx{*h, append([]byte(nil), p...)})
			}); err != nil {
				t.Fatal(err)
			}
			data = data[k:]
		}
		if len(got) != len(sizes)+2 {
			t.Fatalf("cut %d frames, want %d", len(got), len(sizes)+2)
		}
		if got[0].h.Type != frame.Hello || c.peer != peer || got[len(got)-1].h.Type != frame.Bye {
			t.Fatalf("hello/bye not cut: first %v last %v", got[0].h.Type, got[len(got)-1].h.Type)
		}
		for i, n := range sizes {
			f := got[i+1]
			if len(f.p) != n || f.h.Key != uint64(i) || wiretest.Check(f.p, uint64(i)) >= 0 {
				t.Fatalf("frame %d: key %d, %d bytes (want %d), content mismatch at %d", i, f.h.Key, len(f.p), n, wiretest.Check(f.p, uint64(i)))
			}
		}
	}
}

func TestCutterRejects(t *testing.T) {
	const self, peer = 8, 9
	hello := wiretest.Encode(frame.Header{Type: frame.Hello, Sender: peer, Recipient: self}, nil)
	badSum := bytes.Clone(hello)
	badSum[70] ^= 1
	tooBig := wiretest.PushHeader(peer, self, 1, 0)
	tooBig.Length, tooBig.Total = 1<<21, 1<<21
	tooBigBytes := make([]byte, frame.HeaderSize)
	tooBig.Encode(tooBigBytes)
	tests := []struct {
		name  string
		known bool
		data  []byte
		want  error
	}{
		{"garbage", false, bytes.Repeat([]byte{0xab}, 100), frame.ErrMagic},
		{"bad checksum", false, badSum, frame.ErrChecksum},
		{"data before hello", false, wiretest.Encode(wiretest.PushHeader(peer, self, 1, 4), make([]byte, 4)), errProtocol},
		{"hello to another node", false, wiretest.Encode(frame.Header{Type: frame.Hello, Sender: peer, Recipient: 77}, nil), errProtocol},
		{"hello from self", false, wiretest.Encode(frame.Header{Type: frame.Hello, Sender: self, Recipient: self}, nil), errProtocol},
		{"hello with payload", false, wiretest.Encode(frame.Header{Type: frame.Hello, Sender: peer, Recipient: self}, make([]byte, 8)), errProtocol},
		{"second hello", false, append(bytes.Clone(hello), hello...), errProtocol},
		{"hello on a dialled connection", true, hello, errProtocol},
		{"wrong sender", true, wiretest.Encode(wiretest.PushHeader(10, self, 1, 4), make([]byte, 4)), errProtocol},
		{"oversized length", true, tooBigBytes, frame.ErrTooLarge},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newCutter(self, peer, tc.known, 1<<20, nil)
			err := c.feed(tc.data, func(*frame.Header, []byte) {})
			if !errors.Is(err, tc.want) {
				t.Fatalf("error %v, want %v", err, tc.want)
			}
			if len(c.buf) != 0 {
				t.Fatalf("allocated %d bytes for a rejected frame", len(c.buf))
			}
		})
	}
}

// TestCutterReusesBuffer: steady state cuts without allocating.
func TestCutterReusesBuffer(t *testing.T) {
	const self, peer = 8, 9
	f := wiretest.Encode(wiretest.PushHeader(peer, self, 1, 4096), make([]byte, 4096))
	c := newCutter(self, peer, true, 1<<20, nil)
	emit := func(*frame.Header, []byte) {}
	c.feed(f, emit)
	if n := testing.AllocsPerRun(100, func() { c.feed(f, emit) }); n != 0 {
		t.Fatalf("%v allocations per frame", n)
	}
}

// FuzzReceive feeds arbitrary bytes, in arbitrary pieces, to the receive
// state machine of an accepted and of a dialled connection (the latter with
// a growth bound below a frame's size): it must never
// panic, and what it emits must be consistent.
func FuzzReceive(f *testing.F) {
	const self, peer = 8, 9
	hello := wiretest.Encode(frame.Header{Type: frame.Hello, Sender: peer, Recipient: self}, nil)
	data := wiretest.Encode(wiretest.PushHeader(peer, self, 3, 8), []byte{1, 2, 3, 4, 5, 6, 7, 8})
	bye := wiretest.Encode(frame.Header{Type: frame.Bye, Sender: peer, Recipient: self}, nil)
	f.Add(uint8(7), append(append(bytes.Clone(hello), data...), bye...))
	f.Add(uint8(1), hello[:40])
	f.Add(uint8(0), []byte("GET / HTTP/1.1\r\n\r\n"))
	f.Add(uint8(200), append(bytes.Clone(data), data...))
	f.Fuzz(func(t *testing.T, step uint8, in []byte) {
		for _, known := range []bool{false, true} {
			c := newCutter(self, peer, known, 1<<16, nil)
			if known {
				c.growMax = 1 << 12 // past it, one growth to the length
			}
			chunk := int(step) + 1
			for data := in; len(data) > 0; {
				k := min(chunk, len(data))
				err := c.feed(data[:k], func(h *frame.Header, p []byte) {
					if uint64(len(p)) != h.Length || h.Recipient != self || node.ID(h.Sender) != c.peer {
						t.Fatalf("inconsistent frame %v with %d bytes", h, len(p))
					}
				})
				if err != nil {
					break
				}
				data = data[k:]
			}
		}
	})
}

// TestCutterSink: a sink's buffer of the right length receives the
// payload in place; nil or a wrong length falls back to the cutter's own.
func TestCutterSink(t *testing.T) {
	const self, peer = 8, 9
	tests := []struct {
		name    string
		sinkLen func(n int) int // -1: nil
		inPlace bool
	}{
		{"exact", func(n int) int { return n }, true},
		{"nil", func(int) int { return -1 }, false},
		{"short", func(n int) int { return n - 4 }, false},
		{"long", func(n int) int { return n + 4 }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var given []byte
			sink := func(h *frame.Header) []byte {
				if n := tt.sinkLen(int(h.Length)); n >= 0 {
					given = make([]byte, n)
					return given
				}
				return nil
			}
			c := newCutter(self, peer, true, 1<<20, sink)
			p := make([]byte, 4096)
			wiretest.Fill(p, 7)
			var got []byte
			var reported bool
			emit := func(_ *frame.Header, b []byte) { got, reported = b, c.inPlace() }
			if err := c.feed(wiretest.Encode(wiretest.PushHeader(peer, self, 1, len(p)), p), emit); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, p) {
				t.Fatal("payload differs")
			}
			if inPlace := len(given) > 0 && &got[0] == &given[0]; inPlace != tt.inPlace {
				t.Fatalf("payload in the sink's buffer: %v, want %v", inPlace, tt.inPlace)
			}
			if reported != tt.inPlace {
				t.Fatalf("inPlace() = %v, want %v", reported, tt.inPlace)
			}
		})
	}
}

// Every frame type has a length bound: nothing for requests and
// acknowledgements, a partition for tensor pieces, MaxPayload only for a
// KVError's reason and an App message (not cut into partitions).
func TestLengthBound(t *testing.T) {
	const part = 4096
	for _, tt := range []struct {
		typ  frame.Type
		want uint64
	}{
		{frame.Hello, 0}, {frame.Bye, 0}, {frame.KVPull, 0}, {frame.KVAck, 0},
		{frame.Push, part}, {frame.Result, part}, {frame.KVPush, part}, {frame.KVPushPull, part}, {frame.KVData, part},
		{frame.KVError, math.MaxUint64}, {frame.App, math.MaxUint64},
	} {
		if got := lengthBound(tt.typ, part); got != tt.want {
			t.Errorf("lengthBound(%s, %d) = %d, want %d", tt.typ, part, got, tt.want)
		}
	}
}

// TestCutterGrowth: the cutter's own buffer doubles from growStart up to
// its bound, then grows once to the frame's length, so that no growth
// copies more than the bound; a buffer left larger by a frame before is
// filled only up to the bound before it grows. Every allocation is
// recorded (its size and the bytes it copied) and every payload checked.
func TestCutterGrowth(t *testing.T) {
	const k, m = 1 << 10, 1 << 20
	doubling := func(from, to int) []int { // from, 2from, ... up to to
		var s []int
		for n := from; n <= to; n *= 2 {
			s = append(s, n)
		}
		return s
	}
	tests := []struct {
		name   string
		bound  uint64 // 0: growBound
		frames []int  // payload lengths, in order
		allocs []int  // the buffer sizes allocated, in order
	}{
		{"1 KiB", 0, []int{k}, []int{k}},
		{"1 MiB", 0, []int{m}, doubling(64*k, m)},
		{"100 MiB", 0, []int{100 * m}, append(doubling(64*k, 64*m), 100*m)},
		// A 3 GiB frame under the 64 MiB bound, scaled down 64 times.
		{"48 MiB, bound 1 MiB", m, []int{48 * m}, append(doubling(64*k, m), 48*m)},
		{"at the bound", m, []int{m}, doubling(64*k, m)},
		{"steady state", m, []int{10 * m, 10 * m, 4 * k}, append(doubling(64*k, m), 10*m)},
		// The 3 MiB buffer holds only 1 MiB of the next frame before it
		// grows: what is copied stays within the bound.
		{"larger buffer before", m, []int{3 * m, 10 * m}, append(doubling(64*k, m), 3*m, 10*m)},
		// Doubling from a size left by a smaller frame stops at the
		// bound, not past it.
		{"odd buffer before", m, []int{48 * k, 3 * m}, []int{48 * k, 96 * k, 192 * k, 384 * k, 768 * k, m, 3 * m}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			const self, peer = 8, 9
			bound := tt.bound
			if bound == 0 {
				bound = growBound
			}
			c := newCutter(self, peer, true, 1<<40, nil)
			c.growMax = tt.bound
			var allocs []int
			var copied uint64
			for i, n := range tt.frames {
				hdr := make([]byte, frame.HeaderSize)
				h := wiretest.PushHeader(peer, self, uint64(i), n)
				h.Encode(hdr)
				src := blockSource{n: n, f: i}
				var got []byte
				for at := 0; at < len(hdr)+n; {
					pn, was := c.pn, cap(c.buf)
					b := c.next()
					if cap(c.buf) != was {
						allocs = append(allocs, cap(c.buf))
						copied = max(copied, pn)
					}
					b = b[:min(len(b), 256*k, len(hdr)+n-at)]
					if at < len(hdr) {
						copy(b, hdr[at:])
					} else {
						src.read(b, at-len(hdr))
					}
					at += len(b)
					h, p, err := c.advance(len(b))
					if err != nil {
						t.Fatal(err)
					}
					if h != nil {
						got = p
					}
				}
				if err := src.check(got); err != "" {
					t.Fatalf("frame %d (%d bytes): %s", i, n, err)
				}
			}
			if copied > bound {
				t.Errorf("a growth copied %d bytes, more than the bound %d", copied, bound)
			}
			if !slices.Equal(allocs, tt.allocs) {
				t.Errorf("allocated %v, want %v", allocs, tt.allocs)
			}
		})
	}
}

// blockSource is the payload of n bytes of frame f, made on demand so
// that a large one costs no memory of its own: block j of it starts with
// f and j, and goes on with the same filler.
type blockSource struct {
	n, f int
	blk  []byte // one block, f in place and j set by read
}

const blockSize = 64 << 10

// read fills p with the payload's bytes from offset off.
func (s *blockSource) read(p []byte, off int) {
	if s.blk == nil {
		s.blk = make([]byte, blockSize)
		wiretest.Fill(s.blk, 1)
		binary.LittleEndian.PutUint32(s.blk, uint32(s.f))
	}
	for len(p) > 0 {
		j := off / blockSize
		binary.LittleEndian.PutUint32(s.blk[4:], uint32(j))
		k := copy(p, s.blk[off%blockSize:min(blockSize, s.n-j*blockSize)])
		p, off = p[k:], off+k
	}
}

// check says where p differs from the payload, or "".
func (s *blockSource) check(p []byte) string {
	if len(p) != s.n {
		return fmt.Sprintf("%d bytes, want %d", len(p), s.n)
	}
	want := make([]byte, blockSize)
	for off := 0; off < s.n; off += blockSize {
		b := p[off:min(s.n, off+blockSize)]
		s.read(want[:len(b)], off)
		if !bytes.Equal(b, want[:len(b)]) {
			return fmt.Sprintf("block %d differs", off/blockSize)
		}
	}
	return ""
}
