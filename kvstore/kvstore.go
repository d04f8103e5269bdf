// Package kvstore is the servers' classic key-value store: ps-lite's
// KVServerDefaultHandle semantics (a push adds into the stored value, a pull
// returns it), kept in key order on a B-tree so that a range of keys can be
// scanned (range pulls, moving a key range between servers) and the whole
// store written in order as a checkpoint (snapshot.go). It does no I/O of
// its own and no locking: the server guards it.
package kvstore

import (
	"fmt"

	"github.com/google/btree"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/reduce"
)

// degree is the B-tree's minimum degree: nodes of up to 63 keys, a few
// cache lines of pointers, near the library's recommended sizes.
const degree = 32

// Value is a stored value. Data is the store's own: it changes under
// later pushes, so a caller that keeps it past its lock copies it.
type Value struct {
	DType frame.DType
	Data  []byte
}

type entry struct {
	key uint64
	Value
}

// Items are values, not pointers: a lookup allocates nothing, and a node
// holds its entries inline (the bytes a value's Data points to are shared
// by every copy, so a push still adds in place).
func less(a, b entry) bool { return a.key < b.key }

// Store is an ordered store of classic values. The zero Store is not
// usable; New makes one.
type Store struct {
	tree *btree.BTreeG[entry]
}

// New makes an empty store.
func New() *Store {
	return &Store{tree: btree.NewG(degree, less)}
}

// Len is how many keys the store holds.
func (s *Store) Len() int { return s.tree.Len() }

// Get is the value of key.
func (s *Store) Get(key uint64) (Value, bool) {
	e, ok := s.tree.Get(entry{key: key})
	if !ok {
		return Value{}, false
	}
	return e.Value, true
}

// Add adds payload, a part of key's value of total bytes of dtype starting
// at byte offset, into the stored value, which the first push of a key
// creates as zeros. It returns the updated part (the store's own bytes).
// A push that disagrees with the stored size or dtype, or reaches past its
// total, is refused and changes nothing.
func (s *Store) Add(key uint64, dtype frame.DType, offset uint64, payload []byte, total uint64) ([]byte, error) {
	es := uint64(dtype.Size())
	switch {
	case es == 0:
		return nil, fmt.Errorf("key %d: unknown dtype %s", key, dtype)
	case total%es != 0 || offset%es != 0:
		return nil, fmt.Errorf("key %d: total %d or offset %d is not a whole number of %s", key, total, offset, dtype)
	case offset > total || uint64(len(payload)) > total-offset:
		return nil, fmt.Errorf("key %d: a push of %d bytes at offset %d reaches past the value's %d bytes", key, len(payload), offset, total)
	}
	e, ok := s.tree.Get(entry{key: key})
	if ok && (e.DType != dtype || uint64(len(e.Data)) != total) {
		return nil, fmt.Errorf("key %d holds %d bytes of %s, the push has %d bytes of %s", key, len(e.Data), e.DType, total, dtype)
	}
	if !ok {
		e = entry{key: key, Value: Value{DType: dtype, Data: make([]byte, total)}}
	}
	part := e.Data[offset : offset+uint64(len(payload))]
	if err := reduce.Add(dtype, part, payload); err != nil {
		return nil, fmt.Errorf("key %d: %w", key, err)
	}
	if !ok {
		s.tree.ReplaceOrInsert(e)
	}
	return part, nil
}

// Ascend calls fn for every key in [from, to) in key order, until fn
// returns false. to == 0 means no upper bound (every key from from on).
func (s *Store) Ascend(from, to uint64, fn func(key uint64, v Value) bool) {
	visit := func(e entry) bool { return fn(e.key, e.Value) }
	if to == 0 {
		s.tree.AscendGreaterOrEqual(entry{key: from}, visit)
		return
	}
	s.tree.AscendRange(entry{key: from}, entry{key: to}, visit)
}

// Delete removes key (a key range handed to another server).
func (s *Store) Delete(key uint64) { s.tree.Delete(entry{key: key}) }

// Item is a key and its value, as TakeRange hands them out.
type Item struct {
	Key uint64
	Value
}

// TakeRange removes every key in [from, to) (to == 0: no upper bound)
// except those keep reports true for, and returns them in key order. keep
// may be nil (take every key); it is called twice per key in the range,
// and must answer the same both times.
//
// A range at either end of the store, as a key range handed to another
// server is, comes off that end without a search per key, and the whole
// store at once; a range in the middle is deleted key by key.
func (s *Store) TakeRange(from, to uint64, keep func(key uint64) bool) []Item {
	// Counting first sizes the result exactly: growing it costs more than
	// the removal itself (large copies of values that hold pointers).
	n, kept := 0, 0
	s.Ascend(from, to, func(key uint64, _ Value) bool {
		n++
		if keep != nil && keep(key) {
			kept++
		}
		return true
	})
	if n == kept {
		return nil
	}
	out := make([]Item, 0, n-kept)
	var back []entry // kept keys taken off an end, to put back
	lo, _ := s.tree.Min()
	hi, _ := s.tree.Max()
	switch {
	case n == s.tree.Len() && kept == 0:
		s.tree.Ascend(func(e entry) bool {
			out = append(out, Item{e.key, e.Value})
			return true
		})
		s.tree.Clear(false)
	case from <= lo.key:
		for range n {
			e, _ := s.tree.DeleteMin()
			if keep != nil && keep(e.key) {
				back = append(back, e)
				continue
			}
			out = append(out, Item{e.key, e.Value})
		}
	case to == 0 || to > hi.key:
		out = out[:n-kept]
		i := len(out)
		for range n {
			e, _ := s.tree.DeleteMax()
			if keep != nil && keep(e.key) {
				back = append(back, e)
				continue
			}
			i--
			out[i] = Item{e.key, e.Value}
		}
	default:
		s.Ascend(from, to, func(key uint64, v Value) bool {
			if keep == nil || !keep(key) {
				out = append(out, Item{key, v})
			}
			return true
		})
		for _, it := range out {
			s.tree.Delete(entry{key: it.Key})
		}
	}
	for _, e := range back {
		s.tree.ReplaceOrInsert(e)
	}
	return out
}
