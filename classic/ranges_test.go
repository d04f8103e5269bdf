package classic

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/kvstore"
	"github.com/fptps/fpt/node"
)

// routed is what happened to a released request when routed again.
type routed struct {
	at    node.ID
	h     frame.Header
	v     Verdict
	owner node.ID
}

// cluster is a few servers' Ranges and stores joined by a test network
// that delivers the frames they send, in FIFO or in a random order.
type cluster struct {
	t      *testing.T
	rng    *rand.Rand // nil: FIFO
	stores map[node.ID]*kvstore.Store
	ranges map[node.ID]*Ranges
	net    []frame.Message
	dead   map[node.ID]bool // frames from a dead server are dropped
	routes []routed         // released requests, routed again, in order
	sent   []frame.Message  // every frame ever sent
}

func newCluster(t *testing.T, rng *rand.Rand) *cluster {
	return &cluster{t: t, rng: rng, stores: map[node.ID]*kvstore.Store{}, ranges: map[node.ID]*Ranges{}, dead: map[node.ID]bool{}}
}

func (c *cluster) add(id node.ID, l Layout, partBytes uint64) {
	c.stores[id] = kvstore.New()
	c.ranges[id] = NewRanges(id, l, partBytes)
}

// take carries out a Todo of server id: queue its frames, route its
// released requests again (holding those still to hold).
func (c *cluster) take(id node.ID, t Todo) {
	c.t.Helper()
	for _, m := range t.Sends {
		if node.ID(m.Header.Sender) != id {
			c.t.Fatalf("%v sent a frame as %v", id, node.ID(m.Header.Sender))
		}
		c.sent = append(c.sent, m)
		if !c.dead[id] {
			c.net = append(c.net, m)
		}
	}
	for _, h := range t.Released {
		r := c.ranges[id]
		v, owner := r.Route(&h.Header)
		if v == Hold {
			r.Hold(&h.Header, h.Payload)
		}
		c.routes = append(c.routes, routed{id, h.Header, v, owner})
	}
}

func (c *cluster) offer(id node.ID, l Layout) {
	c.t.Helper()
	c.take(id, c.ranges[id].Offer(c.stores[id], l))
}

func (c *cluster) lost(id, lost node.ID) {
	c.t.Helper()
	c.take(id, c.ranges[id].Lost(c.stores[id], lost))
}

// deliver hands m to its recipient.
func (c *cluster) deliver(m frame.Message) error {
	to := node.ID(m.Header.Recipient)
	if c.dead[to] {
		return nil // lost on the way
	}
	r, s := c.ranges[to], c.stores[to]
	if r == nil {
		c.t.Fatalf("frame %v to an unknown server", &m.Header)
	}
	var t Todo
	var err error
	switch m.Header.Type {
	case frame.KVMove:
		t, err = r.Move(s, &m.Header, m.Payload)
	case frame.KVMoveEnd:
		t, err = r.MoveEnd(s, &m.Header)
	default:
		c.t.Fatalf("unexpected frame %v", &m.Header)
	}
	if err == nil {
		c.take(to, t)
	}
	return err
}

// pop takes the next frame off the network: a random one, or the first.
func (c *cluster) pop() frame.Message {
	i := 0
	if c.rng != nil {
		i = c.rng.IntN(len(c.net))
	}
	m := c.net[i]
	c.net = slices.Delete(c.net, i, i+1)
	return m
}

// run delivers until the network is empty.
func (c *cluster) run() {
	c.t.Helper()
	for len(c.net) > 0 {
		if m := c.pop(); true {
			if err := c.deliver(m); err != nil {
				c.t.Fatalf("delivering %v: %v", &m.Header, err)
			}
		}
	}
}

// runWhere delivers, until none is left, the frames keep accepts; the
// others stay on the network, in order.
func (c *cluster) runWhere(keep func(m frame.Message) bool) {
	c.t.Helper()
	for {
		i := slices.IndexFunc(c.net, keep)
		if i < 0 {
			return
		}
		m := c.net[i]
		c.net = slices.Delete(c.net, i, i+1)
		if err := c.deliver(m); err != nil {
			c.t.Fatalf("delivering %v: %v", &m.Header, err)
		}
	}
}

// value is a float32 value of 1..4 elements made from i.
func value(i int) []byte {
	var b []byte
	for j := range 1 + i%4 {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(float32(i)+0.25*float32(j)))
	}
	return b
}

// seedKeys puts n keys spread over the whole key space (and the largest
// key) into the stores of their owners under l, and returns every key's
// value.
func (c *cluster) seedKeys(l Layout, n int) map[uint64][]byte {
	c.t.Helper()
	want := map[uint64][]byte{}
	for i := range n {
		want[uint64(i)*(math.MaxUint64/uint64(n))] = value(i)
	}
	want[math.MaxUint64] = value(n)
	c.seed(l, want)
	return want
}

func (c *cluster) seed(l Layout, values map[uint64][]byte) {
	c.t.Helper()
	for k, v := range values {
		if _, err := c.stores[l.Owner(k)].Add(k, frame.Float32, 0, v, uint64(len(v))); err != nil {
			c.t.Fatal(err)
		}
	}
}

