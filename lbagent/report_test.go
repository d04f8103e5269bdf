package lbagent_test

import (
	"context"
	"testing"
	"time"

	"github.com/fptps/fpt/internal/memcluster"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/worker"
)

// A worker's push that begins an iteration, and so reports the last one to
// the LB, returns while the worker's control plane cannot send: the report
// is posted to the member's outbox, not sent inside the push.
func TestPushDoesNotWaitForReport(t *testing.T) {
	c, err := memcluster.Start(context.Background(), memcluster.Options{Servers: 1, Workers: 1, Env: map[string]string{"FPT_LB": "on"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	w := c.Workers[0]
	kv := worker.NewKV[float32](w)
	if err := w.SetTensorsPerIteration(1); err != nil {
		t.Fatal(err)
	}
	if err := kv.Declare(7, 4, 0); err != nil {
		t.Fatal(err)
	}
	keys, lens := []uint64{7}, []int{4}
	vals := []float32{1, 2, 3, 4}
	if err := kv.Init(context.Background(), keys, vals, lens); err != nil {
		t.Fatal(err)
	}
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
