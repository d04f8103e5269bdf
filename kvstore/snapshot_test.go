package kvstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/fptps/fpt/frame"
)

// sample is a store with several dtypes, sizes and sparse keys.
func sample(t testing.TB) *Store {
	s := New()
	for _, p := range []struct {
		key   uint64
		dtype frame.DType
		data  []byte
	}{
		{9, frame.Float32, f32s(1, 2, 3)},
		{1 << 40, frame.Float64, make([]byte, 16)},
		{2, frame.Float16, []byte{0, 0x3c}},
		{5, frame.Float32, nil},
	} {
		if _, err := s.Add(p.key, p.dtype, 0, p.data, uint64(len(p.data))); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func snapshot(t testing.TB, s *Store) []byte { return snapshotMeta(t, s, nil) }

func snapshotMeta(t testing.TB, s *Store, meta []byte) []byte {
	var b bytes.Buffer
	n, err := s.Snapshot(&b, meta)
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(b.Len()) {
		t.Fatalf("Snapshot says %d bytes, wrote %d", n, b.Len())
	}
	return b.Bytes()
}

func TestSnapshotRoundTrip(t *testing.T) {
	for i, s := range []*Store{New(), sample(t)} {
		meta := []byte("label")[:i*5] // none, then some
		b := snapshotMeta(t, s, meta)
		got, gotMeta, err := Load(append([]byte(nil), b...))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(gotMeta, meta) {
			t.Fatalf("loaded meta %q, saved %q", gotMeta, meta)
		}
		if m, err := ReadMeta(bytes.NewReader(b)); err != nil || !bytes.Equal(m, meta) {
			t.Fatalf("ReadMeta: %q, %v; saved %q", m, err, meta)
		}
		if got.Len() != s.Len() {
			t.Fatalf("loaded %d keys, saved %d", got.Len(), s.Len())
		}
		s.Ascend(0, 0, func(k uint64, v Value) bool {
			g, ok := got.Get(k)
			if !ok || g.DType != v.DType || !bytes.Equal(g.Data, v.Data) {
				t.Fatalf("key %d: loaded %+v (%v), saved %+v", k, g, ok, v)
			}
			return true
		})
		// The same store writes the same bytes: snapshots are comparable.
		if again := snapshotMeta(t, got, gotMeta); !bytes.Equal(again, b) {
			t.Fatal("a loaded store snapshots differently")
		}
	}
}

// reseal fixes the checksum of a hand-edited snapshot, so that the checks
// behind it are reached.
func reseal(b []byte) []byte {
	body := b[:len(b)-trailerSize]
	binary.LittleEndian.PutUint32(b[len(body):], crc32.Checksum(body, castagnoli))
	return b
}

func TestLoadRefuses(t *testing.T) {
	good := snapshot(t, sample(t))
	edit := func(f func(b []byte) []byte) []byte {
		return f(append([]byte(nil), good...))
	}
	first := headerSize // the first entry (key 2, float16, 2 bytes)
	tests := []struct {
		name string
		b    []byte
		want string
	}{
		{"empty", nil, "shorter than a header"},
		{"truncated to the header", good[:headerSize], "shorter than a header"},
		{"torn in the middle", good[:len(good)/2], "checksum"},
		{"torn by one byte", good[:len(good)-1], "checksum"},
		{"a flipped bit", edit(func(b []byte) []byte { b[first+20] ^= 1; return b }), "checksum"},
		{"wrong magic", edit(func(b []byte) []byte { b[0] = 'X'; return reseal(b) }), "magic"},
		{"future version", edit(func(b []byte) []byte { b[len(magic)] = 3; return reseal(b) }), "version 3"},
		{"meta past the end", edit(func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[len(magic)+12:], 1<<31)
			return reseal(b)
		}), "meta"},
		{"huge count", edit(func(b []byte) []byte {
			binary.LittleEndian.PutUint64(b[len(magic)+4:], 1<<62)
			return reseal(b)
		}), "cannot fit"},
		{"count too small: bytes left over", edit(func(b []byte) []byte {
			binary.LittleEndian.PutUint64(b[len(magic)+4:], 3)
			return reseal(b)
		}), "after the last"},
		{"huge length", edit(func(b []byte) []byte {
			binary.LittleEndian.PutUint64(b[first+9:], 1<<62)
			return reseal(b)
		}), "only"},
		{"unknown dtype", edit(func(b []byte) []byte { b[first+8] = 77; return reseal(b) }), "unknown dtype"},
		{"ragged value", edit(func(b []byte) []byte {
			binary.LittleEndian.PutUint64(b[first+9:], 1)
			return reseal(b)
		}), "not a whole number"},
		{"keys out of order", edit(func(b []byte) []byte {
			binary.LittleEndian.PutUint64(b[first:], 1<<50)
			return reseal(b)
		}), "keys must increase"},
		{"trailing bytes", reseal(append(append([]byte(nil), good[:len(good)-trailerSize]...), 0, 0, 0, 0, 0)), "after the last"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _, err := Load(tt.b)
			if err == nil {
				t.Fatalf("loaded %d keys from a bad snapshot", s.Len())
			}
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q, want ErrCorrupt containing %q", err, tt.want)
			}
		})
	}
}