// checkExact checks that every key of want is in exactly one store, its
// owner's under l, with want's value, and that the stores hold nothing
// else.
func (c *cluster) checkExact(l Layout, want map[uint64][]byte) {
	c.t.Helper()
	total := 0
	for id, s := range c.stores {
		if c.dead[id] {
			continue
		}
		total += s.Len()
		s.Ascend(0, 0, func(k uint64, v kvstore.Value) bool {
			w, ok := want[k]
			switch {
			case !ok:
				c.t.Errorf("%v holds key %d, which it should not", id, k)
			case l.Owner(k) != id:
				c.t.Errorf("%v holds key %d, owned by %v in %v", id, k, l.Owner(k), l)
			case v.DType != frame.Float32 || !bytes.Equal(v.Data, w):
				c.t.Errorf("%v: key %d = %v %x, want float32 %x", id, k, v.DType, v.Data, w)
			}
			return true
		})
	}
	if total != len(want) {
		c.t.Errorf("stores hold %d keys, want %d", total, len(want))
	}
}

func (c *cluster) checkSettled(l Layout) {
	c.t.Helper()
	for id, r := range c.ranges {
		if c.dead[id] {
			continue
		}
		if r.Settling() || !r.Stable() {
			c.t.Errorf("%v still settling (%v) or not stable (%v)", id, r.Settling(), r.Stable())
		}
		if got := r.Layout(); got.Version != l.Version || !slices.Equal(got.Servers, l.Servers) {
			c.t.Errorf("%v applied %v, want %v", id, got, l)
		}
	}
}

func movesTo(c *cluster, to node.ID, typ frame.Type) int {
	n := 0
	for _, m := range c.net {
		if node.ID(m.Header.Recipient) == to && m.Header.Type == typ {
			n++
		}
	}
	return n
}

var (
	s0 = node.ServerID(0)
	s1 = node.ServerID(1)
	s2 = node.ServerID(2)
	s3 = node.ServerID(3)
)

// TestJoin: a third server joins two; everything moves to its v1 owner,
// whatever the delivery order.
func TestJoin(t *testing.T) {
	for _, seed := range []uint64{0, 1, 2, 3, 42, 1234} {
		var rng *rand.Rand
		if seed != 0 {
			rng = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
		}
		c := newCluster(t, rng)
		v0 := Initial([]node.ID{s1, s0})
		v1 := v0.With(s2)
		for _, id := range []node.ID{s0, s1, s2} {
			c.add(id, v0, 1<<20)
		}
		want := c.seedKeys(v0, 200)
		for _, id := range []node.ID{s0, s1, s2} {
			c.offer(id, v1)
		}
		if !c.ranges[s2].Settling() {
			t.Errorf("seed %d: the joiner is not settling before any frame arrived", seed)
		}
		c.run()
		c.checkSettled(v1)
		c.checkExact(v1, want)
		if t.Failed() {
			t.Fatalf("seed %d failed", seed)
		}
		// A later offer of the same version changes nothing.
		for _, id := range []node.ID{s0, s1, s2} {
			if todo := c.ranges[id].Offer(c.stores[id], v1); len(todo.Sends) != 0 || len(todo.Released) != 0 {
				t.Errorf("second offer of %v to %v: %+v", v1, id, todo)
			}
			if todo := c.ranges[id].Offer(c.stores[id], v0); len(todo.Sends) != 0 {
				t.Errorf("offer of the older %v to %v: %+v", v0, id, todo)
			}
		}
	}
}

// TestJoinFrames: what a server sends when it applies a layout: KVMove
// frames of the keys it loses to their new owners, stamped with the new
// version, and one KVMoveEnd to every other server with the count.
func TestJoinFrames(t *testing.T) {
	c := newCluster(t, nil)
	v0 := Initial([]node.ID{s0, s1})
	v1 := v0.With(s2)
	c.add(s0, v0, 1<<20)
	c.add(s1, v0, 1<<20)
	want := c.seedKeys(v0, 200)
	c.offer(s1, v1)
	counts := map[node.ID]uint32{}
	ends := map[node.ID]uint32{}
	for _, m := range c.sent {
		h := m.Header
		if h.Iteration != uint64(v1.Version) {
			t.Errorf("%v: iteration %d, want %d", &h, h.Iteration, v1.Version)
		}
		switch h.Type {
		case frame.KVMove:
			counts[node.ID(h.Recipient)]++
			if v1.Owner(h.Key) != node.ID(h.Recipient) || v0.Owner(h.Key) != s1 {
				t.Errorf("key %d moved from %v to %v, v1 owner %v", h.Key, s1, node.ID(h.Recipient), v1.Owner(h.Key))
			}
			if !bytes.Equal(m.Payload, want[h.Key]) || h.Total != uint64(len(want[h.Key])) || h.DType != frame.Float32 {
				t.Errorf("key %d moved as %v %x, want %x", h.Key, &h, m.Payload, want[h.Key])
			}
		case frame.KVMoveEnd:
			if _, dup := ends[node.ID(h.Recipient)]; dup {
				t.Errorf("two ends to %v", node.ID(h.Recipient))
			}
			ends[node.ID(h.Recipient)] = h.Aux
		}
	}
	if len(ends) != 2 {
		t.Errorf("ends sent to %v, want s0 and s2", ends)
	}
	for _, id := range []node.ID{s0, s2} {
		if ends[id] != counts[id] {
			t.Errorf("end to %v says %d, %d frames sent", id, ends[id], counts[id])
		}
	}
	if counts[s2] == 0 || counts[s0] != 0 {
		t.Errorf("moves per recipient %v: want some to s2, none to s0", counts)
	}
	// s1 keeps exactly the keys of its v1 range.
	from, to, _ := v1.Range(s1)
	c.stores[s1].Ascend(0, 0, func(k uint64, _ kvstore.Value) bool {
		if !inRange(k, from, to) {
			t.Errorf("s1 kept key %d outside its v1 range [%d,%d)", k, from, to)
		}
		return true
	})
}

