package classic

import (
	"bytes"
	"encoding/binary"
	"math"
	"slices"
	"testing"

	"github.com/fptps/fpt/node"
)

// servers is the layout's servers of ranks 0..n-1.
func servers(n int) []node.ID {
	s := make([]node.ID, n)
	for i := range s {
		s[i] = node.ServerID(i)
	}
	return s
}

// probeKeys are keys worth checking for a layout of n servers: the ends of
// the key space, every range boundary and its neighbours, and a spread.
func probeKeys(n int) []uint64 {
	keys := []uint64{0, 1, 2, math.MaxUint64, math.MaxUint64 - 1, math.MaxUint64 / 2, math.MaxUint64/2 + 1}
	span := uint64(math.MaxUint64) / uint64(n)
	for i := uint64(1); i <= uint64(n); i++ {
		b := i * span
		keys = append(keys, b-1, b, b+1)
	}
	for i := range uint64(997) {
		keys = append(keys, i*(math.MaxUint64/997)+i)
	}
	return keys
}

func inRange(key, from, to uint64) bool { return key >= from && (to == 0 || key < to) }

func TestServerForOwnerRangeAgree(t *testing.T) {
	for n := 1; n <= 5; n++ {
		l := Initial(servers(n))
		for _, k := range probeKeys(n) {
			i := ServerFor(k, n)
			if i < 0 || i >= n {
				t.Fatalf("n=%d: ServerFor(%d) = %d, out of [0,%d)", n, k, i, n)
			}
			if got, want := l.Owner(k), l.Servers[i]; got != want {
				t.Fatalf("n=%d: Owner(%d) = %v, ServerFor says %v", n, k, got, want)
			}
			holders := 0
			for _, id := range l.Servers {
				from, to, ok := l.Range(id)
				if !ok {
					t.Fatalf("n=%d: Range(%v) not ok", n, id)
				}
				if inRange(k, from, to) {
					holders++
					if id != l.Owner(k) {
						t.Fatalf("n=%d: key %d in Range(%v) = [%d,%d), Owner says %v", n, k, id, from, to, l.Owner(k))
					}
				}
			}
			if holders != 1 {
				t.Fatalf("n=%d: key %d in %d ranges, want 1", n, k, holders)
			}
		}
	}
}

func TestRangesTile(t *testing.T) {
	for n := 1; n <= 5; n++ {
		l := Initial(servers(n))
		var prevTo uint64
		for i, id := range l.Servers {
			from, to, ok := l.Range(id)
			if !ok {
				t.Fatalf("n=%d: Range(%v) not ok", n, id)
			}
			if from != prevTo {
				t.Errorf("n=%d: Range(%v).from = %d, previous to = %d", n, id, from, prevTo)
			}
			last := i == n-1
			if last != (to == 0) {
				t.Errorf("n=%d: Range(%v) = [%d,%d): to==0 only for the last", n, id, from, to)
			}
			if !last && to <= from {
				t.Errorf("n=%d: Range(%v) = [%d,%d) is empty", n, id, from, to)
			}
			// The range's first key and (for a bounded range) its last
			// belong to id, the key after it to the next server.
			if o := l.Owner(from); o != id {
				t.Errorf("n=%d: Owner(%d) = %v, want %v", n, from, o, id)
			}
			if !last {
				if o := l.Owner(to - 1); o != id {
					t.Errorf("n=%d: Owner(%d) = %v, want %v", n, to-1, o, id)
				}
				if o := l.Owner(to); o != l.Servers[i+1] {
					t.Errorf("n=%d: Owner(%d) = %v, want %v", n, to, o, l.Servers[i+1])
				}
			} else if o := l.Owner(math.MaxUint64); o != id {
				t.Errorf("n=%d: Owner(MaxUint64) = %v, want %v", n, o, id)
			}
			prevTo = to
		}
		if l.Owner(0) != l.Servers[0] {
			t.Errorf("n=%d: Owner(0) = %v, want %v", n, l.Owner(0), l.Servers[0])
		}
	}
}

