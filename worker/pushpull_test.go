package worker_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/van/vantest"
	"github.com/fptps/fpt/worker"
)

// TestPushPullLandsOnce: FPTPushPull's sums land once, in the caller's
// buffer, even when they are complete before its call returns; an FPTPull
// made after its FPTPush returned finds those partitions staged and
// copies them (Restaged). Worker 1 aggregates every partition from
// iteration 2 on and is the last to push, so its own push completes the
// sums on its own goroutine, inside the call: the case where the
// separate calls always stage.
func TestPushPullLandsOnce(t *testing.T) {
	c := mustStart(t, 1, 2, map[string]string{"FPT_LB": "off", "FPT_PARTITION_BYTES": "65536"})
	defer mustFinish(t, c)
	const key, elems = 3, 300 << 8 // 300 KiB: five partitions
	const bytes = elems * 4
	d := lb.Decision{Version: 1, Iteration: 2, Aggregators: []node.ID{node.WorkerID(1)}, Shares: []float64{1}}
	ctx := context.Background()
	kvs := make([]*worker.KV[float32], len(c.workers))
	err := c.each(func(w *worker.Worker) error {
		if err := w.Follow(lb.Directive{Decision: &d, Shaping: true}); err != nil {
			return err
		}
		kv := worker.NewKV[float32](w)
		kvs[w.Rank()] = kv
		if err := kv.Declare(key, elems, 0); err != nil {
			return err
		}
		return kv.Init(ctx, []uint64{key}, make([]float32, elems), nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	keys := []uint64{key}
	// grads[r][j] = (r+1)*(j+iter); the sum is 3*(j+iter).
	grad := func(r int, iter uint64) []float32 {
		g := make([]float32, elems)
		for j := range g {
			g[j] = float32((r + 1) * (j + int(iter)))
		}
		return g
	}
	check := func(name string, iter uint64, sums []float32) {
		t.Helper()
		for j, v := range sums {
			if want := float32(3 * (j + int(iter))); v != want {
				t.Fatalf("%s, iteration %d: element %d is %v, want %v", name, iter, j, v, want)
			}
		}
	}
	restaged0 := kvs[0].Worker().Restaged() // Init in place may stage some
	fromWorkers := func() uint64 { return workerPayload(kvs[1].Worker()).fromWorkers }
	for iter := uint64(1); iter <= 4; iter++ {
		// Worker 0 first: its pull waits. From iteration 2 its push goes
		// to worker 1, which pushes only once every byte of it arrived.
		received := fromWorkers()
		sums0 := make([]float32, elems)
		ts0, err := kvs[0].FPTPushPull(keys, grad(0, iter), sums0, nil, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		if iter >= 2 {
			vantest.Eventually(t, func() error {
				if got := fromWorkers() - received; got != bytes {
					return fmt.Errorf("worker 1 received %d bytes of worker 0's push, want %d", got, bytes)
				}
				return nil
			})
		}
		before := kvs[1].Worker().Restaged()
		// Iteration 1 in place, the sums from the server: their wait
		// opens once worker 1's frames are written. 2 apart, 3 in place
		// with no frame to write: worker 1's own push completes the
		// sums inside the call, and they land once. 4: the separate
		// calls, which find them staged.
		g := grad(1, iter)
		sums1 := g
		if iter == 2 {
			sums1 = make([]float32, elems)
		}
		var ts1 int
		separate := iter == 4
		if separate {
			push, err := kvs[1].FPTPush(keys, g, nil, 0, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := kvs[1].Wait(push); err != nil {
				t.Fatal(err)
			}
			ts1, err = kvs[1].FPTPull(keys, sums1, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
		} else if ts1, err = kvs[1].FPTPushPull(keys, g, sums1, nil, 0, nil); err != nil {
			t.Fatal(err)
		}
		if err := kvs[0].Wait(ts0); err != nil {
			t.Fatal(err)
		}
		if err := kvs[1].Wait(ts1); err != nil {
			t.Fatal(err)
		}
		check("worker 0", iter, sums0)
		check("worker 1", iter, sums1)
		restaged := kvs[1].Worker().Restaged() - before
		switch {
		case separate && iter >= 2 && restaged != bytes:
			t.Errorf("iteration %d, FPTPush then FPTPull: %d bytes copied from staging, want %d (the sums were complete before the pull)", iter, restaged, bytes)
		case iter >= 2 && !separate && restaged != 0:
			t.Errorf("iteration %d, FPTPushPull: %d bytes copied from staging, want 0", iter, restaged)
		}
	}
	if r := kvs[0].Worker().Restaged() - restaged0; r != 0 {
		t.Errorf("worker 0 (its pulls always waiting) copied %d bytes from staging", r)
	}
	if err := c.each(func(w *worker.Worker) error { return w.Barrier(ctx, node.WorkerGroup) }); err != nil {
		t.Fatal(err)
	}
}