func pull(key, iteration uint64) *frame.Header {
	return &frame.Header{Type: frame.KVPull, Key: key, Iteration: iteration}
}

// TestRouteDuringJoin: requests during a change are held, redirected or
// served, and those held come back, in order, once the change settles.
func TestRouteDuringJoin(t *testing.T) {
	c := newCluster(t, nil)
	v0 := Initial([]node.ID{s0, s1})
	v1 := v0.With(s2)
	for _, id := range []node.ID{s0, s1, s2} {
		c.add(id, v0, 1<<20)
	}
	want := c.seedKeys(v0, 200)
	// gained: a key s2 gains from s1 (the largest); kept: a key s1 keeps.
	gained, kept := uint64(math.MaxUint64), uint64(math.MaxUint64/2)
	if v0.Owner(gained) != s1 || v1.Owner(gained) != s2 || v0.Owner(kept) != s1 || v1.Owner(kept) != s1 {
		t.Fatal("test keys do not move as planned")
	}
	moved0 := uint64(math.MaxUint64/3) + 1 // s0 -> s1
	if v0.Owner(moved0) != s0 || v1.Owner(moved0) != s1 {
		t.Fatal("moved0 does not move as planned")
	}

	// Before the joiner heard of v1.
	if v, _ := c.ranges[s2].Route(pull(gained, 1)); v != Hold {
		t.Errorf("s2 at v0: request of v1 = %v, want Hold", v)
	}
	for _, id := range []node.ID{s0, s1, s2} {
		c.offer(id, v1)
	}
	// Deliver everything but the frames to s2 from s1.
	fromS1ToS2 := func(m frame.Message) bool {
		return node.ID(m.Header.Sender) == s1 && node.ID(m.Header.Recipient) == s2
	}
	c.runWhere(func(m frame.Message) bool { return !fromS1ToS2(m) })
	if !c.ranges[s2].Settling() || c.ranges[s1].Settling() || c.ranges[s0].Settling() {
		t.Fatalf("settling: s0 %v s1 %v s2 %v, want only s2", c.ranges[s0].Settling(), c.ranges[s1].Settling(), c.ranges[s2].Settling())
	}

	tests := []struct {
		name      string
		at        node.ID
		h         *frame.Header
		want      Verdict
		wantOwner node.ID
	}{
		{"gained key at the joiner", s2, pull(gained, 1), Hold, 0},
		{"gained key at the joiner, old layout", s2, pull(gained, 0), Hold, 0},
		{"old layout at the old owner", s1, pull(gained, 0), Moved, s2},
		{"old layout, key moved s0 to s1", s0, pull(moved0, 0), Moved, s1},
		{"key kept by s1", s1, pull(kept, 0), Serve, 0},
		{"key s1 gained from s0, s1 settled", s1, pull(moved0, 1), Serve, 0},
		{"unapplied version", s1, pull(kept, 2), Hold, 0},
		{"unapplied version at the joiner", s2, pull(gained, 2), Hold, 0},
		{"key 0 at s0", s0, pull(0, 1), Serve, 0},
		{"key 0 at the joiner", s2, pull(0, 1), Moved, s0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, o := c.ranges[tt.at].Route(tt.h)
			if v != tt.want || o != tt.wantOwner {
				t.Errorf("%v Route(key %d, v%d) = %v %v, want %v %v", tt.at, tt.h.Key, tt.h.Iteration, v, o, tt.want, tt.wantOwner)
			}
		})
	}

	// Hold three requests at s2; the payload is copied.
	payload := []byte{1, 2, 3, 4}
	var held []frame.Header
	for i, k := range []uint64{gained, gained - 1, want2(t, v0, v1, s1, s2)} {
		h := pull(k, 1)
		h.Aux = uint32(i + 1)
		if v, _ := c.ranges[s2].Route(h); v != Hold {
			t.Fatalf("request %d: %v, want Hold", i, v)
		}
		c.ranges[s2].Hold(h, payload)
		held = append(held, *h)
	}
	payload[0] = 99
	// Also one held at s1 for a version it has not applied.
	c.ranges[s1].Hold(pull(kept, 2), nil)

	c.run()
	c.checkSettled(v1)
	c.checkExact(v1, want)
	var got []frame.Header
	for _, r := range c.routes {
		if r.at != s2 {
			t.Errorf("%v released %v; only s2 settled", r.at, &r.h)
			continue
		}
		got = append(got, r.h)
		if r.v != Serve {
			t.Errorf("released %v routed %v %v, want Serve", &r.h, r.v, r.owner)
		}
	}
	if !slices.Equal(got, held) {
		t.Errorf("released %v, want %v in that order", got, held)
	}
	// The next change releases s1's request, which then is served.
	c.routes = nil
	v2 := v1.With(s3)
	c.add(s3, v1, 1<<20)
	for _, id := range []node.ID{s0, s1, s2, s3} {
		c.offer(id, v2)
	}
	c.run()
	c.checkExact(v2, want)
	if len(c.routes) != 1 || c.routes[0].at != s1 || c.routes[0].h.Key != kept {
		t.Fatalf("released after v2: %+v, want s1's request", c.routes)
	}
	if r := c.routes[0]; r.v != Moved && r.v != Serve {
		t.Errorf("released %v at s1 routed %v", &r.h, r.v)
	} else if wantV := v2.Owner(kept) == s1; (r.v == Serve) != wantV || (r.v == Moved && r.owner != v2.Owner(kept)) {
		t.Errorf("released %v at s1 routed %v %v; v2 owner %v", &r.h, r.v, r.owner, v2.Owner(kept))
	}
}

