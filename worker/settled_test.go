package worker_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/fptps/fpt/worker"
)

// Test tells, without blocking, whether a request settled: a pull is not
// while the other worker has not pushed, is once Wait returned; a
// timestamp no call returned is ErrNoRequest. Requests without a callback
// need nothing else to be waited for (the Python package makes them so).
func TestTestReportsSettled(t *testing.T) {
	c := startMem(t, 1, 2, map[string]string{"FPT_LB": "off"})
	ctx := context.Background()
	var wg sync.WaitGroup
	for _, w := range c.Workers {
		wg.Go(func() {
			kv := worker.NewKV[float32](w)
			if err := kv.Declare(1, 4, 0); err != nil {
				t.Error(err)
				return
			}
			if err := kv.Init(ctx, []uint64{1}, make([]float32, 4), []int{4}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	w0, w1 := worker.NewKV[float32](c.Workers[0]), worker.NewKV[float32](c.Workers[1])
	vals, sum := []float32{1, 2, 3, 4}, make([]float32, 4)
	// A push or pull of no keys settles at once (fpt_push(NULL, 0, ...)).
	for _, call := range []func() (int, error){
		func() (int, error) { return w0.FPTPush(nil, nil, nil, 0, nil) },
		func() (int, error) { return w0.FPTPull(nil, nil, nil, nil) },
	} {
		ts, err := call()
		if err != nil {
			t.Fatalf("a request of no keys: %v", err)
		}
		if err := w0.Wait(ts); err != nil {
			t.Fatalf("waiting for a request of no keys: %v", err)
		}
	}
	push, err := w0.FPTPush([]uint64{1}, vals, []int{4}, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	pull, err := w0.FPTPull([]uint64{1}, sum, []int{4}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if done, err := c.Workers[0].Test(pull); done || err != nil {
		t.Errorf("Test(pull) before the other worker pushed: %v, %v; want false, nil", done, err)
	}
	if _, err := w1.FPTPush([]uint64{1}, vals, []int{4}, 0, nil); err != nil {
		t.Fatal(err)
	}
	for _, ts := range []int{push, pull} {
		if err := w0.Wait(ts); err != nil {
			t.Fatal(err)
		}
		if done, err := c.Workers[0].Test(ts); !done || err != nil {
			t.Errorf("Test(%d) after its Wait: %v, %v; want true, nil", ts, done, err)
		}
	}
	if sum[3] != 8 {
		t.Errorf("sum %v, want twice %v", sum, vals)
	}
	if _, err := c.Workers[0].Test(pull + 100); !errors.Is(err, worker.ErrNoRequest) {
		t.Errorf("Test of a timestamp no call returned: %v, want ErrNoRequest", err)
	}
}

// Notify runs its function once, with the request's error, on the
// goroutine that released the request (fpt_wait's thread blocks in C on
// what it signals); a request settled already, or a timestamp no call
// returned, answers at once with what Wait would.
func TestNotifyReleasesOnce(t *testing.T) {
	c := startMem(t, 1, 2, map[string]string{"FPT_LB": "off"})
	ctx := context.Background()
	var wg sync.WaitGroup
	for _, w := range c.Workers {
		wg.Go(func() {
			kv := worker.NewKV[float32](w)
			if err := kv.Declare(1, 4, 0); err != nil {
				t.Error(err)
				return
			}
			if err := kv.Init(ctx, []uint64{1}, make([]float32, 4), []int{4}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	w0, w1 := worker.NewKV[float32](c.Workers[0]), worker.NewKV[float32](c.Workers[1])
	vals, sum := []float32{1, 2, 3, 4}, make([]float32, 4)
	ts, err := w0.FPTPushPull([]uint64{1}, vals, sum, []int{4}, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	notified := make(chan error, 4)
	for range 2 {
		done, err := c.Workers[0].Notify(ts, func(err error) { notified <- err })
		if done || err != nil {
			t.Fatalf("Notify before the other worker pushed: %v, %v; want pending", done, err)
		}
	}
	if _, err := w1.FPTPush([]uint64{1}, vals, []int{4}, 0, nil); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-notified; err != nil {
			t.Errorf("notified with %v, want nil", err)
		}
	}
	if sum[3] != 8 {
		t.Errorf("sum %v when notified, want twice %v", sum, vals)
	}
	if done, err := c.Workers[0].Notify(ts, func(error) { t.Error("notified for a request released already") }); !done || err != nil {
		t.Errorf("Notify after the request settled: %v, %v; want done, nil", done, err)
	}
	if done, err := c.Workers[0].Notify(ts+100, nil); !done || !errors.Is(err, worker.ErrNoRequest) {
		t.Errorf("Notify of a timestamp no call returned: %v, %v; want done, ErrNoRequest", done, err)
	}
	select {
	case err := <-notified:
		t.Errorf("notified again: %v", err)
	default:
	}
	if err := c.Workers[0].Wait(ts); err != nil {
		t.Errorf("Wait after Notify: %v", err)
	}
}
