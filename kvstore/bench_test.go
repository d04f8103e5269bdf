package kvstore

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"

	"github.com/fptps/fpt/frame"
)

// The benchmarks compare the B-tree store with the map the server used
// before (map[uint64]*Value), on ps-lite's home ground: many sparse keys
// with small values (8 float32s, an embedding row). Run them with e.g.
//
//	go test -run '^$' -bench Lookup -benchtime 1000000x ./kvstore/
//	go test -run '^$' -bench Scan -benchtime 5x ./kvstore/
//	go test -run '^$' -bench Memory -benchtime 1x ./kvstore/

const valueBytes = 32

var benchSizes = []int{1e5, 1e6}

// sparseKeys are n distinct random keys, as hashed feature ids are.
func sparseKeys(n int) []uint64 {
	r := rand.New(rand.NewPCG(1, 2))
	seen := make(map[uint64]struct{}, n)
	keys := make([]uint64, 0, n)
	for len(keys) < n {
		k := r.Uint64()
		if _, ok := seen[k]; !ok {
			seen[k] = struct{}{}
			keys = append(keys, k)
		}
	}
	return keys
}

// store is what both contenders do in the benchmarks.
type store interface {
	add(key uint64, payload []byte)
	get(key uint64) []byte
	scan(fn func(key uint64, data []byte)) // in key order
}

type treeStore struct{ s *Store }

func (t treeStore) add(key uint64, p []byte) {
	if _, err := t.s.Add(key, frame.Float32, 0, p, uint64(len(p))); err != nil {
		panic(err)
	}
}
func (t treeStore) get(key uint64) []byte { v, _ := t.s.Get(key); return v.Data }
func (t treeStore) scan(fn func(uint64, []byte)) {
	t.s.Ascend(0, 0, func(k uint64, v Value) bool { fn(k, v.Data); return true })
}

type mapStore map[uint64]*Value

func (m mapStore) add(key uint64, p []byte) {
	v := m[key]
	if v == nil {
		v = &Value{DType: frame.Float32, Data: make([]byte, len(p))}
		m[key] = v
	}
	copy(v.Data, p)
}
func (m mapStore) get(key uint64) []byte { return m[key].Data }

// scan sorts the keys first: a map has no order.
func (m mapStore) scan(fn func(uint64, []byte)) {
	keys := make([]uint64, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fn(k, m[k].Data)
	}
}

var contenders = []struct {
	name string
	make func() store
}{
	{"btree", func() store { return treeStore{New()} }},
	{"map", func() store { return mapStore{} }},
}

func fill(s store, keys []uint64) {
	p := make([]byte, valueBytes)
	for _, k := range keys {
		s.add(k, p)
	}
}

// eachStore runs bench for every contender at every size, on the same
// sparse keys.
func eachStore(b *testing.B, bench func(b *testing.B, newStore func() store, keys []uint64)) {
	for _, n := range benchSizes {
		keys := sparseKeys(n)
		for _, c := range contenders {
			b.Run(fmt.Sprintf("%s/keys=%d", c.name, n), func(b *testing.B) { bench(b, c.make, keys) })
		}
	}
}

// filled is a store holding keys, made outside the benchmark's timer.
func filled(b *testing.B, newStore func() store, keys []uint64) store {
	s := newStore()
	fill(s, keys)
	b.ResetTimer()
	return s
}

func BenchmarkLookup(b *testing.B) {
	eachStore(b, func(b *testing.B, newStore func() store, keys []uint64) {
		s := filled(b, newStore, keys)
		r := rand.New(rand.NewPCG(3, 4))
		b.SetBytes(valueBytes)
		for range b.N {
			if len(s.get(keys[r.IntN(len(keys))])) != valueBytes {
				b.Fatal("lookup missed")
			}
		}
	})
}

func BenchmarkScan(b *testing.B) {
	eachStore(b, func(b *testing.B, newStore func() store, keys []uint64) {
		s := filled(b, newStore, keys)
		b.SetBytes(int64(len(keys)) * valueBytes)
		for range b.N {
			var prev uint64
			seen := 0
			s.scan(func(k uint64, _ []byte) {
				if seen > 0 && k <= prev {
					b.Fatal("scan out of order")
				}
				prev = k
				seen++
			})
			if seen != len(keys) {
				b.Fatalf("scanned %d keys, want %d", seen, len(keys))
			}
		}
	})
}

// BenchmarkMemory reports the heap each store takes per key, values
// included (32 of the bytes are the value itself).
func BenchmarkMemory(b *testing.B) {
	eachStore(b, func(b *testing.B, newStore func() store, keys []uint64) {
		var perKey float64
		for range b.N {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			s := newStore()
			fill(s, keys)
			runtime.GC()
			runtime.ReadMemStats(&after)
			perKey = float64(after.HeapAlloc-before.HeapAlloc) / float64(len(keys))
			runtime.KeepAlive(s)
		}
		b.ReportMetric(perKey, "bytes/key")
	})
}

// BenchmarkTakeRange takes half the store's keys off its upper end, as a
// server does when another joins after it; by=delete is the same done
// with Ascend and Delete, key by key. Bytes are the values taken.
//
//	go test -run '^$' -bench TakeRange -benchtime 20x ./kvstore/
func BenchmarkTakeRange(b *testing.B) {
	take := func(s *Store, from uint64) int { return len(s.TakeRange(from, 0, nil)) }
	deleteEach := func(s *Store, from uint64) int {
		var out []Item
		s.Ascend(from, 0, func(k uint64, v Value) bool {
			out = append(out, Item{k, v})
			return true
		})
		for _, it := range out {
			s.Delete(it.Key)
		}
		return len(out)
	}
	for _, n := range benchSizes {
		keys := sparseKeys(n)
		mid := slices.Sorted(slices.Values(keys))[n/2]
		for _, by := range []struct {
			name string
			fn   func(*Store, uint64) int
		}{{"TakeRange", take}, {"delete", deleteEach}} {
			b.Run(fmt.Sprintf("keys=%d/by=%s", n, by.name), func(b *testing.B) {
				taken := 0
				for b.Loop() {
					b.StopTimer()
					s := New()
					fill(treeStore{s}, keys)
					b.StartTimer()
					taken = by.fn(s, mid)
				}
				b.SetBytes(int64(taken * valueBytes))
			})
		}
	}
}
