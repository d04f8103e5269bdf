package worker_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/fptps/fpt/worker"
)

// MXNet's Gluon broadcasts parameters one key at a time: declare and init
// a key, pull it at once, then the next key. A pull with no push
// outstanding returns the values Init left (worker 0's) on every worker;
// after the key's next push, pulls are the sums again, and a pull of a key
// that was never initialised is still the caller's error.
func TestInitThenPullPerKey(t *testing.T) {
	c := startMem(t, 2, 3, map[string]string{"FPT_PARTITION_BYTES": memPartitionBytes})
	keys := []struct {
		key   uint64
		elems int
	}{{3, 1}, {5, 700}, {8, 3000}}
	initial := func(rank int, key uint64, j int) float32 { return float32(rank*1000 + int(key)*10 + j%97) }
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, len(c.Workers))
	for i, w := range c.Workers {
		wg.Go(func() { errs[i] = initPullWorker(ctx, w, keys, initial) })
	}
	wg.Wait()
	for rank, err := range errs {
		if err != nil {
			t.Errorf("worker %d: %v", rank, err)
		}
	}
}

func initPullWorker(ctx context.Context, w *worker.Worker, keys []struct {
	key   uint64
	elems int
}, initial func(rank int, key uint64, j int) float32) error {
	kv := worker.NewKV[float32](w)
	rank := w.Rank()
	// A key never initialised: its pull is refused.
	if err := kv.Declare(99, 4, 0); err != nil {
		return err
	}
	if _, err := kv.FPTPull([]uint64{99}, make([]float32, 4), nil, nil); !errors.Is(err, worker.ErrPullBeforePush) {
		return fmt.Errorf("pull of an uninitialised key: %v, want ErrPullBeforePush", err)
	}
	for _, k := range keys {
		if err := kv.Declare(k.key, k.elems, 0); err != nil {
			return err
		}
		vals := make([]float32, k.elems)
		for j := range vals {
			vals[j] = initial(rank, k.key, j)
		}
		if err := kv.Init(ctx, []uint64{k.key}, vals, nil); err != nil {
			return err
		}
		for range 2 { // every pull before the next push gives the same values
			got := make([]float32, k.elems)
			ts, err := kv.FPTPull([]uint64{k.key}, got, nil, nil)
			if err != nil {
				return fmt.Errorf("pull of key %d after its init: %v", k.key, err)
			}
			if err := kv.Wait(ts); err != nil {
				return err
			}
			for j, v := range got {
				if want := initial(0, k.key, j); v != want {
					return fmt.Errorf("key %d element %d after init: %v, want worker 0's %v", k.key, j, v, want)
				}
			}
		}
	}
	// One training iteration over all keys: the pull is the sum again.
	workers := w.NumWorkers()
	for _, k := range keys {
		vals := make([]float32, k.elems)
		for j := range vals {
			vals[j] = float32(rank + j%5)
		}
		if _, err := kv.FPTPush([]uint64{k.key}, vals, nil, 0, nil); err != nil {
			return err
		}
		got := make([]float32, k.elems)
		ts, err := kv.FPTPull([]uint64{k.key}, got, nil, nil)
		if err != nil {
			return err
		}
		if err := kv.Wait(ts); err != nil {
			return err
		}
		for j, v := range got {
			want := float32(workers*(workers-1)/2 + workers*(j%5))
			if v != want {
				return fmt.Errorf("key %d element %d after a push: %v, want the sum %v", k.key, j, v, want)
			}
		}
	}
	return nil
}