// TestLoadRange: only the keys of the range are put, beside what the store
// held; values share the snapshot's memory unless copied; a bad snapshot
// is refused whole, as by Load.
func TestLoadRange(t *testing.T) {
	b := snapshotMeta(t, sample(t), []byte("label")) // keys 2, 5, 9, 1<<40
	for _, tt := range []struct {
		name     string
		from, to uint64
		want     []uint64
	}{
		{"all", 0, 0, []uint64{1, 2, 5, 9, 1 << 40}},
		{"middle", 3, 10, []uint64{1, 5, 9}},
		{"from on", 6, 0, []uint64{1, 9, 1 << 40}},
		{"none", 10, 1 << 40, []uint64{1}},
	} {
		for _, copyValues := range []bool{false, true} {
			s := New()
			if _, err := s.Add(1, frame.Float32, 0, f32s(7), 4); err != nil {
				t.Fatal(err)
			}
			in := append([]byte(nil), b...)
			meta, err := s.LoadRange(in, tt.from, tt.to, copyValues)
			if err != nil || string(meta) != "label" {
				t.Fatalf("%s: meta %q, %v", tt.name, meta, err)
			}
			var keys []uint64
			s.Ascend(0, 0, func(k uint64, _ Value) bool { keys = append(keys, k); return true })
			if !slices.Equal(keys, tt.want) {
				t.Fatalf("%s: keys %v, want %v", tt.name, keys, tt.want)
			}
			if v, ok := s.Get(9); ok {
				shares := &v.Data[0] == &in[bytes.Index(in, f32s(1, 2, 3))]
				if shares == copyValues {
					t.Fatalf("%s: copy %v, but the value shares the snapshot's memory: %v", tt.name, copyValues, shares)
				}
			}
		}
	}
	if _, err := New().LoadRange(b[:len(b)-1], 3, 10, false); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a torn snapshot: %v", err)
	}
}

type failWriter struct{ after int }

func (w *failWriter) Write(p []byte) (int, error) {
	if len(p) > w.after {
		n := w.after
		w.after = 0
		return n, errors.New("disk full")
	}
	w.after -= len(p)
	return len(p), nil
}

func TestReadMetaRefuses(t *testing.T) {
	good := snapshotMeta(t, sample(t), []byte("label"))
	huge := append([]byte(nil), good...)
	binary.LittleEndian.PutUint32(huge[len(magic)+12:], MaxMeta+1)
	for _, tt := range []struct {
		name string
		b    []byte
		want string
	}{
		{"empty", nil, "header"},
		{"not a snapshot", []byte("hello, world, this is not a store"), "wrong magic"},
		{"meta cut short", good[:headerSize+2], "meta"},
		{"huge meta", huge, "at most"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if m, err := ReadMeta(bytes.NewReader(tt.b)); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ReadMeta: %q, %v; want ErrCorrupt containing %q", m, err, tt.want)
			}
		})
	}
	if _, err := sample(t).Snapshot(io.Discard, make([]byte, MaxMeta+1)); err == nil {
		t.Fatal("a snapshot took more than MaxMeta bytes of meta")
	}
}

func TestSnapshotWriteError(t *testing.T) {
	for _, after := range []int{0, headerSize + 3, len(snapshot(t, sample(t))) - 2} {
		if _, err := sample(t).Snapshot(&failWriter{after: after}, nil); err == nil || !strings.Contains(err.Error(), "disk full") {
			t.Fatalf("failing after %d bytes: error %v, want disk full", after, err)
		}
	}
}
