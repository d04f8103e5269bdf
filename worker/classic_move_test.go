package worker_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fptps/fpt/internal/memcluster"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/worker"
)

// classicKeys are keys spread over the whole key space, so that every
// server of any layout owns some, of 1 to 7 elements, and a few of
// several partitions of memPartitionBytes.
func classicKeys(n int) (keys []uint64, lens []int, total int) {
	keys, lens = make([]uint64, n), make([]int, n)
	for i := range keys {
		keys[i] = uint64(i)*(math.MaxUint64/uint64(n)) + uint64(i)
		lens[i] = 1 + i%7
		if i%17 == 0 {
			lens[i] = 700
		}
		total += lens[i]
	}
	return keys, lens, total
}

// classicPushes has every worker push rounds classic rounds of keys, each
// adding its rank+1 to every element and waiting for the push; before
// round r, each worker runs at(w, r).
func classicPushes(t *testing.T, c *memcluster.Cluster, keys []uint64, lens []int, total, rounds int, at func(w *worker.Worker, r int) error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, len(c.Workers))
	for _, w := range c.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			kv := worker.NewKV[float32](w)
			vals := make([]float32, total)
			for i := range vals {
				vals[i] = float32(w.Rank() + 1)
			}
			for r := range rounds {
				if err := at(w, r); err != nil {
					errs <- fmt.Errorf("worker %d, before round %d: %w", w.Rank(), r, err)
					return
				}
				ts, err := kv.Push(keys, vals, lens, nil)
				if err == nil {
					err = kv.Wait(ts)
				}
				if err != nil {
					errs <- fmt.Errorf("worker %d, round %d: %w", w.Rank(), r, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// awaitLayout waits until every worker sends classic requests by a
// layout over servers.
func awaitLayout(t *testing.T, c *memcluster.Cluster, servers []node.ID) {
	t.Helper()
	for _, w := range c.Workers {
		deadline := time.Now().Add(10 * time.Second)
		for !slices.Equal(w.ClassicLayout().Servers, servers) && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if l := w.ClassicLayout(); !slices.Equal(l.Servers, servers) {
			t.Fatalf("worker %d sends classic requests by layout %v, want one over %v", w.Rank(), l, servers)
		}
	}
}

// awaitServerRanks waits until each server's dense rank is want's.
func awaitServerRanks(t *testing.T, c *memcluster.Cluster, want map[node.ID]int) {
	t.Helper()
	for id, rank := range want {
		m := c.Member(id)
		deadline := time.Now().Add(10 * time.Second)
		for m.ServerRank() != rank && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if got := m.ServerRank(); got != rank {
			t.Fatalf("server %s has rank %d, want %d", id, got, rank)
		}
	}
}

// rangeHasKeys pulls [keys[lo], keys[hi]) (hi == len(keys): the rest of
// the key space) and checks that it finds exactly keys[lo:hi], at their
// lengths, whatever their values.
func rangeHasKeys(kv *worker.KV[float32], keys []uint64, lens []int, lo, hi int) ([]float32, error) {
	to := uint64(0)
	if hi < len(keys) {
		to = keys[hi]
	}
	got, vals, glens, err := kv.PullRange(keys[lo], to)
	if err != nil {
		return nil, fmt.Errorf("range pull: %w", err)
	}
	if !slices.Equal(got, keys[lo:hi]) || !slices.Equal(glens, lens[lo:hi]) {
		return nil, fmt.Errorf("range pull of keys %d..%d found %d keys %v (lengths %v)", lo, hi, len(got), got, glens)
	}
	return vals, nil
}

// pullExact has every worker pull keys, one by one and by range, and
// checks every element is want.
func pullExact(t *testing.T, c *memcluster.Cluster, keys []uint64, lens []int, total int, want float32) {
	t.Helper()
	for _, w := range c.Workers {
		vals, err := rangeHasKeys(worker.NewKV[float32](w), keys, lens, 0, len(keys))
		if err != nil {
			t.Fatalf("worker %d: %v", w.Rank(), err)
		}
		if i := slices.IndexFunc(vals, func(v float32) bool { return v != want }); i >= 0 {
			t.Fatalf("worker %d: range pull: element %d is %v, want %v", w.Rank(), i, vals[i], want)
		}
		if _, err := rangeHasKeys(worker.NewKV[float32](w), keys, lens, 10, len(keys)/2); err != nil {
			t.Fatalf("worker %d: %v", w.Rank(), err)
		}
		kv := worker.NewKV[float32](w)
		got := make([]float32, total)
		ts, err := kv.Pull(keys, got, lens, nil)
		if err == nil {
			err = kv.Wait(ts)
		}
		if err != nil {
			t.Fatalf("worker %d: pull: %v", w.Rank(), err)
		}
		for i, v := range got {
			if v != want {
				t.Fatalf("worker %d: element %d is %v, want %v", w.Rank(), i, v, want)
			}
		}
	}
}

// TestClassicKeysMoveToJoiningServer runs classic pushes on a 2×2 job
// while servers join: at each join the key ranges are cut over one more
// server, the keys each joiner now owns move to it with their values,
// requests sent under an older layout are answered by the new owners, and
// every value pulled at the end is exact. Without the move a joiner would
// answer "never pushed", or a part of the sum. Meanwhile worker 1 pulls
// the whole key range before every round: a range pull that meets a
// layout change asks again under the new one, and finds every key once.
func TestClassicKeysMoveToJoiningServer(t *testing.T) {
	for _, tt := range []struct {
		name   string
		rounds int
		joins  []int // the rounds before which a server is started
	}{
		{"one join", 40, []int{10}},
		{"three joins, one right after another", 60, []int{10, 11, 30}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := startMem(t, 2, 2, map[string]string{"FPT_PARTITION_BYTES": memPartitionBytes, "FPT_ON_SERVER_LOSS": "retry"})
			keys, lens, total := classicKeys(96)
			servers := []node.ID{node.ServerID(0), node.ServerID(1)}
			classicPushes(t, c, keys, lens, total, tt.rounds, func(w *worker.Worker, r int) error {
				if w.Rank() == 1 && r > 0 {
					_, err := rangeHasKeys(worker.NewKV[float32](w), keys, lens, 0, len(keys))
					return err
				}
				if w.Rank() != 0 || !slices.Contains(tt.joins, r) {
					return nil
				}
				id, err := c.AddServer()
				servers = append(servers, id)
				return err
			})
			awaitLayout(t, c, servers)
			ranks := make(map[node.ID]int)
			for i, id := range servers {
				ranks[id] = i // a joiner's is the next one
			}
			awaitServerRanks(t, c, ranks)
			pullExact(t, c, keys, lens, total, float32(tt.rounds*(1+2)))
			for _, id := range servers[2:] {
				var sent uint64
				for _, p := range c.Member(id).Van().Stats() {
					sent += p.SentBytes
				}
				if sent < 1<<10 {
					t.Errorf("joined server %s sent %d bytes: it answered no pull, so it owns no keys", id, sent)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := c.Finish(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestClassicKeysMoveAwayFromLeavingServer: a server interrupted (as by
// SIGTERM) under FPT_ON_SERVER_LOSS=retry leaves the job in order while
// two workers push classic keys and worker 1 range-pulls the whole key
// space before every round: it hands every key over, answers the
// requests still addressed to it by redirecting them, and goes once each
// worker said it sends it nothing more. Every value pulled at the end is
// exact, none lost and none counted twice, the servers left have dense
// ranks, and the leaver ends without error.
func TestClassicKeysMoveAwayFromLeavingServer(t *testing.T) {
	c := startMem(t, 3, 2, map[string]string{"FPT_PARTITION_BYTES": memPartitionBytes, "FPT_ON_SERVER_LOSS": "retry"})
	fptRounds(t, c.Workers, 1, hooks{}) // a server may leave once the job runs
	leaver := node.ServerID(1)
	keys, lens, total := classicKeys(96)
	const rounds = 40
	classicPushes(t, c, keys, lens, total, rounds, func(w *worker.Worker, r int) error {
		if w.Rank() == 1 && r > 0 {
			_, err := rangeHasKeys(worker.NewKV[float32](w), keys, lens, 0, len(keys))
			return err
		}
		if w.Rank() == 0 && r == 10 {
			return c.Interrupt(leaver)
		}
		return nil
	})
	awaitLayout(t, c, []node.ID{node.ServerID(0), node.ServerID(2)})
	awaitServerRanks(t, c, map[node.ID]int{node.ServerID(0): 0, node.ServerID(2): 1})
	// It left while the job runs: not only once the job ended.
	for _, w := range c.Workers {
		m := c.Member(node.WorkerID(w.Rank()))
		deadline := time.Now().Add(30 * time.Second)
		for !m.HasLeft(leaver) && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if !m.HasLeft(leaver) {
			t.Fatalf("worker %d: %s did not leave within 30 s", w.Rank(), leaver)
		}
	}
	pullExact(t, c, keys, lens, total, float32(rounds*(1+2)))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	if m := c.Member(leaver); m.Err() != nil {
		t.Fatalf("the server that left failed: %v", m.Err())
	}
}

// TestClassicAfterServerLoss: a server lost before any classic request
// takes its range out of the layout, so classic calls made afterwards go
// to the servers left and every value is exact (they used to go to the
// lost server and fail).
func TestClassicAfterServerLoss(t *testing.T) {
	c := startMem(t, 3, 2, map[string]string{"FPT_PARTITION_BYTES": memPartitionBytes, "FPT_ON_SERVER_LOSS": "retry"})
	// The loss is handled once every worker has started: one FPT
	// iteration makes sure of it.
	fptRounds(t, c.Workers, 1, hooks{})
	if err := c.Kill(node.ServerID(1)); err != nil {
		t.Fatal(err)
	}
	awaitLayout(t, c, []node.ID{node.ServerID(0), node.ServerID(2)})
	// The ranks of the servers left close up.
	awaitServerRanks(t, c, map[node.ID]int{node.ServerID(0): 0, node.ServerID(2): 1})
	keys, lens, total := classicKeys(48)
	const rounds = 5
	classicPushes(t, c, keys, lens, total, rounds, func(*worker.Worker, int) error { return nil })
	pullExact(t, c, keys, lens, total, float32(rounds*(1+2)))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Finish(ctx); err != nil {
		t.Fatal(err)
	}
}
