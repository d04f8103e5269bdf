package worker_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/worker"
)

// A worker's program learns of the node's failure from Failed and Err at
// once, without a call of its own failing and without a context: here a
// lost server (FPT_ON_SERVER_LOSS=fail) while the program waits on
// nothing but Failed.
func TestFailedClosesOnFailure(t *testing.T) {
	c := startMem(t, 1, 2, nil)
	w := c.Workers[0]
	select {
	case <-w.Failed():
		t.Fatalf("Failed is closed on a running node: %v", w.Err())
	default:
	}
	if err := w.Err(); err != nil {
		t.Fatalf("Err = %v on a running node", err)
	}
	kv := worker.NewKV[float32](w)
	if err := kv.Declare(1, 1, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Kill(node.ServerID(0)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.Failed():
	case <-time.After(time.Minute): // a hang, not a speed check
		t.Fatal("Failed not closed a minute after the only server was killed")
	}
	if err := w.Err(); err == nil {
		t.Fatal("Failed is closed, but Err is nil")
	}
	// Calls made after it refuse, with the node's error.
	if _, err := kv.FPTPush([]uint64{1}, []float32{1}, []int{1}, 0, nil); !errors.Is(err, w.Err()) {
		t.Errorf("a push after the failure: %v, want the node's failure (%v)", err, w.Err())
	}
}

// A training loop that stops at the node's failure, whatever it is
// blocked on otherwise (here: its own data feed).
func ExampleWorker_Failed() {
	train := func(w *worker.Worker, batches <-chan []float32) error {
		for {
			select {
			case <-w.Failed():
				return fmt.Errorf("training stopped: %w", w.Err())
			case b, ok := <-batches:
				if !ok {
					return nil
				}
				_ = b // forward, backward, FPTPush and FPTPull
			}
		}
	}
	_ = train
}
