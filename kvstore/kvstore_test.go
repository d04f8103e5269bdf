package kvstore

import (
	"bytes"
	"encoding/binary"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/fptps/fpt/frame"
)

func f32s(vals ...float32) []byte {
	b := make([]byte, 4*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

func TestAdd(t *testing.T) {
	type push struct {
		key     uint64
		dtype   frame.DType
		offset  uint64
		payload []byte
		total   uint64
		err     string // "" for success
	}
	tests := []struct {
		name   string
		pushes []push
		want   map[uint64][]byte
	}{
		{"first push creates zeros plus payload", []push{
			{7, frame.Float32, 4, f32s(2), 12, ""},
		}, map[uint64][]byte{7: f32s(0, 2, 0)}},
		{"pushes add up", []push{
			{1, frame.Float32, 0, f32s(1, 2), 8, ""},
			{1, frame.Float32, 0, f32s(10, 20), 8, ""},
			{1, frame.Float32, 4, f32s(100), 8, ""},
		}, map[uint64][]byte{1: f32s(11, 122)}},
		{"size mismatch refused, value kept", []push{
			{1, frame.Float32, 0, f32s(1, 2), 8, ""},
			{1, frame.Float32, 0, f32s(1, 2, 3), 12, "holds 8 bytes of float32, the push has 12 bytes of float32"},
		}, map[uint64][]byte{1: f32s(1, 2)}},
		{"dtype mismatch refused", []push{
			{1, frame.Float32, 0, f32s(1, 2), 8, ""},
			{1, frame.Float64, 0, f32s(1, 2), 8, "the push has 8 bytes of float64"},
		}, map[uint64][]byte{1: f32s(1, 2)}},
		{"past the end refused, nothing stored", []push{
			{3, frame.Float32, 8, f32s(1, 2), 12, "reaches past the value's 12 bytes"},
		}, map[uint64][]byte{}},
		{"offset beyond total refused", []push{
			{3, frame.Float32, math.MaxUint64 - 3, f32s(1), 8, "reaches past"},
		}, map[uint64][]byte{}},
		{"unknown dtype refused", []push{
			{3, frame.DType(9), 0, f32s(1), 4, "unknown dtype"},
		}, map[uint64][]byte{}},
		{"misaligned offset refused", []push{
			{3, frame.Float32, 2, f32s(1), 8, "not a whole number of float32"},
		}, map[uint64][]byte{}},
		{"ragged payload refused, nothing stored", []push{
			{3, frame.Float32, 0, []byte{1, 2, 3}, 8, "not a whole number"},
		}, map[uint64][]byte{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := New()
			for i, p := range tt.pushes {
				part, err := s.Add(p.key, p.dtype, p.offset, p.payload, p.total)
				switch {
				case p.err == "" && err != nil:
					t.Fatalf("push %d: %v", i, err)
				case p.err != "" && (err == nil || !strings.Contains(err.Error(), p.err)):
					t.Fatalf("push %d: error %v, want one containing %q", i, err, p.err)
				case p.err == "" && len(part) != len(p.payload):
					t.Fatalf("push %d: updated part has %d bytes, want %d", i, len(part), len(p.payload))
				}
			}
			if s.Len() != len(tt.want) {
				t.Fatalf("Len %d, want %d", s.Len(), len(tt.want))
			}
			for k, want := range tt.want {
				v, ok := s.Get(k)
				if !ok || !bytes.Equal(v.Data, want) {
					t.Fatalf("key %d: %v (found %v), want %v", k, v.Data, ok, want)
				}
			}
		})
	}
}

func TestAscend(t *testing.T) {
	s := New()
	for _, k := range []uint64{50, 3, 1 << 63, 20, 7, 0} {
		if _, err := s.Add(k, frame.Float32, 0, f32s(float32(k)), 4); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name     string
		from, to uint64
		stop     int // stop after this many (0: never)
		want     []uint64
	}{
		{"all", 0, 0, 0, []uint64{0, 3, 7, 20, 50, 1 << 63}},
		{"range excludes to", 3, 20, 0, []uint64{3, 7}},
		{"from on", 8, 0, 0, []uint64{20, 50, 1 << 63}},
		{"empty range", 8, 9, 0, nil},
		{"stops when asked", 0, 0, 2, []uint64{0, 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []uint64
			s.Ascend(tt.from, tt.to, func(k uint64, v Value) bool {
				if v.DType != frame.Float32 || len(v.Data) != 4 {
					t.Fatalf("key %d: value %+v", k, v)
				}
				got = append(got, k)
				return tt.stop == 0 || len(got) < tt.stop
			})
			if !slicesEqual(got, tt.want) {
				t.Fatalf("keys %v, want %v", got, tt.want)
			}
		})
	}
}

func slicesEqual(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestTakeRange(t *testing.T) {
	keys := []uint64{0, 3, 7, 20, 50, 1 << 63}
	tests := []struct {
		name     string
		from, to uint64
		keep     []uint64 // keys keep reports true for
		want     []uint64 // keys taken, in order
	}{
		{"everything", 0, 0, nil, keys},
		{"everything but kept", 0, 0, []uint64{7, 1 << 63}, []uint64{0, 3, 20, 50}},
		{"low end", 0, 20, nil, []uint64{0, 3, 7}},
		{"middle from just above the least key", 1, 8, nil, []uint64{3, 7}},
		{"low end but kept", 0, 20, []uint64{0, 7}, []uint64{3}},
		{"high end", 8, 0, nil, []uint64{20, 50, 1 << 63}},
		{"high end with a bound past the greatest key", 20, 1<<63 + 1, nil, []uint64{20, 50, 1 << 63}},
		{"high end but kept", 4, 0, []uint64{20, 1 << 63}, []uint64{7, 50}},
		{"middle", 3, 50, nil, []uint64{3, 7, 20}},
		{"middle but kept", 1, 51, []uint64{7}, []uint64{3, 20, 50}},
		{"empty range", 8, 9, nil, nil},
		{"all kept", 0, 8, []uint64{0, 3, 7}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := New()
			for _, k := range keys {
				if _, err := s.Add(k, frame.Float32, 0, f32s(float32(k), 1), 8); err != nil {
					t.Fatal(err)
				}
			}
			keep := func(key uint64) bool { return slices.Contains(tt.keep, key) }
			if tt.keep == nil {
				keep = nil
			}
			var got []uint64
			for _, it := range s.TakeRange(tt.from, tt.to, keep) {
				if it.DType != frame.Float32 || !bytes.Equal(it.Data, f32s(float32(it.Key), 1)) {
					t.Fatalf("key %d taken with value %+v", it.Key, it.Value)
				}
				got = append(got, it.Key)
			}
			if !slices.Equal(got, tt.want) {
				t.Fatalf("took %v, want %v", got, tt.want)
			}
			// The same as deleting the taken keys one by one, to the byte.
			ref := New()
			for _, k := range keys {
				if _, err := ref.Add(k, frame.Float32, 0, f32s(float32(k), 1), 8); err != nil {
					t.Fatal(err)
				}
			}
			for _, k := range tt.want {
				ref.Delete(k)
			}
			var got1, got2 bytes.Buffer
			if _, err := s.Snapshot(&got1, nil); err != nil {
				t.Fatal(err)
			}
			if _, err := ref.Snapshot(&got2, nil); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got1.Bytes(), got2.Bytes()) {
				t.Fatal("snapshot differs from that of a store with the keys deleted one by one")
			}
			var left []uint64
			s.Ascend(0, 0, func(k uint64, v Value) bool {
				if !bytes.Equal(v.Data, f32s(float32(k), 1)) {
					t.Fatalf("key %d left with value %+v", k, v)
				}
				left = append(left, k)
				return true
			})
			wantLeft := slices.DeleteFunc(slices.Clone(keys), func(k uint64) bool { return slices.Contains(tt.want, k) })
			if !slices.Equal(left, wantLeft) || s.Len() != len(wantLeft) {
				t.Fatalf("left %v (Len %d), want %v", left, s.Len(), wantLeft)
			}
			// The store still works: a taken key is new again, a kept one
			// adds up.
			for _, k := range keys {
				if _, err := s.Add(k, frame.Float32, 0, f32s(1, 1), 8); err != nil {
					t.Fatal(err)
				}
			}
			if s.Len() != len(keys) {
				t.Fatalf("Len %d after adding every key again, want %d", s.Len(), len(keys))
			}
		})
	}
}

// TestAddAtEnds: new keys below, above and between the store's, and
// pushes to existing keys at both ends, which add up rather than
// replace (as a server taking moved keys in key order does).
func TestAddAtEnds(t *testing.T) {
	s := New()
	for i, k := range []uint64{10, 20, 5, 30, 15, 5, 30, 10, 0, math.MaxUint64, 0, math.MaxUint64} {
		if _, err := s.Add(k, frame.Float32, 0, f32s(1), 4); err != nil {
			t.Fatalf("push %d: %v", i, err)
		}
	}
	want := map[uint64]float32{0: 2, 5: 2, 10: 2, 15: 1, 20: 1, 30: 2, math.MaxUint64: 2}
	if s.Len() != len(want) {
		t.Fatalf("Len %d, want %d", s.Len(), len(want))
	}
	for k, w := range want {
		if v, ok := s.Get(k); !ok || !bytes.Equal(v.Data, f32s(w)) {
			t.Fatalf("key %d: %v (found %v), want %v", k, v.Data, ok, w)
		}
	}
}
