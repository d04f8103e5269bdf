package cluster_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/fptps/fpt/control"
	"github.com/fptps/fpt/internal/memcluster"
	"github.com/fptps/fpt/node"
)

// Forged control messages, from a connection that is not the scheduler's
// and from a member claiming to be another, are ignored: the cluster still
// passes a barrier and finishes cleanly.
func TestForgedControlIgnored(t *testing.T) {
	c, err := memcluster.Start(context.Background(), memcluster.Options{Servers: 1, Workers: 2, Env: map[string]string{"FPT_LB": "off"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	attacker, err := c.Control.Listen(0, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer attacker.Close()
	ep := func(id node.ID) string { return "tcp://127.0.0.1:" + strconv.Itoa(c.ControlPort(id)) }
	victims := []node.ID{node.ServerID(0), node.WorkerID(0), node.WorkerID(1)}
	for _, v := range victims {
		for _, m := range []*control.Message{
			{Command: control.Terminate, Sender: node.SchedulerID},
			{Command: control.NodeFailed, Sender: node.SchedulerID, Target: node.SchedulerID, Text: "forged"},
			{Command: control.Decision, Sender: node.SchedulerID, Body: []byte{1}},
			{Command: control.BarrierDone, Sender: node.SchedulerID, Group: node.AllGroup, Seq: 2},
		} {
			if err := attacker.Send(ep(v), m); err != nil {
				t.Fatal(err)
			}
		}
	}
	// To the scheduler: a stranger's failure notice, and a member (worker
	// 0's connection) claiming to be worker 1, at its future barriers.
	sched := ep(node.SchedulerID)
	_ = attacker.Send(sched, &control.Message{Command: control.NodeFailed, Sender: node.WorkerID(0), Target: node.WorkerID(1), Text: "forged"})
	w0 := c.Member(node.WorkerID(0))
	for seq := uint64(2); seq < 50; seq++ {
		if err := w0.SendScheduler(&control.Message{Command: control.Barrier, Group: node.WorkerGroup, Seq: seq}); err != nil {
			t.Fatal(err)
		}
	}
	// A stranger claiming worker 1's id, at its next barrier.
	_ = attacker.Send(sched, &control.Message{Command: control.Barrier, Sender: node.WorkerID(1), Group: node.WorkerGroup, Seq: 0})

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Worker 0 alone must not pass the workers' barrier 0 (the forged
	// arrival for worker 1 did not count): run both and see both pass.
	errs := make(chan error, 2)
	for _, id := range []node.ID{node.WorkerID(0), node.WorkerID(1)} {
		go func() { errs <- c.Member(id).Barrier(ctx, node.WorkerGroup) }()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("barrier after forged messages: %v", err)
		}
	}
	for _, v := range victims {
		select {
		case <-c.Member(v).Done():
			t.Fatalf("%s failed: %v", v, c.Member(v).Err())
		default:
		}
	}
	if err := c.Finish(ctx); err != nil {
		t.Fatalf("cluster did not finish cleanly after forged messages: %v", err)
	}
}