// want2 is a seeded key that moves from `from` under v0 to `to` under v1.
func want2(t *testing.T, v0, v1 Layout, from, to node.ID) uint64 {
	t.Helper()
	for i := range 200 {
		k := uint64(i) * (math.MaxUint64 / 200)
		if v0.Owner(k) == from && v1.Owner(k) == to {
			return k
		}
	}
	t.Fatalf("no seeded key moves from %v to %v", from, to)
	return 0
}

// TestOutOfOrder: ends before moves, and moves of a layout reaching the
// joiner before it was offered the layout.
func TestOutOfOrder(t *testing.T) {
	t.Run("ends first", func(t *testing.T) {
		c := newCluster(t, nil)
		v0 := Initial([]node.ID{s0, s1})
		v1 := v0.With(s2)
		for _, id := range []node.ID{s0, s1, s2} {
			c.add(id, v0, 16) // values of 16 bytes or less, one frame each
		}
		want := c.seedKeys(v0, 200)
		for _, id := range []node.ID{s0, s1, s2} {
			c.offer(id, v1)
		}
		c.runWhere(func(m frame.Message) bool { return m.Header.Type == frame.KVMoveEnd })
		moves := movesTo(c, s2, frame.KVMove)
		if moves < 2 {
			t.Fatalf("%d moves to s2, want several", moves)
		}
		// Every frame but the moves to s2 first; s2 settles only with the
		// last of them.
		c.runWhere(func(m frame.Message) bool { return node.ID(m.Header.Recipient) != s2 })
		for i := range moves {
			if !c.ranges[s2].Settling() || c.ranges[s2].Stable() {
				t.Fatalf("s2 settled (or stable) with %d of %d moves", i, moves)
			}
			// Deliver from the back: the reverse of the send order.
			m := c.net[len(c.net)-1]
			c.net = c.net[:len(c.net)-1]
			if err := c.deliver(m); err != nil {
				t.Fatal(err)
			}
		}
		if len(c.net) != 0 {
			t.Fatalf("%d frames left", len(c.net))
		}
		c.checkSettled(v1)
		c.checkExact(v1, want)
	})
	t.Run("moves before the offer", func(t *testing.T) {
		for _, seed := range []uint64{0, 7, 8, 9} {
			var rng *rand.Rand
			if seed != 0 {
				rng = rand.New(rand.NewPCG(seed, 1))
			}
			c := newCluster(t, rng)
			v0 := Initial([]node.ID{s0, s1})
			v1 := v0.With(s2)
			for _, id := range []node.ID{s0, s1, s2} {
				c.add(id, v0, 8)
			}
			want := c.seedKeys(v0, 200)
			c.offer(s0, v1)
			c.offer(s1, v1)
			c.run()
			if c.ranges[s0].Settling() || c.ranges[s1].Settling() {
				t.Errorf("seed %d: s0/s1 still settling; they wait for each other only", seed)
			}
			if c.stores[s2].Len() == 0 {
				t.Fatalf("seed %d: nothing reached s2", seed)
			}
			if l := c.ranges[s2].Layout(); l.Version != 0 {
				t.Fatalf("seed %d: s2 applied %v unoffered", seed, l)
			}
			// Not settling (its layout is v0's), but its store holds
			// keys of v1: not a checkpoint of v0.
			if c.ranges[s2].Stable() {
				t.Fatalf("seed %d: s2 stable with keys moved early", seed)
			}
			c.offer(s2, v1)
			if c.ranges[s2].Settling() {
				t.Errorf("seed %d: s2 settling though every frame of v1 reached it", seed)
			}
			c.run()
			c.checkSettled(v1)
			c.checkExact(v1, want)
		}
	})
	t.Run("end before the offer, moves after", func(t *testing.T) {
		c := newCluster(t, nil)
		v0 := Initial([]node.ID{s0, s1})
		v1 := v0.With(s2)
		for _, id := range []node.ID{s0, s1, s2} {
			c.add(id, v0, 8)
		}
		want := c.seedKeys(v0, 200)
		c.offer(s0, v1)
		c.offer(s1, v1)
		c.runWhere(func(m frame.Message) bool { return m.Header.Type == frame.KVMoveEnd })
		c.offer(s2, v1)
		if !c.ranges[s2].Settling() {
			t.Fatal("s2 settled before its moves")
		}
		c.run()
		c.checkSettled(v1)
		c.checkExact(v1, want)
	})
}

