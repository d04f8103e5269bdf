package customer_test

import (
	"context"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/fptps/fpt/appmsg"
	"github.com/fptps/fpt/customer"
	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/internal/memcluster"
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

// A message read into an Allocator's buffer that never reaches its
// handler (its customer's queue dropped when the node fails, the customer
// is removed or the set closed, or its customer never registered) gives
// the buffer back: a failed request leaks none of its messages.
func TestDroppedBuffersFreed(t *testing.T) {
	k := customer.Key{App: 2, Customer: 2}
	payload := appmsg.Encode(nil, &appmsg.Meta{App: 2, Flags: appmsg.Request | appmsg.Push}, [][]byte{{1, 2, 3, 4, 5, 6, 7, 8}})
	for _, tc := range []struct {
		name     string
		env      map[string]string
		register bool // else the messages wait for a customer that never comes
		drop     func(c *memcluster.Cluster, set *customer.Set) error
	}{
		{name: "node fails", register: true, drop: func(c *memcluster.Cluster, _ *customer.Set) error { return c.Drop(w0) }},
		{name: "customer removed", register: true, drop: func(_ *memcluster.Cluster, set *customer.Set) error { return set.Remove(k) }},
		{name: "set closed", register: true, drop: func(_ *memcluster.Cluster, set *customer.Set) error { set.Close(); return nil }},
		{name: "never registered", env: map[string]string{"FPT_START_TIMEOUT": "1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := startMem(t, 1, 1, tc.env)
			set := c.Customers(s0)
			a := &testAlloc{}
			set.UseAllocator(a)
			running, release := make(chan struct{}, 1), make(chan struct{})
			var releaseOnce sync.Once
			free := func() { releaseOnce.Do(func() { close(release) }) }
			t.Cleanup(free) // a failed check leaves no handler blocked
			if tc.register {
				// The handler holds the first message while the others queue.
				if err := set.Add(k, func(m *appmsg.Message, err error) {
					if err != nil {
						return
					}
					running <- struct{}{}
					<-release
					a.Free(m.Buffer) // the handler's own
				}); err != nil {
					t.Fatal(err)
				}
			}
			const sent = 3
			for range sent {
				h := &frame.Header{Type: frame.App, Sender: uint32(w0), Recipient: uint32(s0), Length: uint64(len(payload))}
				buf := set.PayloadBuffer(h)
				copy(buf, payload)
				if err := set.HandleFrame(h, buf, true); err != nil {
					t.Fatal(err)
				}
			}
			want := sent
			if tc.register {
				<-running
				want-- // the handler's, freed once it is released
				done := make(chan error, 1)
				go func() { done <- tc.drop(c, set) }()
				waitFreed(t, a, want)
				free()
				if err := <-done; err != nil {
					t.Fatal(err)
				}
				want++
			}
			waitFreed(t, a, want)
			if live, _ := a.counts(); live != 0 {
				t.Fatalf("%d buffers live after every message was dropped or handled", live)
			}
		})
	}
}

// waitFreed waits until a has freed want buffers.
func waitFreed(t *testing.T, a *testAlloc, want int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, freed := a.counts()
		if freed == want {
			return
		}
		if freed > want || time.Now().After(deadline) {
			t.Fatalf("%d buffers freed, want %d", freed, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
