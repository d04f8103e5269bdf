package scheduler

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/control"
	"github.com/fptps/fpt/control/memplane"
	"github.com/fptps/fpt/node"
)

const waitTime = 10 * time.Second

func next(t *testing.T, p *memplane.Plane) *control.Message {
	t.Helper()
	select {
	case m := <-p.Incoming():
		return m
	case <-time.After(waitTime):
		t.Fatal("no message")
	}
	return nil
}

// A member's connection claiming another member's id, and a stranger's,
// are refused and counted; the cluster still runs to its end.
func TestServeRefusesForgedSenders(t *testing.T) {
	net := memplane.NewNetwork()
	sp, err := net.Listen(0, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Config{Role: node.Scheduler, RootURI: "127.0.0.1", RootPort: sp.Port(), NumServers: 1, NumWorkers: 1,
		HeartbeatInterval: time.Hour, HeartbeatTimeout: 2 * time.Hour, StartTimeout: waitTime}
	var mu sync.Mutex
	rejected := map[string]int{}
	done := make(chan error, 1)
	go func() {
		done <- Serve(context.Background(), sp, cfg, nil, nil, func(r string) { mu.Lock(); rejected[r]++; mu.Unlock() }, Observers{})
	}()
	sched := "tcp://127.0.0.1:" + strconv.Itoa(sp.Port())
	srv, _ := net.Listen(0, nil)
	wrk, _ := net.Listen(0, nil)
	stranger, _ := net.Listen(0, nil)
	register := func(p *memplane.Plane, role node.Role) {
		info := node.Info{Role: role, Host: "127.0.0.1", ControlPort: p.Port(), DataPort: p.Port() + 1}
		if err := p.Send(sched, &control.Message{Command: control.AddNode, Nodes: []node.Info{info}}); err != nil {
			t.Fatal(err)
		}
	}
	register(srv, node.Server)
	// A forged AddNode naming the server's address must not get the
	// server a refusal.
	_ = stranger.Send(sched, &control.Message{Command: control.AddNode, Nodes: []node.Info{{Role: node.Server, Host: "127.0.0.1", ControlPort: srv.Port(), DataPort: 1}}})
	register(wrk, node.Worker)
	srvID, wrkID := node.ServerID(0), node.WorkerID(0)
	for _, p := range []*memplane.Plane{srv, wrk} {
		if m := next(t, p); m.Command != control.NodeTable {
			t.Fatalf("got %v, want the node table", m.Command)
		}
	}
	// The worker's connection claims to be the server; a stranger claims
	// to be the worker.
	_ = wrk.Send(sched, &control.Message{Command: control.NodeFailed, Sender: srvID, Target: srvID, Text: "forged"})
	_ = wrk.Send(sched, &control.Message{Command: control.Barrier, Sender: srvID, Group: node.AllGroup})
	_ = stranger.Send(sched, &control.Message{Command: control.NodeFailed, Sender: wrkID, Target: wrkID, Text: "forged"})
	_ = stranger.Send(sched, &control.Message{Command: control.Barrier, Sender: wrkID, Group: node.AllGroup})
	// The worker's own barrier: released only once the server arrives.
	_ = wrk.Send(sched, &control.Message{Command: control.Barrier, Sender: wrkID, Group: node.AllGroup})
	_ = wrk.Send(sched, &control.Message{Command: control.Heartbeat, Sender: wrkID})
	if m := next(t, wrk); m.Command != control.HeartbeatAck {
		t.Fatalf("worker got %v before the server arrived; want only the heartbeat's ack", m.Command)
	}
	_ = srv.Send(sched, &control.Message{Command: control.Barrier, Sender: srvID, Group: node.AllGroup})
	for _, p := range []*memplane.Plane{srv, wrk} {
		if m := next(t, p); m.Command != control.BarrierDone {
			t.Fatalf("got %v, want BarrierDone", m.Command)
		}
	}
	// The final barrier and the termination echo.
	for _, p := range []struct {
		plane *memplane.Plane
		id    node.ID
	}{{srv, srvID}, {wrk, wrkID}} {
		_ = p.plane.Send(sched, &control.Message{Command: control.Barrier, Flags: control.FlagFinal, Sender: p.id, Group: node.AllGroup, Seq: 1})
	}
	for _, p := range []struct {
		plane *memplane.Plane
		id    node.ID
	}{{srv, srvID}, {wrk, wrkID}} {
		if m := next(t, p.plane); m.Command != control.Terminate {
			t.Fatalf("got %v, want Terminate", m.Command)
		}
		_ = p.plane.Send(sched, &control.Message{Command: control.Terminate, Sender: p.id})
	}
	if err := <-done; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if rejected["sender"] != 2 || rejected["stranger"] != 2 || rejected["register"] != 1 {
		t.Errorf("rejected %v; want 2 sender, 2 stranger, 1 register", rejected)
	}
	select {
	case m := <-srv.Incoming():
		t.Errorf("server got %v (%q)", m.Command, m.Text)
	default:
	}
}
