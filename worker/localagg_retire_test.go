package worker

import (
	"testing"
	"time"

	"github.com/fptps/fpt/frame"
)

// TestLocalRetiredGroupDropsNotices: once the LB's Done passed a
// dissolved group's iterations, its leader unmaps the segment but keeps
// its notice socket: the notices its member sends the group afterwards
// (it had not followed the retry yet) are dropped, never refused (a
// refused notice fails a job whose workers may not leave, as here), and
// never touch the unmapped segment; a push of the group's iterations is
// no longer its.
func TestLocalRetiredGroupDropsNotices(t *testing.T) {
	g := newShellGroup(t, 2, 64)
	for _, l := range g.l {
		l.mu.Lock()
		l.elastic = false // a notice that cannot reach its peer fails the job
		l.mu.Unlock()
	}
	leader, member := g.l[0], g.l[1]
	for _, l := range g.l {
		l.dissolve(5)
	}
	for _, tt := range []struct {
		done uint64
		due  bool
	}{{0, false}, {4, false}, {5, true}, {9, true}} {
		if got := leader.due(tt.done); got != tt.due {
			t.Errorf("due at Done %d: %v, want %v", tt.done, got, tt.due)
		}
	}
	leader.unmap()
	if leader.mapped() {
		t.Fatal("the leader's segment is still mapped after unmap")
	}
	if !member.mapped() {
		t.Fatal("the member's segment was unmapped with the leader's")
	}
	h := frame.Header{Type: frame.Push, DType: frame.Float32, Sender: uint32(member.self), Key: 7, Iteration: 3, Total: 64, Length: 64}
	// A contribution and a read of a result never published: a live
	// leader would sum the one and fail on the other.
	if err := member.notify(0, noticeContrib, 0, &h); err != nil {
		t.Fatal(err)
	}
	if err := member.notify(0, noticeRead, 1, &h); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		leader.mu.Lock()
		dropped := leader.retiredDrops
		leader.mu.Unlock()
		g.mu.Lock()
		fails := g.fails
		g.mu.Unlock()
		if len(fails) > 0 {
			t.Fatalf("a notice to the retired group failed the job: %v", fails)
		}
		if dropped == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the retired leader dropped %d notices, want 2", dropped)
		}
		time.Sleep(time.Millisecond)
	}
	rest, err := leader.intercept([]frame.Message{{Header: h, Payload: make([]byte, 64)}})
	if err != nil || len(rest) != 1 {
		t.Errorf("a push to the retired group: left %d frames, %v; want it left to the network", len(rest), err)
	}
	if err := leader.publish(&h, make([]byte, 64)); err != nil {
		t.Errorf("a result to the retired group: %v", err)
	}
	member.unmap()
	if member.mapped() {
		t.Error("the member's segment is still mapped after unmap")
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.fails) > 0 {
		t.Errorf("failed: %v", g.fails)
	}
	if len(g.sent) != 0 {
		t.Errorf("sent over the van %v", g.sent)
	}
}