// TestChunking: a value larger than partBytes moves in several frames
// and arrives whole.
func TestChunking(t *testing.T) {
	for _, seed := range []uint64{0, 5, 6} {
		var rng *rand.Rand
		if seed != 0 {
			rng = rand.New(rand.NewPCG(seed, 2))
		}
		c := newCluster(t, rng)
		v0 := Initial([]node.ID{s0})
		v1 := v0.With(s1)
		c.add(s0, v0, 64)
		c.add(s1, v0, 64)
		big := make([]byte, 1000)
		for i := range 250 {
			binary.LittleEndian.PutUint32(big[4*i:], math.Float32bits(float32(i)*1.5-7))
		}
		key := uint64(math.MaxUint64 - 5)
		want := map[uint64][]byte{key: big, 1: value(3), math.MaxUint64 / 2: value(1)}
		c.seed(v0, want)
		c.offer(s0, v1)
		c.offer(s1, v1)
		parts := map[uint32]bool{}
		for _, m := range c.net {
			if m.Header.Type != frame.KVMove || m.Header.Key != key {
				continue
			}
			if len(m.Payload) > 64 || len(m.Payload)%4 != 0 || m.Header.Total != 1000 {
				t.Errorf("chunk %v of %d bytes", &m.Header, len(m.Payload))
			}
			if !bytes.Equal(m.Payload, big[m.Header.Offset:m.Header.Offset+uint64(len(m.Payload))]) {
				t.Errorf("chunk %v carries the wrong bytes", &m.Header)
			}
			parts[m.Header.Partition] = true
		}
		if len(parts) != 16 { // ceil(1000/64)
			t.Errorf("key moved in %d frames, want 16", len(parts))
		}
		c.run()
		c.checkSettled(v1)
		c.checkExact(v1, want)
	}
}

// TestMoveErrors: frames that cannot be right are refused.
func TestMoveErrors(t *testing.T) {
	v0 := Initial([]node.ID{s0})
	v1 := v0.With(s1)
	move := func(key, offset uint64, payload []byte, total uint64) *frame.Header {
		return &frame.Header{Type: frame.KVMove, DType: frame.Float32, Sender: uint32(s0), Recipient: uint32(s1), Key: key, Iteration: 1, Offset: offset, Total: total}
	}
	end := func(n uint32) *frame.Header {
		return &frame.Header{Type: frame.KVMoveEnd, Sender: uint32(s0), Recipient: uint32(s1), Iteration: 1, Aux: n}
	}
	four := value(3) // 16 bytes
	tests := []struct {
		name string
		run  func(r *Ranges, s *kvstore.Store) error
	}{
		{"second end", func(r *Ranges, s *kvstore.Store) error {
			if _, err := r.MoveEnd(s, end(0)); err != nil {
				t.Fatalf("first end: %v", err)
			}
			_, err := r.MoveEnd(s, end(0))
			return err
		}},
		{"second end after the offer", func(r *Ranges, s *kvstore.Store) error {
			r.Offer(s, v1)
			if _, err := r.Move(s, move(math.MaxUint64, 0, four, 16), four); err != nil {
				t.Fatalf("move: %v", err)
			}
			if _, err := r.MoveEnd(s, end(2)); err != nil {
				t.Fatalf("first end: %v", err)
			}
			_, err := r.MoveEnd(s, end(2))
			return err
		}},
		{"more moves than the end announced", func(r *Ranges, s *kvstore.Store) error {
			if _, err := r.MoveEnd(s, end(1)); err != nil {
				t.Fatalf("end: %v", err)
			}
			if _, err := r.Move(s, move(math.MaxUint64, 0, four[:8], 16), four[:8]); err != nil {
				t.Fatalf("first move: %v", err)
			}
			_, err := r.Move(s, move(math.MaxUint64, 8, four[8:], 16), four[8:])
			return err
		}},
		{"end announcing fewer than came", func(r *Ranges, s *kvstore.Store) error {
			for i := range uint64(2) {
				if _, err := r.Move(s, move(math.MaxUint64-i, 0, four, 16), four); err != nil {
					t.Fatalf("move: %v", err)
				}
			}
			_, err := r.MoveEnd(s, end(1))
			return err
		}},
		{"size disagrees with the stored value", func(r *Ranges, s *kvstore.Store) error {
			if _, err := s.Add(math.MaxUint64, frame.Float32, 0, four[:8], 8); err != nil {
				t.Fatal(err)
			}
			_, err := r.Move(s, move(math.MaxUint64, 0, four, 16), four)
			return err
		}},
		{"dtype disagrees with the stored value", func(r *Ranges, s *kvstore.Store) error {
			if _, err := s.Add(math.MaxUint64, frame.Float64, 0, four, 16); err != nil {
				t.Fatal(err)
			}
			_, err := r.Move(s, move(math.MaxUint64, 0, four, 16), four)
			return err
		}},
		{"past the total", func(r *Ranges, s *kvstore.Store) error {
			_, err := r.Move(s, move(math.MaxUint64, 8, four, 16), four)
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := kvstore.New()
			r := NewRanges(s1, v0, 1<<20)
			if err := tt.run(r, s); err == nil {
				t.Error("no error")
			}
		})
	}
}

