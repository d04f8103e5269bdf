package capi

import (
	"testing"
	"unsafe"
)

// rawMem is raw memory that counts its live blocks.
type rawMem struct {
	live          map[*byte]int
	allocs, frees int
}

func (r *rawMem) Alloc(n int) []byte {
	b := make([]byte, n)
	if r.live == nil {
		r.live = map[*byte]int{}
	}
	r.live[unsafe.SliceData(b)] = n
	r.allocs++
	return b
}

func (r *rawMem) Free(b []byte) {
	n, ok := r.live[unsafe.SliceData(b)]
	if !ok || len(b) != n {
		panic("raw Free of a block not made, freed twice, or of another size")
	}
	delete(r.live, unsafe.SliceData(b))
	r.frees++
}

// byAddress is what fpt_msg_release hands back: the block's address only.
func byAddress(b []byte) []byte { return unsafe.Slice(unsafe.SliceData(b), 1) }

func TestBlockCache(t *testing.T) {
	const mib = 1 << 20
	type step struct {
		op   string // alloc (n bytes, as block name), free (name), drain
		name string
		n    int
		same string // alloc: must be the block that name had
	}
	for _, tc := range []struct {
		name               string
		maxBytes, maxN     int
		steps              []step
		hits, misses, held int
	}{
		{
			name: "a freed block serves the next message of its size", maxBytes: 64 * mib, maxN: 8,
			steps: []step{{op: "alloc", name: "a", n: 8 * mib}, {op: "free", name: "a"}, {op: "alloc", name: "b", n: 8 * mib, same: "a"},
				{op: "free", name: "b"}, {op: "alloc", name: "c", n: 7 * mib, same: "a"}},
			hits: 2, misses: 1,
		},
		{
			name: "a block much larger than asked is left", maxBytes: 64 * mib, maxN: 8,
			steps: []step{{op: "alloc", name: "a", n: 8 * mib}, {op: "free", name: "a"}, {op: "alloc", name: "b", n: 1 * mib}},
			hits:  0, misses: 2, held: 8 * mib,
		},
		{
			name: "small blocks are not kept", maxBytes: 64 * mib, maxN: 8,
			steps: []step{{op: "alloc", name: "a", n: 4096}, {op: "free", name: "a"}, {op: "alloc", name: "b", n: 4096}},
			hits:  0, misses: 2,
		},
		{
			name: "bounded in bytes", maxBytes: 20 * mib, maxN: 8,
			steps: []step{{op: "alloc", name: "a", n: 8 * mib}, {op: "alloc", name: "b", n: 8 * mib}, {op: "alloc", name: "c", n: 8 * mib},
				{op: "free", name: "a"}, {op: "free", name: "b"}, {op: "free", name: "c"}},
			hits: 0, misses: 3, held: 16 * mib,
		},
		{
			name: "bounded in count", maxBytes: 64 * mib, maxN: 1,
			steps: []step{{op: "alloc", name: "a", n: mib}, {op: "alloc", name: "b", n: mib}, {op: "free", name: "a"}, {op: "free", name: "b"}},
			hits:  0, misses: 2, held: mib,
		},
		{
			name: "drained: kept blocks and later ones go back", maxBytes: 64 * mib, maxN: 8,
			steps: []step{{op: "alloc", name: "a", n: mib}, {op: "alloc", name: "b", n: mib}, {op: "free", name: "a"}, {op: "drain"},
				{op: "free", name: "b"}},
			hits: 0, misses: 2,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw := &rawMem{}
			bc := newBlockCache(raw, tc.maxBytes, tc.maxN)
			blocks := map[string][]byte{} // by name, freed or not
			freed := map[string]bool{}
			for _, s := range tc.steps {
				switch s.op {
				case "alloc":
					b := bc.Alloc(s.n)
					if len(b) != s.n {
						t.Fatalf("Alloc(%d) made %d bytes", s.n, len(b))
					}
					if s.same != "" && unsafe.SliceData(b) != unsafe.SliceData(blocks[s.same]) {
						t.Fatalf("block %s is new, want %s's", s.name, s.same)
					}
					blocks[s.name] = b
				case "free":
					bc.Free(byAddress(blocks[s.name]))
					freed[s.name] = true
				case "drain":
					bc.Drain()
				}
			}
			st := bc.Stats()
			if st.Hits != tc.hits || st.Misses != tc.misses || st.Held != tc.held {
				t.Fatalf("stats %+v, want %d hits, %d misses, %d bytes held", st, tc.hits, tc.misses, tc.held)
			}
			if st.RawAllocs != raw.allocs || st.RawFrees != raw.frees {
				t.Fatalf("stats %+v, raw memory made %d and freed %d", st, raw.allocs, raw.frees)
			}
			// Everything given back and drained: no raw block is left.
			for name, b := range blocks {
				if !freed[name] {
					bc.Free(byAddress(b))
				}
			}
			bc.Drain()
			if len(raw.live) != 0 {
				t.Fatalf("%d raw blocks live after every block was freed and the cache drained", len(raw.live))
			}
		})
	}
}
