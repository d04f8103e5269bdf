package frame

import (
	"errors"
	"fmt"
	"testing"
)

const maxPayload = 8 << 30

func validHeader() Header {
	return Header{
		Type: Push, DType: Float32, Flags: FlagInit,
		Sender: 9, Recipient: 8,
		Key: 1 << 40, Iteration: 7,
		Offset: 3 << 30, Total: 5 << 30, Length: 1 << 20, // a 5 GiB tensor
		Partition: 12, Priority: -3, Aux: 2,
	}
}

func TestRoundTrip(t *testing.T) {
	h := validHeader()
	var buf [HeaderSize]byte
	h.Encode(buf[:])
	got, err := Decode(buf[:], maxPayload)
	if err != nil {
		t.Fatal(err)
	}
	if got != h {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, h)
	}
}

func TestDecodeRejects(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(h *Header)
		raw    func(b []byte)
		max    uint64
		want   error
	}{
		{name: "short", raw: nil, want: ErrShort},
		{name: "magic", raw: func(b []byte) { b[0] ^= 0xff }, want: ErrMagic},
		{name: "version", raw: func(b []byte) { b[4] = 9 }, want: ErrVersion},
		{name: "flipped bit", raw: func(b []byte) { b[20] ^= 1 }, want: ErrChecksum},
		{name: "unknown type", mutate: func(h *Header) { h.Type = 200 }, want: ErrInvalid},
		{name: "zero type", mutate: func(h *Header) { h.Type = 0 }, want: ErrInvalid},
		{name: "too large", mutate: func(h *Header) { h.Length = 2 << 20 }, max: 1 << 20, want: ErrTooLarge},
		{name: "no dtype", mutate: func(h *Header) { h.DType = 0 }, want: ErrInvalid},
		{name: "past end", mutate: func(h *Header) { h.Offset = h.Total - 4 }, want: ErrInvalid},
		{name: "offset overflow", mutate: func(h *Header) { h.Offset = ^uint64(0) - 3 }, want: ErrInvalid},
		{name: "misaligned", mutate: func(h *Header) { h.Length = 6 }, want: ErrInvalid},
		{name: "float64 misaligned", mutate: func(h *Header) { h.DType = Float64; h.Offset = 4 }, want: ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := validHeader()
			if tt.mutate != nil {
				tt.mutate(&h)
			}
			buf := make([]byte, HeaderSize)
			h.Encode(buf)
			if tt.name == "short" {
				buf = buf[:HeaderSize-1]
			}
			if tt.raw != nil {
				tt.raw(buf)
			}
			max := tt.max
			if max == 0 {
				max = maxPayload
			}
			_, err := Decode(buf, max)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Decode error = %v; want %v", err, tt.want)
			}
		})
	}
}

func TestControlFramesNeedNoDType(t *testing.T) {
	for _, typ := range []Type{Hello, Bye, KVPull, KVAck, KVError, App} {
		h := Header{Type: typ, Sender: 9, Recipient: 8}
		if err := h.Validate(0); err != nil {
			t.Errorf("%s: %v", typ, err)
		}
	}
}

func TestDTypeNames(t *testing.T) {
	for d := Float32; d <= lastDType; d++ {
		got, err := ParseDType(d.String())
		if err != nil || got != d {
			t.Errorf("ParseDType(%q) = %v, %v", d, got, err)
		}
	}
	if _, err := ParseDType("int8"); err == nil {
		t.Error("ParseDType accepted int8")
	}
}

func FuzzDecode(f *testing.F) {
	h := validHeader()
	buf := make([]byte, HeaderSize)
	h.Encode(buf)
	f.Add(buf)
	f.Add(make([]byte, HeaderSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := Decode(b, 1<<30)
		if err != nil {
			return
		}
		// Whatever decodes must be self-consistent and re-encode identically.
		if err := got.Validate(1 << 30); err != nil {
			t.Fatalf("decoded header fails Validate: %v", err)
		}
		out := make([]byte, HeaderSize)
		got.Encode(out)
		if string(out) != string(b[:HeaderSize]) {
			t.Fatalf("re-encode differs")
		}
	})
}

func BenchmarkDecode(b *testing.B) {
	h := validHeader()
	buf := make([]byte, HeaderSize)
	h.Encode(buf)
	b.SetBytes(HeaderSize)
	for b.Loop() {
		if _, err := Decode(buf, maxPayload); err != nil {
			b.Fatal(err)
		}
	}
}

func TestChunks(t *testing.T) {
	tests := []struct {
		n, limit uint64
		es       int
		want     [][2]uint64
	}{
		{0, 8, 4, [][2]uint64{{0, 0}}},
		{8, 8, 4, [][2]uint64{{0, 8}}},
		{20, 8, 4, [][2]uint64{{0, 8}, {8, 16}, {16, 20}}},
		{16, 10, 4, [][2]uint64{{0, 8}, {8, 16}}}, // limit rounded down to elements
		{16, 2, 8, [][2]uint64{{0, 8}, {8, 16}}},  // at least one element
		{5 << 30, 2 << 30, 4, [][2]uint64{{0, 2 << 30}, {2 << 30, 4 << 30}, {4 << 30, 5 << 30}}},
	}
	for _, tt := range tests {
		var got [][2]uint64
		for i, c := range Chunks(tt.n, tt.limit, tt.es) {
			if int(i) != len(got) {
				t.Fatalf("index %d at chunk %d", i, len(got))
			}
			got = append(got, c)
		}
		if fmt.Sprint(got) != fmt.Sprint(tt.want) {
			t.Errorf("Chunks(%d, %d, %d) = %v, want %v", tt.n, tt.limit, tt.es, got, tt.want)
		}
	}
}