// TestMoveFine: the frames TestMoveErrors garbles, in good order, are
// accepted and settle the joiner (so that the errors above are the
// garbling's).
func TestMoveFine(t *testing.T) {
	v0 := Initial([]node.ID{s0})
	v1 := v0.With(s1)
	s := kvstore.New()
	r := NewRanges(s1, v0, 1<<20)
	four := value(3)
	r.Offer(s, v1)
	if !r.Settling() {
		t.Fatal("joiner not settling before s0's keys")
	}
	for _, off := range []uint64{8, 0} {
		h := &frame.Header{Type: frame.KVMove, DType: frame.Float32, Sender: uint32(s0), Key: math.MaxUint64, Iteration: 1, Offset: off, Total: 16}
		if _, err := r.Move(s, h, four[off:off+8]); err != nil {
			t.Fatal(err)
		}
	}
	if !r.Settling() {
		t.Fatal("joiner settled before s0's end")
	}
	if _, err := r.MoveEnd(s, &frame.Header{Type: frame.KVMoveEnd, Sender: uint32(s0), Iteration: 1, Aux: 2}); err != nil {
		t.Fatal(err)
	}
	if r.Settling() {
		t.Fatal("joiner still settling")
	}
	if v, ok := s.Get(math.MaxUint64); !ok || !bytes.Equal(v.Data, four) {
		t.Errorf("moved value %x, want %x", v.Data, four)
	}
}

// withoutS1 is a cluster of s0, s1 and s2 at v0 holding 200 keys (all),
// and v1, v0 without s1; frames are delivered in the order of the
// random stream (seed, stream), or in order for seed 0.
func withoutS1(t *testing.T, seed, stream uint64) (c *cluster, v0, v1 Layout, all map[uint64][]byte) {
	t.Helper()
	var rng *rand.Rand
	if seed != 0 {
		rng = rand.New(rand.NewPCG(seed, stream))
	}
	c = newCluster(t, rng)
	v0 = Initial([]node.ID{s0, s1, s2})
	for _, id := range v0.Servers {
		c.add(id, v0, 8)
	}
	return c, v0, v0.Without(s1), c.seedKeys(v0, 200)
}

// TestLoss: a server is lost; the survivors settle without it and keep
// exactly their keys.
func TestLoss(t *testing.T) {
	t.Run("without", func(t *testing.T) {
		for _, seed := range []uint64{0, 11, 12} {
			c, v0, v1, all := withoutS1(t, seed, 3)
			c.dead[s1] = true
			c.stores[s1] = kvstore.New() // its keys are gone with it
			survivors := map[uint64][]byte{}
			for k, v := range all {
				if v0.Owner(k) != s1 {
					survivors[k] = v
				}
			}
			for _, id := range []node.ID{s0, s2} {
				c.offer(id, v1)
			}
			c.run()
			// s1 is not in v1, but it was in v0: it could be leaving in
			// order, with keys on their way. Until it is lost, the
			// others wait for it.
			for _, id := range []node.ID{s0, s2} {
				if !c.ranges[id].Settling() {
					t.Fatalf("seed %d: %v settled without s1's end or loss", seed, id)
				}
			}
			for _, id := range []node.ID{s0, s2} {
				c.lost(id, s1)
			}
			c.run()
			c.checkSettled(v1)
			c.checkExact(v1, survivors)
			// A request for a key of the lost range is served at its new
			// owner (the value starts afresh).
			k := uint64(math.MaxUint64 / 2)
			if v, _ := c.ranges[v1.Owner(k)].Route(pull(k, 1)); v != Serve {
				t.Errorf("key %d of the lost range at its v1 owner: %v", k, v)
			}
		}
	})
	t.Run("leave in order", func(t *testing.T) {
		// s1 leaves alive: applying v1 it hands every key over, and the
		// others hold the keys they gain until its ends come.
		for _, seed := range []uint64{0, 15, 16} {
			c, _, v1, all := withoutS1(t, seed, 5)
			for _, id := range []node.ID{s0, s2} {
				c.offer(id, v1)
			}
			k := uint64(math.MaxUint64 / 2) // s1's in v0
			if v, _ := c.ranges[v1.Owner(k)].Route(pull(k, 1)); v != Hold {
				t.Errorf("seed %d: key %d, s1's, at its v1 owner before s1's keys came: %v, want Hold", seed, k, v)
			}
			c.run() // s0's and s2's ends
			for _, id := range []node.ID{s0, s2} {
				if !c.ranges[id].Awaits(s1) || c.ranges[id].Awaits(s0) || c.ranges[id].Awaits(s2) {
					t.Errorf("seed %d: %v awaits s1 %v, s0 %v, s2 %v; want s1 only", seed, id, c.ranges[id].Awaits(s1), c.ranges[id].Awaits(s0), c.ranges[id].Awaits(s2))
				}
			}
			c.offer(s1, v1)
			c.run()
			c.checkSettled(v1)
			for _, id := range []node.ID{s0, s2} {
				if c.ranges[id].Awaits(s1) {
					t.Errorf("seed %d: %v still awaits s1 once its keys came", seed, id)
				}
			}
			if n := c.stores[s1].Len(); n != 0 {
				t.Errorf("seed %d: s1 kept %d keys after leaving the layout", seed, n)
			}
			c.checkExact(v1, all)
			if v, _ := c.ranges[v1.Owner(k)].Route(pull(k, 1)); v != Serve {
				t.Errorf("seed %d: key %d at its v1 owner once s1's keys came: %v", seed, k, v)
			}
			if v, o := c.ranges[s1].Route(pull(k, 0)); v != Moved || o != v1.Owner(k) {
				t.Errorf("seed %d: an old request at s1: %v to %v, want Moved to %v", seed, v, o, v1.Owner(k))
			}
		}
	})
	t.Run("lost during a join", func(t *testing.T) {
		for _, seed := range []uint64{0, 13, 14} {
			var rng *rand.Rand
			if seed != 0 {
				rng = rand.New(rand.NewPCG(seed, 4))
			}
			c := newCluster(t, rng)
			v0 := Initial([]node.ID{s0, s1, s3})
			v1 := v0.With(s2)
			for _, id := range v0.Servers {
				c.add(id, v0, 8)
			}
			c.add(s2, v0, 8)
			all := c.seedKeys(v0, 200)
			// s1 dies before it applies v1.
			c.dead[s1] = true
			c.stores[s1] = kvstore.New()
			for _, id := range []node.ID{s0, s3, s2} {
				c.offer(id, v1)
			}
			c.run()
			for _, id := range []node.ID{s0, s3, s2} {
				if !c.ranges[id].Settling() {
					t.Errorf("seed %d: %v settled without s1's end", seed, id)
				}
			}
			// Lost settles them; the scheduler's next layout drops s1.
			for _, id := range []node.ID{s0, s3, s2} {
				c.lost(id, s1)
				if c.ranges[id].Settling() {
					t.Errorf("seed %d: %v still settling after s1 was lost", seed, id)
				}
			}
			v2 := v1.Without(s1)
			for _, id := range []node.ID{s0, s3, s2} {
				c.offer(id, v2)
			}
			c.run()
			c.checkSettled(v2)
			// Lost: s1's keys, and those moved to it in v1.
			survivors := map[uint64][]byte{}
			for k, v := range all {
				if v0.Owner(k) != s1 && v1.Owner(k) != s1 {
					survivors[k] = v
				}
			}
			c.checkExact(v2, survivors)
		}
	})
}