func TestOwnerTable(t *testing.T) {
	s0, s1, s2 := node.ServerID(0), node.ServerID(1), node.ServerID(2)
	third := uint64(math.MaxUint64 / 3)
	tests := []struct {
		name string
		l    Layout
		key  uint64
		want node.ID
	}{
		{"empty", Layout{}, 5, 0},
		{"one server, 0", Initial([]node.ID{s1}), 0, s1},
		{"one server, max", Initial([]node.ID{s1}), math.MaxUint64, s1},
		{"three, first key", Initial([]node.ID{s0, s1, s2}), 0, s0},
		{"three, end of first", Initial([]node.ID{s0, s1, s2}), third - 1, s0},
		{"three, start of second", Initial([]node.ID{s0, s1, s2}), third, s1},
		{"three, start of third", Initial([]node.ID{s0, s1, s2}), 2 * third, s2},
		{"three, max", Initial([]node.ID{s0, s1, s2}), math.MaxUint64, s2},
		{"layout order, not id order", Layout{Servers: []node.ID{s2, s0}}, 0, s2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.l.Owner(tt.key); got != tt.want {
				t.Errorf("%v.Owner(%d) = %v, want %v", tt.l, tt.key, got, tt.want)
			}
		})
	}
}

func TestRangeAbsent(t *testing.T) {
	l := Initial(servers(2))
	if from, to, ok := l.Range(node.ServerID(7)); ok || from != 0 || to != 0 {
		t.Errorf("Range of a server not in %v = %d,%d,%v, want 0,0,false", l, from, to, ok)
	}
	if i := l.Index(node.ServerID(7)); i != -1 {
		t.Errorf("Index of a server not in %v = %d, want -1", l, i)
	}
	if i := l.Index(node.ServerID(1)); i != 1 {
		t.Errorf("Index(%v) in %v = %d, want 1", node.ServerID(1), l, i)
	}
}

func TestInitial(t *testing.T) {
	in := []node.ID{node.ServerID(3), node.ServerID(0), node.ServerID(2), node.ServerID(1)}
	orig := slices.Clone(in)
	l := Initial(in)
	if l.Version != 0 {
		t.Errorf("Initial version = %d, want 0", l.Version)
	}
	if want := servers(4); !slices.Equal(l.Servers, want) {
		t.Errorf("Initial(%v).Servers = %v, want %v", orig, l.Servers, want)
	}
	if !slices.Equal(in, orig) {
		t.Errorf("Initial sorted its argument: %v, was %v", in, orig)
	}
	l.Servers[0] = 99
	if !slices.Equal(in, orig) {
		t.Errorf("Initial's layout aliases its argument: %v, was %v", in, orig)
	}
}

func TestWithWithout(t *testing.T) {
	s := servers(4)
	tests := []struct {
		name string
		l    Layout
		op   func(Layout) Layout
		want Layout
	}{
		{"with onto empty", Layout{}, func(l Layout) Layout { return l.With(s[0]) }, Layout{1, []node.ID{s[0]}}},
		{"with appends", Layout{3, []node.ID{s[0], s[1]}}, func(l Layout) Layout { return l.With(s[3]) }, Layout{4, []node.ID{s[0], s[1], s[3]}}},
		{"with appends a smaller id last", Layout{0, []node.ID{s[1], s[2]}}, func(l Layout) Layout { return l.With(s[0]) }, Layout{1, []node.ID{s[1], s[2], s[0]}}},
		{"without first", Layout{0, []node.ID{s[0], s[1], s[2]}}, func(l Layout) Layout { return l.Without(s[0]) }, Layout{1, []node.ID{s[1], s[2]}}},
		{"without middle", Layout{5, []node.ID{s[0], s[1], s[2]}}, func(l Layout) Layout { return l.Without(s[1]) }, Layout{6, []node.ID{s[0], s[2]}}},
		{"without last", Layout{5, []node.ID{s[0], s[1], s[2]}}, func(l Layout) Layout { return l.Without(s[2]) }, Layout{6, []node.ID{s[0], s[1]}}},
		{"without absent", Layout{2, []node.ID{s[0], s[1]}}, func(l Layout) Layout { return l.Without(s[3]) }, Layout{3, []node.ID{s[0], s[1]}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Give the original spare capacity: an append must still not
			// write into it.
			orig := Layout{Version: tt.l.Version, Servers: append(make([]node.ID, 0, 8), tt.l.Servers...)}
			before := slices.Clone(orig.Servers)
			got := tt.op(orig)
			if got.Version != tt.want.Version || !slices.Equal(got.Servers, tt.want.Servers) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
			if orig.Version != tt.l.Version || !slices.Equal(orig.Servers, before) {
				t.Errorf("original changed to %v, was v%d%v", orig, tt.l.Version, before)
			}
			if len(got.Servers) > 0 {
				got.Servers[0] = 99
				if !slices.Equal(orig.Servers, before) {
					t.Errorf("result aliases the original: %v", orig)
				}
			}
		})
	}
}

