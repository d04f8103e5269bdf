package van

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"runtime"
	"testing"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/van/internal/wiretest"
)

// FuzzCutterAfterHello feeds a valid Hello and then arbitrary bytes to an
// accepted connection's cutter, the bytes a stranger or a broken peer can
// send. With fixCRC the fuzzer's bytes get correct header checksums, so
// that it explores the connection rules rather than the CRC. The cutter
// must never panic, must refuse exactly the input a reference walk of the
// wire rules refuses (a header frame.Decode refuses, a frame not from the
// peer or not for self, a second Hello, a Hello or Bye with a payload),
// must emit every complete frame before that, and must not allocate more
// than one payload buffer of at most maxPayload bytes whatever the
// headers announce.
func FuzzCutterAfterHello(f *testing.F) {
	const self, peer = 8, 9
	data := wiretest.Encode(wiretest.PushHeader(peer, self, 3, 8), []byte{1, 2, 3, 4, 5, 6, 7, 8})
	huge := wiretest.PushHeader(peer, self, 0, 0)
	huge.Length, huge.Total = 1<<30, 1<<62
	stranger := wiretest.PushHeader(1001, self, 0, 0)
	bye := wiretest.Encode(frame.Header{Type: frame.Bye, Sender: peer, Recipient: self}, nil)
	f.Add(false, append(bytes.Clone(data), bye...))
	f.Add(true, wiretest.Encode(huge, nil))
	f.Add(true, wiretest.Encode(stranger, nil))
	f.Add(true, wiretest.Encode(frame.Header{Type: frame.Hello, Sender: peer, Recipient: self}, nil))
	f.Add(false, []byte("\x00\x01 not a frame"))
	const maxPayload = 1 << 16
	hello := wiretest.Encode(frame.Header{Type: frame.Hello, Sender: peer, Recipient: self}, nil)
	f.Fuzz(func(t *testing.T, fixCRC bool, in []byte) {
		in = bytes.Clone(in)
		wantFrames, wantErr := referenceWalk(in, self, peer, maxPayload, fixCRC)
		c := newCutter(self, 0, false, maxPayload, nil)
		frames := 0
		emit := func(h *frame.Header, p []byte) {
			if uint64(len(p)) != h.Length || h.Recipient != self || node.ID(h.Sender) != peer {
				t.Fatalf("inconsistent frame %v with %d bytes", h, len(p))
			}
			frames++
		}
		if err := c.feed(hello, emit); err != nil || frames != 1 {
			t.Fatalf("valid hello: %d frames, %v", frames, err)
		}
		frames = 0
		var err error
		grew := allocatedBy(func() { err = c.feed(in, emit) })
		if gotErr := err != nil; gotErr != wantErr {
			t.Fatalf("cutter error %v, reference walk wants error: %v", err, wantErr)
		}
		if frames != wantFrames {
			t.Fatalf("emitted %d frames, reference walk %d", frames, wantFrames)
		}
		if grew > maxPayload+64<<10 {
			t.Fatalf("feeding %d bytes allocated %d bytes (payload bound %d)", len(in), grew, maxPayload)
		}
	})
}

// referenceWalk applies the wire rules to b independently of the cutter,
// after a Hello from peer: how many frames are complete before the first
// refused header, and whether there is one. With fixCRC it first rewrites
// each header's checksum in place.
func referenceWalk(b []byte, self, peer node.ID, maxPayload uint64, fixCRC bool) (frames int, refused bool) {
	table := crc32.MakeTable(crc32.Castagnoli)
	for len(b) >= frame.HeaderSize {
		if fixCRC {
			binary.LittleEndian.PutUint32(b[68:], crc32.Checksum(b[:68], table))
		}
		h, err := frame.Decode(b[:frame.HeaderSize], maxPayload)
		if err != nil {
			return frames, true
		}
		if node.ID(h.Recipient) != self || node.ID(h.Sender) != peer || h.Type == frame.Hello {
			return frames, true
		}
		// Frames that carry nothing must be empty (a partition bound
		// applies too, but this cutter is given none).
		switch h.Type {
		case frame.Bye, frame.KVPull, frame.KVAck:
			if h.Length != 0 {
				return frames, true
			}
		}
		b = b[frame.HeaderSize:]
		if uint64(len(b)) < h.Length {
			return frames, false
		}
		b = b[h.Length:]
		frames++
	}
	return frames, false
}

// allocatedBy returns the bytes the heap grew by while fn ran (plus
// whatever other goroutines allocated meanwhile: callers allow slack).
func allocatedBy(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}
