package customer

import (
	"errors"
	"testing"
	"time"

	"github.com/fptps/fpt/appmsg"
	"github.com/fptps/fpt/node"
)

func TestTarget(t *testing.T) {
	for _, tt := range []struct {
		role          node.Role
		app, customer int32
		want          Key
	}{
		{node.Server, 0, 3, Key{0, 0}},
		{node.Server, 2, 0, Key{2, 2}},
		{node.Worker, 0, 3, Key{0, 3}},
		{node.Worker, 2, 0, Key{2, 0}},
	} {
		if got := Target(tt.role, &appmsg.Meta{App: tt.app, Customer: tt.customer}); got != tt.want {
			t.Errorf("Target(%s, app %d, customer %d) = %v, want %v", tt.role, tt.app, tt.customer, got, tt.want)
		}
	}
}

func msg(ts int32) *appmsg.Message { return &appmsg.Message{Meta: appmsg.Meta{Timestamp: ts}} }

// drain takes in's items until it would wait or end.
func drain(c *core, in *inbox) (ts []int32, errs int, ended bool) {
	for {
		it, wait, ok := c.next(in)
		if !ok {
			return ts, errs, true
		}
		if wait {
			return ts, errs, false
		}
		if it.msg == nil {
			errs++
			continue
		}
		ts = append(ts, it.msg.Meta.Timestamp)
	}
}

func TestCoreLifecycle(t *testing.T) {
	k := Key{1, 2}
	for _, tt := range []struct {
		name string
		run  func(t *testing.T, c *core)
	}{
		{"queued in order", func(t *testing.T, c *core) {
			in, err := c.add(k, nil)
			if err != nil {
				t.Fatal(err)
			}
			for i := range int32(3) {
				if r, got, _ := c.deliver(k, msg(i), nil, 9); r != routeQueued || got != in {
					t.Fatalf("route %d", r)
				}
			}
			if ts, _, ended := drain(c, in); len(ts) != 3 || ts[0] != 0 || ts[2] != 2 || ended {
				t.Fatalf("took %v, ended %v", ts, ended)
			}
		}},
		{"waits for registration", func(t *testing.T, c *core) {
			r1, _, gen := c.deliver(k, msg(1), nil, 9)
			r2, _, _ := c.deliver(k, msg(2), nil, 11)
			if r1 != routeFirst || r2 != routeWaiting || gen == 0 {
				t.Fatalf("routes %d %d gen %d", r1, r2, gen)
			}
			in, _ := c.add(k, nil)
			if ts, _, _ := drain(c, in); len(ts) != 2 || ts[0] != 1 {
				t.Fatalf("took %v", ts)
			}
			if _, ok := c.expired(k, gen); ok {
				t.Fatal("expired after registration")
			}
		}},
		{"expires", func(t *testing.T, c *core) {
			_, _, gen := c.deliver(k, msg(1), nil, 9)
			w, ok := c.expired(k, gen)
			if !ok || len(w.msgs) != 1 || w.first != 9 {
				t.Fatalf("expired %v %v", w, ok)
			}
			if _, ok := c.expired(k, gen); ok {
				t.Fatal("expired twice")
			}
		}},
		{"twice", func(t *testing.T, c *core) {
			c.add(k, nil)
			if _, err := c.add(k, nil); !errors.Is(err, ErrExists) {
				t.Fatalf("second add: %v", err)
			}
		}},
		{"removed drops", func(t *testing.T, c *core) {
			in, _ := c.add(k, nil)
			c.deliver(k, msg(1), nil, 9)
			if _, _, err := c.remove(k); err != nil {
				t.Fatal(err)
			}
			if _, _, ended := drain(c, in); !ended {
				t.Fatal("removed customer's goroutine not told to end")
			}
			if r, _, _ := c.deliver(k, msg(2), nil, 9); r != routeRemoved {
				t.Fatalf("route %d after remove", r)
			}
			if _, _, err := c.remove(k); !errors.Is(err, ErrUnknown) {
				t.Fatalf("second remove: %v", err)
			}
			if _, err := c.add(k, nil); err != nil {
				t.Fatalf("add after remove: %v", err)
			}
		}},
		{"failure replaces the queue", func(t *testing.T, c *core) {
			in, _ := c.add(k, nil)
			c.deliver(k, msg(1), nil, 9)
			c.deliver(Key{5, 5}, msg(1), nil, 9)
			if wake, _ := c.fail(errors.New("boom")); len(wake) != 1 {
				t.Fatalf("woke %d", len(wake))
			}
			if r, _, _ := c.deliver(k, msg(2), nil, 9); r != routeDropped {
				t.Fatalf("route %d after failure", r)
			}
			if ts, errs, ended := drain(c, in); len(ts) != 0 || errs != 1 || !ended {
				t.Fatalf("took %v, %d failures, ended %v", ts, errs, ended)
			}
			if len(c.pending) != 0 {
				t.Fatal("pending kept")
			}
			if _, err := c.add(Key{3, 3}, nil); !errors.Is(err, ErrFailed) {
				t.Fatalf("add after failure: %v", err)
			}
		}},
		{"close keeps a queued failure", func(t *testing.T, c *core) {
			in, _ := c.add(k, nil)
			c.fail(errors.New("boom"))
			c.close()
			if _, errs, ended := drain(c, in); errs != 1 || !ended {
				t.Fatalf("%d failures, ended %v", errs, ended)
			}
		}},
		{"close stops", func(t *testing.T, c *core) {
			in, _ := c.add(k, nil)
			c.deliver(k, msg(1), nil, 9)
			c.close()
			if ts, _, ended := drain(c, in); len(ts) != 0 || !ended {
				t.Fatalf("took %v, ended %v", ts, ended)
			}
			if _, err := c.add(k, nil); !errors.Is(err, ErrClosed) {
				t.Fatalf("add after close: %v", err)
			}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) { tt.run(t, newCore()) })
	}
}

// A wait for a customer is looked at first after warnAfter, then every
// warnEvery, and last at the timeout, never past it.
func TestHeldNext(t *testing.T) {
	const s = time.Second
	for _, tt := range []struct {
		name             string
		elapsed, timeout time.Duration
		next             time.Duration
		expired          bool
	}{
		{"starts", 0, 300 * s, 10 * s, false},
		{"a short timeout: no warning", 0, 5 * s, 5 * s, false},
		{"first warning", 10 * s, 300 * s, 30 * s, false},
		{"later warning", 250 * s, 300 * s, 30 * s, false},
		{"last look at the timeout", 280 * s, 300 * s, 20 * s, false},
		{"timeout", 300 * s, 300 * s, 0, true},
		{"late timer", 301 * s, 300 * s, 0, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			next, expired := heldNext(tt.elapsed, tt.timeout, 10*s, 30*s)
			if next != tt.next || expired != tt.expired {
				t.Fatalf("heldNext(%s, %s) = %s, %v; want %s, %v", tt.elapsed, tt.timeout, next, expired, tt.next, tt.expired)
			}
		})
	}
}
