package memvan_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/van"
	"github.com/fptps/fpt/van/internal/wiretest"
	"github.com/fptps/fpt/van/memvan"
	"github.com/fptps/fpt/van/vantest"
)

// The in-memory van keeps the contract of the real ones.
func TestContract(t *testing.T) {
	vantest.Run(t, func() vantest.Listen {
		net := memvan.NewNetwork()
		return func(cfg van.Config) (van.Transport, error) { return net.Listen(cfg) }
	})
}

func newVan(t testing.TB, net *memvan.Network, self node.ID) (*memvan.Van, *vantest.Collector) {
	t.Helper()
	col := vantest.NewCollector()
	v, err := net.Listen(van.Config{Self: self, ListenAddr: "127.0.0.1:0", Handler: col, Logger: vantest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Close() })
	return v, col
}

func send(t testing.TB, v van.Transport, from, to node.ID, key uint64, done func(error)) {
	t.Helper()
	if err := v.Send(&frame.Message{Header: wiretest.PushHeader(from, to, key, 4), Payload: make([]byte, 4), Done: done}); err != nil {
		t.Fatal(err)
	}
}

// Drop breaks every connection of a node: both ends see PeerLost once,
// frames queued for it fail, and nobody can dial it again.
func TestDrop(t *testing.T) {
	net := memvan.NewNetwork()
	a, ca := newVan(t, net, 8)
	b, cb := newVan(t, net, 9)
	c, cc := newVan(t, net, 10)
	vantest.Connect(t, a, 8, b, 9)
	vantest.Connect(t, a, 8, c, 10)
	vantest.Connect(t, b, 9, c, 10)
	a.SetWeight(9, 0) // keep a frame for b queued
	var doneErr atomic.Value
	send(t, a, 8, 9, 1, func(err error) { doneErr.Store(fmt.Sprint(err)) })
	net.Drop(9)
	lost := append(ca.WaitLost(t, 1), cc.WaitLost(t, 1)...)
	for _, l := range lost {
		if l.Peer != 9 || !errors.Is(l.Err, memvan.ErrDropped) {
			t.Errorf("PeerLost(%d, %v), want node 9, dropped", l.Peer, l.Err)
		}
	}
	if l := cb.WaitLost(t, 2); l[0].Peer+l[1].Peer != 8+10 {
		t.Errorf("the dropped node lost %v, want nodes 8 and 10", l)
	}
	vantest.Eventually(t, func() error {
		if s, _ := doneErr.Load().(string); !strings.Contains(s, van.ErrNoPeer.Error()) {
			return fmt.Errorf("the queued frame's Done got %q, want ErrNoPeer", s)
		}
		return nil
	})
	if err := a.Dial(context.Background(), 9, b.Addr()); err == nil {
		t.Error("a dropped node accepted a Dial")
	}
	// a and c still talk, and nobody lost anyone else.
	send(t, c, 10, 8, 5, nil)
	if got := ca.WaitFrames(t, 1); got[0].Header.Key != 5 {
		t.Fatalf("got %v", &got[0].Header)
	}
	if n, m := len(ca.LostPeers()), len(cc.LostPeers()); n != 1 || m != 1 {
		t.Errorf("%d and %d lost peers, want one each", n, m)
	}
}

// Hold keeps one direction's frames until Release, then delivers them in
// order; other directions are not held.
func TestHoldRelease(t *testing.T) {
	net := memvan.NewNetwork()
	a, ca := newVan(t, net, 8)
	b, cb := newVan(t, net, 9)
	c, _ := newVan(t, net, 10)
	vantest.Connect(t, a, 8, b, 9)
	vantest.Connect(t, c, 10, b, 9)
	net.Hold(8, 9)
	var written atomic.Int32
	for k := range uint64(5) {
		send(t, a, 8, 9, k, func(error) { written.Add(1) })
	}
	send(t, b, 9, 8, 99, nil)
	ca.WaitFrames(t, 1) // the other direction flows
	vantest.Eventually(t, func() error {
		if n := written.Load(); n != 5 {
			return fmt.Errorf("a wrote %d frames", n)
		}
		return nil
	})
	// b handles what arrives in order: c's frame, sent after a's were
	// written, would come after them if they had not been held.
	send(t, c, 10, 9, 77, nil)
	if got := cb.WaitFrames(t, 1); len(got) != 1 || got[0].Header.Key != 77 {
		t.Fatalf("b got %d frames, the first with key %d; want only c's", len(got), got[0].Header.Key)
	}
	net.Release(8, 9)
	for i, f := range cb.WaitFrames(t, 6)[1:] {
		if f.Header.Key != uint64(i) {
			t.Fatalf("released frame %d has key %d", i, f.Header.Key)
		}
	}
}

// Close releases every goroutine.
func TestCloseReleasesGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	net := memvan.NewNetwork()
	var vans []*memvan.Van
	for i := range 3 {
		v, err := net.Listen(van.Config{Self: node.ID(8 + i), ListenAddr: "127.0.0.1:0", Handler: vantest.NewCollector(), Logger: vantest.Logger()})
		if err != nil {
			t.Fatal(err)
		}
		vans = append(vans, v)
	}
	vantest.Connect(t, vans[0], 8, vans[1], 9)
	vantest.Connect(t, vans[1], 9, vans[2], 10)
	for _, v := range vans {
		v.Close()
	}
	vantest.Eventually(t, func() error {
		if g := runtime.NumGoroutine(); g > before {
			return fmt.Errorf("%d goroutines after Close, %d before", g, before)
		}
		return nil
	})
}