// TestTwoChanges: two joins offered at once: the second waits until the
// first settled. s3, the second joiner, starts from v1 (its table's).
func TestTwoChanges(t *testing.T) {
	for _, seed := range []uint64{0, 21, 22, 23, 24, 25} {
		var rng *rand.Rand
		if seed != 0 {
			rng = rand.New(rand.NewPCG(seed, 5))
		}
		c := newCluster(t, rng)
		v0 := Initial([]node.ID{s0, s1})
		v1 := v0.With(s2)
		v2 := v1.With(s3)
		for _, id := range []node.ID{s0, s1, s2} {
			c.add(id, v0, 8)
		}
		c.add(s3, v1, 8)
		want := c.seedKeys(v0, 200)
		for _, id := range []node.ID{s0, s1, s2, s3} {
			c.offer(id, v1)
			c.offer(id, v2)
			if l := c.ranges[id].Layout(); id != s3 && l.Version != 1 {
				t.Fatalf("seed %d: %v applied %v before v1 settled", seed, id, l)
			}
		}
		for _, m := range c.net {
			if m.Header.Iteration != 1 && node.ID(m.Header.Sender) != s3 {
				t.Fatalf("seed %d: %v before v1 settled", seed, &m.Header)
			}
		}
		c.run()
		c.checkSettled(v2)
		c.checkExact(v2, want)
	}
}

// TestJoinerOfferedLate: the joiner of v1 hears of v1 only after the
// others applied v1 and v2 and sent it their keys of v2: it must keep
// them when it applies v1.
func TestJoinerOfferedLate(t *testing.T) {
	c := newCluster(t, nil)
	v0 := Initial([]node.ID{s0, s1})
	v1 := v0.With(s2)
	v2 := v1.With(s3)
	for _, id := range []node.ID{s0, s1, s2} {
		c.add(id, v0, 8)
	}
	c.add(s3, v1, 8)
	want := c.seedKeys(v0, 200)
	for _, id := range []node.ID{s0, s1, s3} {
		c.offer(id, v1)
		c.offer(id, v2)
	}
	c.run() // s0 and s1 settle v1 (they wait only for each other) and apply v2
	for _, id := range []node.ID{s0, s1} {
		if l := c.ranges[id].Layout(); l.Version != 2 {
			t.Fatalf("%v at %v, want v2", id, l)
		}
	}
	c.offer(s2, v1)
	c.offer(s2, v2)
	c.run()
	c.checkSettled(v2)
	c.checkExact(v2, want)
}

// TestJoinerFromOlderTable: the second joiner's table is v0 (it asked to
// join before the first joiner was admitted), so it is offered v1, which
// does not name it, then v2. Nobody sends a v1 end to a server outside v1:
// it must not wait for one.
func TestJoinerFromOlderTable(t *testing.T) {
	c := newCluster(t, nil)
	v0 := Initial([]node.ID{s0, s1})
	v1 := v0.With(s2)
	v2 := v1.With(s3)
	for _, id := range []node.ID{s0, s1, s2, s3} {
		c.add(id, v0, 8)
	}
	want := c.seedKeys(v0, 200)
	for _, id := range []node.ID{s0, s1, s2, s3} {
		c.offer(id, v1)
		c.offer(id, v2)
	}
	c.run()
	c.checkSettled(v2)
	c.checkExact(v2, want)
	if v, _ := c.ranges[s3].Route(pull(math.MaxUint64, 2)); v != Serve {
		t.Errorf("s3 Route(its key, v2) = %v, want Serve", v)
	}
}

