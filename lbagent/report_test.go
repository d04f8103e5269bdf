package lbagent_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fptps/fpt/control"
	"github.com/fptps/fpt/internal/memcluster"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/worker"
)

// startOne is a cluster of one server and one worker with the LB on, and
// the worker's KV over key 7 (4 float32), its init round done.
func startOne(t *testing.T) (*memcluster.Cluster, *worker.KV[float32]) {
	t.Helper()
	c, err := memcluster.Start(context.Background(), memcluster.Options{Servers: 1, Workers: 1, Env: map[string]string{"FPT_LB": "on"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	w := c.Workers[0]
	kv := worker.NewKV[float32](w)
	if err := w.SetTensorsPerIteration(1); err != nil {
		t.Fatal(err)
	}
	if err := kv.Declare(7, 4, 0); err != nil {
		t.Fatal(err)
	}
	if err := kv.Init(context.Background(), []uint64{7}, []float32{1, 2, 3, 4}, []int{4}); err != nil {
		t.Fatal(err)
	}
	return c, kv
}

// The report a push posts leaves between the control messages the worker
// sent before the push and those it sends after, as the scheduler would
// receive them.
func TestReportKeepsItsPlace(t *testing.T) {
	c, kv := startOne(t)
	m := c.Workers[0].Node()
	from, to := c.ControlPort(node.WorkerID(0)), c.ControlPort(node.SchedulerID)
	c.Control.Hold(from, to)
	defer c.Control.Release(from, to)
	if err := m.SendApp(node.SchedulerID, 0, []byte("before")); err != nil {
		t.Fatal(err)
	}
	vals, out := []float32{1, 2, 3, 4}, make([]float32, 4)
	ts, err := kv.FPTPushPull([]uint64{7}, vals, out, []int{4}, 0, nil) // iteration 1: reports iteration 0
	if err != nil {
		t.Fatal(err)
	}
	if err := m.SendApp(node.SchedulerID, 0, []byte("after")); err != nil {
		t.Fatal(err)
	}
	held, err := c.Control.Held(from, to)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, h := range held {
		switch h.Command {
		case control.App:
			got = append(got, string(h.Body))
		case control.Report:
			got = append(got, "report")
		}
	}
	if fmt.Sprint(got) != "[before report after]" {
		t.Errorf("the worker's app messages and reports reached the scheduler's route as %v; want [before report after]", got)
	}
	if err := kv.Wait(ts); err != nil {
		t.Fatal(err)
	}
}

// A worker's push that begins an iteration, and so reports the last one to
// the LB, returns while the worker's control plane cannot send: the report
// is posted to the member's outbox, not sent inside the push.
func TestPushDoesNotWaitForReport(t *testing.T) {
	c, kv := startOne(t)
	keys, lens := []uint64{7}, []int{4}
	vals := []float32{1, 2, 3, 4}
	port := c.ControlPort(node.WorkerID(0))
	c.Control.Stall(port)
	stalled := true
	defer func() {
		if stalled {
			c.Control.Unstall(port)
		}
	}()
	out := make([]float32, 4)
	type call struct {
		ts  int
		err error
	}
	ret := make(chan call, 1)
	// Iteration 1's push reports iteration 0.
	go func() {
		ts, err := kv.FPTPushPull(keys, vals, out, lens, 0, nil)
		ret <- call{ts, err}
	}()
	var r call
	select {
	case r = <-ret:
	case <-time.After(20 * time.Second):
		t.Fatal("FPTPushPull still in its call 20 s after it began, the control plane stalled")
	}
	c.Control.Unstall(port)
	stalled = false
	if r.err != nil {
		t.Fatal(r.err)
	}
	if err := kv.Wait(r.ts); err != nil {
		t.Fatal(err)
	}
	for i, v := range out {
		if v != vals[i] {
			t.Fatalf("sum %v; want %v (one worker)", out, vals)
		}
	}
}
