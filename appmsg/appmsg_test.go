package appmsg

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"testing"

	"github.com/fptps/fpt/frame"
)

func sample() (Meta, [][]byte) {
	m := Meta{App: 3, Customer: -2, Timestamp: 1 << 30, Head: -7, Flags: Request | Push, DType: frame.Float32}
	return m, [][]byte{{1, 2, 3, 4, 5, 6, 7, 8}, {}, bytes.Repeat([]byte{9}, 1000)}
}

func TestRoundTrip(t *testing.T) {
	m, segs := sample()
	for _, tt := range []struct {
		name string
		m    Meta
		segs [][]byte
	}{
		{"three segments", m, segs},
		{"none", Meta{App: 1, Customer: 1, Flags: Simple}, nil},
		{"four empty", Meta{Flags: Pull}, [][]byte{{}, {}, {}, {}}},
		{"extremes", Meta{App: math.MinInt32, Customer: math.MaxInt32, Timestamp: -1, Head: math.MinInt32, DType: frame.Float16}, [][]byte{{0xff}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if err := Check(&tt.m, tt.segs, 1<<20); err != nil {
				t.Fatal(err)
			}
			b := Encode(nil, &tt.m, tt.segs)
			if uint64(len(b)) != Size(tt.segs) {
				t.Fatalf("encoded %d bytes, Size says %d", len(b), Size(tt.segs))
			}
			got, err := Decode(b)
			if err != nil {
				t.Fatal(err)
			}
			if got.Meta != tt.m {
				t.Fatalf("meta %+v, want %+v", got.Meta, tt.m)
			}
			if len(got.Segments) != len(tt.segs) {
				t.Fatalf("%d segments, want %d", len(got.Segments), len(tt.segs))
			}
			for i := range tt.segs {
				if !bytes.Equal(got.Segments[i], tt.segs[i]) {
					t.Fatalf("segment %d = %v, want %v", i, got.Segments[i], tt.segs[i])
				}
			}
		})
	}
}

// Encode copies: the caller's buffers are free once it returns.
func TestEncodeCopies(t *testing.T) {
	m, segs := sample()
	b := Encode(nil, &m, segs)
	segs[0][0] = 99
	got, err := Decode(b)
	if err != nil || got.Segments[0][0] != 1 {
		t.Fatalf("segment changed with the caller's buffer: %v, %v", got.Segments, err)
	}
}

func TestCheckRejects(t *testing.T) {
	m, segs := sample()
	for _, tt := range []struct {
		name   string
		mutate func(m *Meta) [][]byte
		max    uint64
	}{
		{"five segments", func(*Meta) [][]byte { return make([][]byte, 5) }, 1 << 20},
		{"bad dtype", func(m *Meta) [][]byte { m.DType = 9; return segs }, 1 << 20},
		{"failed flag", func(m *Meta) [][]byte { m.Flags |= Failed; return segs }, 1 << 20},
		{"unknown flag", func(m *Meta) [][]byte { m.Flags = 1 << 31; return segs }, 1 << 20},
		{"too large", func(*Meta) [][]byte { return segs }, 1000},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := m
			s := tt.mutate(&m)
			if err := Check(&m, s, tt.max); !errors.Is(err, ErrInvalid) {
				t.Fatalf("Check = %v, want ErrInvalid", err)
			}
		})
	}
}

func TestDecodeRejects(t *testing.T) {
	m, segs := sample()
	valid := Encode(nil, &m, segs)
	le := binary.LittleEndian
	for _, tt := range []struct {
		name string
		edit func(b []byte) []byte
	}{
		{"empty", func([]byte) []byte { return nil }},
		{"short header", func(b []byte) []byte { return b[:fixedSize-1] }},
		{"version", func(b []byte) []byte { b[0] = 2; return b }},
		{"five segments", func(b []byte) []byte { b[1] = 5; return b }},
		{"255 segments", func(b []byte) []byte { b[1] = 255; return b }},
		{"dtype", func(b []byte) []byte { b[2] = 9; return b }},
		{"reserved", func(b []byte) []byte { b[3] = 1; return b }},
		{"failed flag", func(b []byte) []byte { le.PutUint32(b[4:], Failed); return b }},
		{"lengths cut", func(b []byte) []byte { return b[:fixedSize+8] }},
		{"segment past end", func(b []byte) []byte { le.PutUint64(b[fixedSize:], 1<<20); return b }},
		{"huge segment", func(b []byte) []byte { le.PutUint64(b[fixedSize:], math.MaxUint64); return b }},
		{"trailing bytes", func(b []byte) []byte { return append(b, 0) }},
		{"data cut", func(b []byte) []byte { return b[:len(b)-1] }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := tt.edit(bytes.Clone(valid))
			if _, err := Decode(b); !errors.Is(err, ErrInvalid) {
				t.Fatalf("Decode = %v, want ErrInvalid", err)
			}
		})
	}
}

// A refused payload allocates nothing, whatever lengths it claims.
func TestDecodeRefusalAllocatesNothing(t *testing.T) {
	b := make([]byte, fixedSize+8*MaxSegments)
	b[0], b[1] = Version, MaxSegments
	for i := range MaxSegments {
		binary.LittleEndian.PutUint64(b[fixedSize+8*i:], 1<<62)
	}
	// Many runs: a stray allocation elsewhere in the process (the runtime,
	// a goroutine an earlier test left) does not move the average.
	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := Decode(b); err == nil {
			t.Fatal("accepted")
		}
	})
	// The error's text is the only allocation.
	if allocs > 6 {
		t.Fatalf("refusing allocated %v times", allocs)
	}
}