func TestLayoutRoundTrip(t *testing.T) {
	for _, l := range []Layout{
		{},
		{Version: 7, Servers: []node.ID{}},
		Initial(servers(1)),
		Initial(servers(5)).With(node.ServerID(9)).Without(node.ServerID(2)),
		{Version: math.MaxUint32, Servers: []node.ID{node.ServerID(3), node.ServerID(0), math.MaxUint32 - 1}},
	} {
		prefix := []byte{0xAA}
		b := l.AppendBinary(prefix)
		if b[0] != 0xAA {
			t.Fatalf("%v: AppendBinary overwrote the prefix", l)
		}
		if len(b) != 1+8+4*len(l.Servers) {
			t.Fatalf("%v: %d bytes, want %d", l, len(b), 1+8+4*len(l.Servers))
		}
		got, err := ParseLayout(b[1:])
		if err != nil {
			t.Fatalf("ParseLayout(%v): %v", l, err)
		}
		if got.Version != l.Version || !slices.Equal(got.Servers, l.Servers) {
			t.Errorf("round trip of %v = %v", l, got)
		}
	}
}

func TestLayoutEncoding(t *testing.T) {
	l := Layout{Version: 0x01020304, Servers: []node.ID{8, 10}}
	want := []byte{4, 3, 2, 1, 2, 0, 0, 0, 8, 0, 0, 0, 10, 0, 0, 0}
	if got := l.AppendBinary(nil); !bytes.Equal(got, want) {
		t.Errorf("AppendBinary = %v, want %v", got, want)
	}
}

func encode(version uint32, ids ...uint32) []byte {
	b := binary.LittleEndian.AppendUint32(nil, version)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(ids)))
	for _, id := range ids {
		b = binary.LittleEndian.AppendUint32(b, id)
	}
	return b
}

func TestParseLayoutRejects(t *testing.T) {
	s0, s1 := uint32(node.ServerID(0)), uint32(node.ServerID(1))
	withCount := func(b []byte, n uint32) []byte {
		binary.LittleEndian.PutUint32(b[4:], n)
		return b
	}
	tests := []struct {
		name string
		b    []byte
	}{
		{"nil", nil},
		{"short", []byte{1, 0, 0, 0, 0, 0, 0}},
		{"count larger than ids", withCount(encode(1, s0, s1), 3)},
		{"count smaller than ids", withCount(encode(1, s0, s1), 1)},
		{"huge count", withCount(encode(1, s0), math.MaxUint32)},
		{"trailing byte", append(encode(1, s0), 0)},
		{"truncated id", encode(1, s0, s1)[:14]},
		{"worker id", encode(1, s0, uint32(node.WorkerID(0)))},
		{"scheduler id", encode(1, uint32(node.SchedulerID))},
		{"zero id", encode(1, 0)},
		{"group id", encode(1, 4)},
		{"duplicate", encode(1, s0, s1, s0)},
		{"duplicate adjacent", encode(1, s1, s1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if l, err := ParseLayout(tt.b); err == nil {
				t.Errorf("ParseLayout(%v) = %v, want an error", tt.b, l)
			}
		})
	}
}

func FuzzParseLayout(f *testing.F) {
	f.Add(encode(0))
	f.Add(encode(3, 8, 10, 12))
	f.Add(encode(1, 8, 9))
	f.Add(encode(1, 8, 8))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := ParseLayout(b)
		if err != nil {
			return
		}
		if got := l.AppendBinary(nil); !bytes.Equal(got, b) {
			t.Fatalf("ParseLayout(%x) = %v, which encodes to %x", b, l, got)
		}
		seen := map[node.ID]bool{}
		for _, id := range l.Servers {
			if r, ok := id.Role(); !ok || r != node.Server || seen[id] {
				t.Fatalf("ParseLayout(%x) accepted %v", b, l)
			}
			seen[id] = true
		}
		for _, k := range []uint64{0, math.MaxUint64, math.MaxUint64 / 2} {
			o := l.Owner(k)
			if len(l.Servers) == 0 {
				if o != 0 {
					t.Fatalf("%v.Owner(%d) = %v, want 0", l, k, o)
				}
			} else if from, to, ok := l.Range(o); !ok || !inRange(k, from, to) {
				t.Fatalf("%v: Owner(%d) = %v, whose range [%d,%d) misses it", l, k, o, from, to)
			}
		}
	})
}
