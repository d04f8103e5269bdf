package vantest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/van"
	"github.com/fptps/fpt/van/internal/wiretest"
)

// Rejects counts a van's refused connections by reason (Config.OnReject).
type Rejects struct {
	mu sync.Mutex
	n  map[string]int
}

// NewRejects returns an empty counter.
func NewRejects() *Rejects { return &Rejects{n: make(map[string]int)} }

// Hook is the Config.OnReject to install.
func (r *Rejects) Hook(reason string) {
	r.mu.Lock()
	r.n[reason]++
	r.mu.Unlock()
}

// Count is how many connections were refused for reason.
func (r *Rejects) Count(reason string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[reason]
}

// Wait waits until a connection has been refused for reason.
func (r *Rejects) Wait(t testing.TB, reason string) { t.Helper(); r.WaitN(t, reason, 1) }

// WaitN waits until n connections have been refused for reason: a van
// may count a refusal just after the connection is seen closed.
func (r *Rejects) WaitN(t testing.TB, reason string, n int) {
	t.Helper()
	Eventually(t, func() error {
		if r.Count(reason) < n {
			r.mu.Lock()
			defer r.mu.Unlock()
			return fmt.Errorf("%d connections refused for %q, want %d (refused: %v)", r.n[reason], reason, n, r.n)
		}
		return nil
	})
}

// Key returns the data-plane key of a made-up secret (a real node derives
// it with auth.HelloKey).
func Key(b byte) []byte {
	k := make([]byte, 32)
	for i := range k {
		k[i] = b ^ byte(i)
	}
	return k
}

// authCase is one dialer/acceptor pairing: their keys, and whom the
// acceptor admits.
type authCase struct {
	dialKey, acceptKey []byte
	admit              func(node.ID) string
	refused            string // the reason the acceptor counts; "" = connects
}

func runAuthCase(t *testing.T, l Listen, c authCase) {
	const aID, bID = node.ID(8), node.ID(9)
	rej := NewRejects()
	a, _ := NewVan(t, l, aID, func(cfg *van.Config) { cfg.HelloKey = c.dialKey })
	b, cb := NewVan(t, l, bID, func(cfg *van.Config) {
		cfg.HelloKey, cfg.Admit, cfg.OnReject = c.acceptKey, c.admit, rej.Hook
	})
	if c.refused == "" {
		Connect(t, a, aID, b, bID)
		p := make([]byte, 64)
		wiretest.Fill(p, 3)
		if err := a.Send(&frame.Message{Header: wiretest.PushHeader(aID, bID, 3, len(p)), Payload: p}); err != nil {
			t.Fatal(err)
		}
		if f := cb.WaitFrames(t, 1); wiretest.Check(f[0].Payload, 3) >= 0 {
			t.Fatal("payload corrupted")
		}
		if n := rej.Count("auth"); n != 0 {
			t.Fatalf("%d connections refused", n)
		}
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The dial may fail (a dialer with a key sees the acceptor hang up) or
	// seem to succeed (a plain Hello is not answered); either way the
	// acceptor refuses and counts the connection, and no frame gets in.
	if err := a.Dial(ctx, bID, b.Addr()); err == nil {
		a.Send(&frame.Message{Header: wiretest.PushHeader(aID, bID, 1, 4), Payload: make([]byte, 4)})
	}
	rej.Wait(t, c.refused)
	short, cancel2 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel2()
	if err := b.AwaitPeers(short, []node.ID{aID}); err == nil {
		t.Fatal("the refused dialer became a peer")
	}
	if f := cb.Frames(); len(f) != 0 {
		t.Fatalf("%d frames of a refused connection delivered", len(f))
	}
	if l := cb.LostPeers(); len(l) != 0 {
		t.Fatalf("a refused connection was reported as a lost peer: %v", l)
	}
}

// A connection proves membership with the cluster's key before any frame;
// one without it, with another, or from a node not admitted is refused,
// counted by reason, and never reaches the handler.
func testAuth(t *testing.T, l Listen) {
	onlyLower := func(self node.ID) func(node.ID) string {
		return func(id node.ID) string {
			if id >= self {
				return "direction"
			}
			return ""
		}
	}
	cases := []struct {
		name string
		c    authCase
	}{
		{"SameKey", authCase{dialKey: Key(1), acceptKey: Key(1)}},
		{"NoKeys", authCase{}},
		{"AdmittedSameKey", authCase{dialKey: Key(1), acceptKey: Key(1), admit: onlyLower(9)}},
		{"WrongKey", authCase{dialKey: Key(2), acceptKey: Key(1), refused: "auth"}},
		{"DialerWithoutKey", authCase{acceptKey: Key(1), refused: "auth"}},
		{"AcceptorWithoutKey", authCase{dialKey: Key(1), refused: "auth"}},
		{"Stranger", authCase{dialKey: Key(1), acceptKey: Key(1), admit: func(node.ID) string { return "stranger" }, refused: "stranger"}},
		{"WrongDirection", authCase{dialKey: Key(1), acceptKey: Key(1), admit: onlyLower(7), refused: "direction"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { runAuthCase(t, l, tc.c) })
	}
}

// A van without an id yet (before the node table) refuses every Hello.
func testHelloBeforeID(t *testing.T, l Listen) {
	rej := NewRejects()
	a, _ := NewVan(t, l, 8, nil)
	b, cb := NewVan(t, l, 0, func(cfg *van.Config) { cfg.OnReject = rej.Hook })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a.Dial(ctx, 9, b.Addr())
	rej.Wait(t, "early")
	if f := cb.Frames(); len(f) != 0 {
		t.Fatalf("%d frames delivered", len(f))
	}
}
