package scheduler

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/control"
	"github.com/fptps/fpt/control/memplane"
	"github.com/fptps/fpt/node"
)

// served is a scheduler serving on an in-memory control network, with
// the planes of the nodes a test plays.
type served struct {
	net   *memplane.Network
	sched string // the scheduler's endpoint
	done  chan error
	once  sync.Once
	err   error
}

// serve starts Serve with cfg (RootURI and RootPort set to its plane's)
// on a new in-memory network, its log discarded. The test's cleanup ends
// it and waits for it.
func serve(t *testing.T, cfg config.Config) *served {
	t.Helper()
	s := &served{net: memplane.NewNetwork(), done: make(chan error, 1)}
	sp, err := s.net.Listen(0, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Role, cfg.RootURI, cfg.RootPort = node.Scheduler, "127.0.0.1", sp.Port()
	s.sched = "tcp://127.0.0.1:" + strconv.Itoa(sp.Port())
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		s.done <- Serve(ctx, sp, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, nil, Observers{})
	}()
	t.Cleanup(func() { cancel(); s.wait() })
	return s
}

// wait returns what Serve returned, once it has.
func (s *served) wait() error {
	s.once.Do(func() { s.err = <-s.done })
	return s.err
}

// ended waits up to waitTime for Serve to return by itself, and returns
// its error.
func (s *served) ended(t *testing.T) error {
	t.Helper()
	got := make(chan error, 1)
	go func() { got <- s.wait() }()
	select {
	case err := <-got:
		return err
	case <-time.After(waitTime):
		t.Fatal("Serve did not return")
		return nil
	}
}

// register has a node of each role register in turn, and returns their
// planes in that order.
func (s *served) register(t *testing.T, roles ...node.Role) []*memplane.Plane {
	t.Helper()
	var planes []*memplane.Plane
	for _, role := range roles {
		p, err := s.net.Listen(0, nil)
		if err != nil {
			t.Fatal(err)
		}
		info := node.Info{Role: role, Host: "127.0.0.1", ControlPort: p.Port(), DataPort: p.Port() + 1}
		if err := p.Send(s.sched, &control.Message{Command: control.AddNode, Nodes: []node.Info{info}}); err != nil {
			t.Fatal(err)
		}
		planes = append(planes, p)
	}
	return planes
}

// started takes each plane's node table and first LB directive, has
// every member pass the start barriers, and returns the members by id.
func (s *served) started(t *testing.T, planes []*memplane.Plane) map[node.ID]*memplane.Plane {
	t.Helper()
	members := tables(t, planes, true)
	passStart(t, s.sched, members)
	return members
}

// tables takes each plane's node table and, with the LB's grants, its
// first directive, and returns the members by id.
func tables(t *testing.T, planes []*memplane.Plane, grants bool) map[node.ID]*memplane.Plane {
	t.Helper()
	members := map[node.ID]*memplane.Plane{}
	for _, p := range planes {
		m := next(t, p)
		if m.Command != control.NodeTable {
			t.Fatalf("got %v, want the node table", m.Command)
		}
		members[m.Recipient] = p
	}
	for id, p := range members {
		if !grants {
			break
		}
		if m := next(t, p); m.Command != control.Decision {
			t.Fatalf("%s got %v, want the first directive", id, m.Command)
		}
	}
	return members
}

// roles is servers servers, then workers workers.
func roles(servers, workers int) []node.Role {
	var out []node.Role
	for i := range servers + workers {
		out = append(out, map[bool]node.Role{true: node.Server, false: node.Worker}[i < servers])
	}
	return out
}