// TestLostMidKey: a server lost after it sent a part of a key's chunks
// takes the whole key with it: the receiver drops the part rather than
// serve it as the value, and ignores what still comes from it.
func TestLostMidKey(t *testing.T) {
	c := newCluster(t, nil)
	v0 := Initial([]node.ID{s0})
	v1 := v0.With(s1)
	c.add(s0, v0, 8)
	c.add(s1, v0, 8)
	key := uint64(math.MaxUint64) // s1's in v1
	big := make([]byte, 40)       // 5 chunks of 8 bytes
	if _, err := c.stores[s0].Add(key, frame.Float32, 0, big, 40); err != nil {
		t.Fatal(err)
	}
	c.offer(s0, v1)
	c.offer(s1, v1)
	first := c.net[0]
	if first.Header.Type != frame.KVMove || node.ID(first.Header.Recipient) != s1 {
		t.Fatalf("first frame %v, want a chunk of the key to %v", &first.Header, s1)
	}
	c.net = c.net[1:]
	if err := c.deliver(first); err != nil {
		t.Fatal(err)
	}
	c.lost(s1, s0)
	if c.ranges[s1].Settling() {
		t.Fatal("still waiting for the lost server")
	}
	if _, ok := c.stores[s1].Get(key); ok {
		t.Fatal("a part of the lost server's key is served as its value")
	}
	c.run() // the rest of its chunks and its end, late: ignored
	if _, ok := c.stores[s1].Get(key); ok {
		t.Fatal("late chunks of a lost server were taken")
	}
}

// TestMoveNotOwned: a moved key the receiver does not own in the frame's
// layout, or for a layout that settled, is refused.
func TestMoveNotOwned(t *testing.T) {
	v0 := Initial([]node.ID{s0, s1})
	v1 := v0.With(s2)
	for _, tt := range []struct {
		name    string
		key     uint64
		version uint64
	}{
		{"a key of another server in the current layout", 0, 1},
		{"a layout that settled", math.MaxUint64, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := NewRanges(s2, v0, 8)
			store := kvstore.New()
			r.Offer(store, v1)
			h := frame.Header{Type: frame.KVMove, DType: frame.Float32, Sender: uint32(s1), Recipient: uint32(s2),
				Key: tt.key, Iteration: tt.version, Length: 4, Total: 4}
			if _, err := r.Move(store, &h, make([]byte, 4)); err == nil {
				t.Fatal("accepted")
			}
			if store.Len() != 0 {
				t.Fatal("the refused key is in the store")
			}
		})
	}
}

// TestSendsOfTwoLayouts: one change (here a loss) that lets two queued
// layouts apply at once returns the frames of both, the first's first.
func TestSendsOfTwoLayouts(t *testing.T) {
	s4 := node.ServerID(4)
	v0 := Initial([]node.ID{s0, s1})
	v1 := v0.With(s2)
	v2 := v1.With(s3)
	v3 := v2.With(s4)
	store := kvstore.New()
	r := NewRanges(s0, v0, 1<<20)
	const n = 1000
	for i := range uint64(n) {
		if k := i * (math.MaxUint64 / n); v0.Owner(k) == s0 {
			if _, err := store.Add(k, frame.Float32, 0, value(int(i)), uint64(len(value(int(i))))); err != nil {
				t.Fatal(err)
			}
		}
	}
	r.Offer(store, v1) // waits for s1
	r.Offer(store, v2)
	r.Offer(store, v3)
	r.Lost(store, s2)
	td := r.Lost(store, s1) // settles v1; v2 and v3 wait for lost servers only
	if len(td.Applied) != 2 || td.Applied[0].Layout.Version != 2 || td.Applied[1].Layout.Version != 3 {
		t.Fatalf("applied %+v, want v2 and v3", td.Applied)
	}
	var got []uint64 // versions of the KVMove frames, in order
	for _, m := range td.Sends {
		if m.Header.Type == frame.KVMove {
			got = append(got, m.Header.Iteration)
		}
	}
	moved := td.Applied[0].MovedOut + td.Applied[1].MovedOut
	if td.Applied[0].MovedOut == 0 || td.Applied[1].MovedOut == 0 || len(got) != moved || !slices.IsSorted(got) {
		t.Fatalf("%d moves of versions %v, want %+v's, v2's first", len(got), got, td.Applied)
	}
	want := 0
	for i := range uint64(n) {
		if v3.Owner(i*(math.MaxUint64/n)) == s0 {
			want++
		}
	}
	if store.Len() != td.Applied[1].Kept || store.Len() != want {
		t.Fatalf("store holds %d keys, Kept says %d, want %d", store.Len(), td.Applied[1].Kept, want)
	}
	store.Ascend(0, 0, func(k uint64, _ kvstore.Value) bool {
		if v3.Owner(k) != s0 {
			t.Fatalf("s0 kept key %d, %v's under %v", k, v3.Owner(k), v3)
		}
		return true
	})
}
