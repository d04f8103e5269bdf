package appmsg

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzDecodeMessage feeds Decode arbitrary payloads. It must refuse with
// ErrInvalid or return a message whose segments lie within the payload and
// that encodes back to exactly the payload.
func FuzzDecodeMessage(f *testing.F) {
	m, segs := sample()
	f.Add(Encode(nil, &m, segs))
	f.Add(Encode(nil, &Meta{Flags: Simple}, nil))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, payload []byte) {
		got, err := Decode(payload)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("refused with an unexpected error: %v", err)
			}
			return
		}
		if len(got.Segments) > MaxSegments {
			t.Fatalf("%d segments", len(got.Segments))
		}
		if err := Check(&got.Meta, got.Segments, uint64(len(payload))); err != nil {
			t.Fatalf("decoded a message Check refuses: %v", err)
		}
		if again := Encode(nil, &got.Meta, got.Segments); !bytes.Equal(again, payload) {
			t.Fatalf("re-encoding differs:\n got %x\nwant %x", again, payload)
		}
	})
}
