package customer_test

import (
	"context"
	"sync"
	"testing"
	"unsafe"

	"github.com/fptps/fpt/appmsg"
	"github.com/fptps/fpt/customer"
	"github.com/fptps/fpt/frame"
)

// testAlloc is an Allocator that counts what it made and took back.
type testAlloc struct {
	mu    sync.Mutex
	live  map[*byte]bool
	freed int
}

func (a *testAlloc) Alloc(n int) []byte {
	b := make([]byte, n)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.live == nil {
		a.live = map[*byte]bool{}
	}
	a.live[unsafe.SliceData(b)] = true
	return b
}

func (a *testAlloc) Free(b []byte) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.live[unsafe.SliceData(b)] {
		panic("Free of a buffer not made, or freed twice")
	}
	delete(a.live, unsafe.SliceData(b))
	a.freed++
}

func (a *testAlloc) counts() (live, freed int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.live), a.freed
}

// With an Allocator, an App payload is read into its buffer and handed to
// the handler as the message's Buffer, the segments aliasing it (no copy);
// a payload that reaches no handler (a removed customer, a malformed one)
// is freed by the Set; one the van kept in its own buffer is copied and
// carries no Buffer.
func TestAllocator(t *testing.T) {
	c := startMem(t, 1, 1, nil)
	set := c.Customers(s0)
	a := &testAlloc{}
	set.UseAllocator(a)
	k := customer.Key{App: 2, Customer: 2}
	g := add(t, set, k)
	vals := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	payload := appmsg.Encode(nil, &appmsg.Meta{App: 2, Flags: appmsg.Request | appmsg.Push}, [][]byte{{9, 9, 9, 9, 9, 9, 9, 9}, vals})
	frameOf := func(p []byte, inPlace bool) error {
		h := &frame.Header{Type: frame.App, Sender: uint32(w0), Recipient: uint32(s0), Length: uint64(len(p))}
		if !inPlace {
			return set.HandleFrame(h, p, false)
		}
		buf := set.PayloadBuffer(h)
		copy(buf, p)
		return set.HandleFrame(h, buf, true)
	}
	if err := frameOf(payload, true); err != nil {
		t.Fatal(err)
	}
	g.wait(t, 1)
	msgs, _ := g.snapshot()
	m := msgs[0]
	if m.Buffer == nil || len(m.Buffer) != len(payload) {
		t.Fatalf("the message's Buffer is %d bytes, want the payload's %d", len(m.Buffer), len(payload))
	}
	seg := m.Segments[1]
	if string(seg) != string(vals) {
		t.Fatalf("segment 1 is %v, want %v", seg, vals)
	}
	if start, end := unsafe.Pointer(unsafe.SliceData(m.Buffer)), unsafe.Add(unsafe.Pointer(unsafe.SliceData(m.Buffer)), len(m.Buffer)); uintptr(unsafe.Pointer(unsafe.SliceData(seg))) < uintptr(start) || uintptr(unsafe.Pointer(unsafe.SliceData(seg))) >= uintptr(end) {
		t.Fatal("segment 1 is a copy, not a view of the Buffer")
	}
	if live, freed := a.counts(); live != 1 || freed != 0 {
		t.Fatalf("after delivery: %d buffers live, %d freed; want 1 (the handler's) and 0", live, freed)
	}
	a.Free(m.Buffer) // the handler's to free

	// The van's own buffer: copied, no Buffer.
	if err := frameOf(payload, false); err != nil {
		t.Fatal(err)
	}
	g.wait(t, 1)
	if msgs, _ := g.snapshot(); msgs[1].Buffer != nil {
		t.Fatal("a message copied from the van's buffer carries a Buffer")
	}
	// Malformed, then for a removed customer: freed by the Set.
	if err := frameOf([]byte{1, 9, 0, 0}, true); err == nil {
		t.Fatal("a malformed payload was taken")
	}
	if err := set.Remove(k); err != nil {
		t.Fatal(err)
	}
	if err := frameOf(payload, true); err != nil {
		t.Fatal(err)
	}
	if live, freed := a.counts(); live != 0 || freed != 3 {
		t.Fatalf("%d buffers live, %d freed; want 0 and 3", live, freed)
	}
	if err := c.Finish(context.Background()); err != nil {
		t.Fatal(err)
	}
}
