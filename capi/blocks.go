package capi

import (
	"sync"
	"unsafe"

	"github.com/fptps/fpt/customer"
)

// A message's block (the buffer a customer message is read into, which a
// keeping handler holds until fpt_msg_release) comes from a BlockCache:
// blocks given back are kept for the next messages of about their size,
// so that a steady flow of large messages (a KVServer's pushes, a
// KVWorker's pulls) lands in pages the process touched before rather than
// in fresh ones, each 4 KiB of which the kernel would fault in and zero.

// Block cache bounds: blocks smaller than blockCacheMin go straight back
// (malloc serves them from memory it holds), and the cache keeps at most
// blockCacheBytes in at most blockCacheCount blocks: the working set of
// a few messages in flight per peer, even of 10^7 sparse keys.
const (
	blockCacheMin   = 64 << 10
	blockCacheBytes = 512 << 20
	blockCacheCount = 32
)

// BlockCache is a customer.Allocator over raw memory (libfpt's malloc and
// free) that keeps up to a bound of the blocks freed for reuse. Free takes
// a block by its address alone (fpt_msg_release knows no size): the cache
// remembers the size of each block it handed out. Safe for concurrent use.
type BlockCache struct {
	raw            customer.Allocator
	maxBytes, maxN int
	mu             sync.Mutex
	out            map[*byte]int // handed out: the block's full size
	free           [][]byte      // kept, each its full size
	held           int           // bytes in free
	drained        bool
	// misses are the raw allocator's blocks made, too.
	hits, misses, rawFrees int
}

// NewBlockCache makes a cache over raw with the default bounds.
func NewBlockCache(raw customer.Allocator) *BlockCache {
	return newBlockCache(raw, blockCacheBytes, blockCacheCount)
}

func newBlockCache(raw customer.Allocator, maxBytes, maxN int) *BlockCache {
	return &BlockCache{raw: raw, maxBytes: maxBytes, maxN: maxN, out: map[*byte]int{}}
}

// fits reports whether a kept block of size c serves a request of n
// bytes without wasting more than a quarter of it.
func fits(c, n int) bool { return c >= n && c-n <= c/4 }

// Alloc returns a block of n bytes: a kept one that fits (the smallest),
// else a new one from the raw allocator.
func (bc *BlockCache) Alloc(n int) []byte {
	bc.mu.Lock()
	best := -1
	if n >= blockCacheMin {
		for i, b := range bc.free {
			if fits(len(b), n) && (best < 0 || len(b) < len(bc.free[best])) {
				best = i
			}
		}
	}
	if best >= 0 {
		b := bc.free[best]
		last := len(bc.free) - 1
		bc.free[best], bc.free[last] = bc.free[last], nil
		bc.free = bc.free[:last]
		bc.held -= len(b)
		bc.out[unsafe.SliceData(b)] = len(b)
		bc.hits++
		bc.mu.Unlock()
		return b[:n]
	}
	bc.misses++
	bc.mu.Unlock()
	b := bc.raw.Alloc(n)
	if n > 0 {
		bc.mu.Lock()
		bc.out[unsafe.SliceData(b)] = n
		bc.mu.Unlock()
	}
	return b
}

// Free takes back the block at b's address: kept for reuse while the
// bounds allow and the cache is not drained, else freed.
func (bc *BlockCache) Free(b []byte) {
	p := unsafe.SliceData(b)
	if p == nil {
		return
	}
	bc.mu.Lock()
	size, ok := bc.out[p]
	if ok {
		delete(bc.out, p)
		b = unsafe.Slice(p, size)
	}
	keep := ok && !bc.drained && size >= blockCacheMin && bc.held+size <= bc.maxBytes && len(bc.free) < bc.maxN
	if keep {
		bc.free = append(bc.free, b)
		bc.held += size
	} else {
		bc.rawFrees++
	}
	bc.mu.Unlock()
	if !keep {
		bc.raw.Free(b)
	}
}

// Drain frees every kept block; from then on blocks given back are freed
// at once (a program may release messages after fpt_finalize).
func (bc *BlockCache) Drain() {
	bc.mu.Lock()
	kept := bc.free
	bc.free, bc.held, bc.drained = nil, 0, true
	bc.rawFrees += len(kept)
	bc.mu.Unlock()
	for _, b := range kept {
		bc.raw.Free(b)
	}
}

// BlockStats is what a BlockCache did: blocks served from the cache
// (Hits) or the raw allocator (Misses), bytes kept now (Held), and the
// raw allocator's blocks made and freed.
type BlockStats struct {
	Hits, Misses, Held  int
	RawAllocs, RawFrees int
}

// Stats reports what the cache did so far.
func (bc *BlockCache) Stats() BlockStats {
	bc.mu.Lock()
	defer bc.mu.Unlock()
	return BlockStats{Hits: bc.hits, Misses: bc.misses, Held: bc.held, RawAllocs: bc.misses, RawFrees: bc.rawFrees}
}
