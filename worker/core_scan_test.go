package worker

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/lb"
)

// A push's and a result's path make no pass over every tensor, and keep
// the core's counts of pushes and sums as a recount over the tensors
// finds them.

// recountPushed is iterationsPushed by a pass over every tensor.
func recountPushed(c *core) uint64 {
	n, first := uint64(0), true
	for _, t := range c.tensors {
		if !t.once && (first || t.pushed < n) {
			n, first = t.pushed, false
		}
	}
	return n
}

// recountSums is the fewest sums in over the tensors whose sums count
// (reportSums's), by a pass over every tensor.
func recountSums(c *core) (uint64, bool) {
	n, any := uint64(0), false
	for _, t := range c.tensors {
		if !t.once && (t.pushed > 0 || t.sumsIn > 0) && (!any || t.sumsIn < n) {
			n, any = t.sumsIn, true
		}
	}
	return n, any
}

// aliasesHeldByScan is aliasesHeld by a pass over every held push.
func aliasesHeldByScan(c *core, t *tensor, iter uint64, dst []byte) bool {
	for _, hp := range c.held {
		for i, ht := range hp.ts {
			if ht == t && hp.iters[i] == iter && overlaps(hp.parts[i], dst) {
				return true
			}
		}
	}
	return false
}

// Random pushes, results, pulls, broadcasts and re-summed iterations, in
// retry mode (which counts sums): after each, the counts agree with a
// recount, and aliasesHeld with a pass over the held pushes.
func TestCoreCountsAgreeWithRecount(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for round := range 20 {
		c := startedCore(t, 0, 2, true)
		c.retryMode, c.sumsAgainOnWorkerLoss = true, true
		if _, _, err := c.follow(lb.Directive{Horizon: 1000}); err != nil {
			t.Fatal(err)
		}
		n := 1 + rng.IntN(12)
		values := make(map[uint64][]byte)
		for k := range uint64(n) {
			size := 4 * rng.IntN(9) // 0 to 32 bytes: 0 to 2 partitions
			mustDeclare(t, c, k, size)
			values[k] = make([]byte, size)
		}
		landed := make(map[uint64]uint64)
		for step := range 300 {
			k := uint64(rng.IntN(n))
			tn := c.tensors[k]
			op := rng.IntN(10)
			switch {
			case op < 4 && !tn.once:
				handOver(c, mustPush(t, c, k, values[k]))
			case op < 7 && landed[k] < tn.pushed:
				landAll(t, c, k, landed[k])
				landed[k]++
			case op < 9 && tn.pulled < landed[k]:
				dst := values[k]
				if rng.IntN(2) == 0 {
					dst = make([]byte, len(dst))
				}
				if got, want := c.aliasesHeld(tn, tn.pulled, dst), aliasesHeldByScan(c, tn, tn.pulled, dst); got != want {
					t.Fatalf("round %d step %d: aliasesHeld = %v, a pass over the held pushes says %v", round, step, got, want)
				}
				pullOne(t, c, k, dst)
			case op == 9 && rng.IntN(8) == 0:
				c.broadcastOnly([]uint64{k})
			case op == 9 && rng.IntN(2) == 0:
				c.sumAgainFrom(uint64(rng.IntN(int(c.sumsIn) + 1)))
			case op == 9:
				// Every worker has the sums here: the held pushes of
				// those iterations are released.
				if _, _, err := c.follow(lb.Directive{Horizon: 1000, Done: c.sumsIn}); err != nil {
					t.Fatal(err)
				}
			}
			for key, vs := range c.heldAt {
				for _, v := range vs {
					if !slices.Contains(c.held, v.hp) {
						t.Fatalf("round %d step %d: key %d iteration %d: a released push's values are still indexed", round, step, key.key, key.iter)
					}
				}
			}
			if got, want := c.iterationsPushed(), recountPushed(c); got != want {
				t.Fatalf("round %d step %d: iterationsPushed = %d, a recount says %d", round, step, got, want)
			}
			got, gotAny := c.sums.min()
			if want, wantAny := recountSums(c); got != want || gotAny != wantAny {
				t.Fatalf("round %d step %d: fewest sums in = %d, %v; a recount says %d, %v", round, step, got, gotAny, want, wantAny)
			}
		}
	}
}

// Iterations of many tensors, each pushed, landed and pulled on its own
// as MXNet and the simulated trainer do, visit no tensor but their own:
// the work of an iteration grows with the tensors, not with their square.
func TestCorePushPathScansNoTensor(t *testing.T) {
	for _, retry := range []bool{false, true} {
		t.Run(fmt.Sprintf("retry=%v", retry), func(t *testing.T) {
			const n = 200
			c := startedCore(t, 0, 2, true)
			c.retryMode = retry
			for k := range uint64(n) {
				mustDeclare(t, c, k, 8)
			}
			buf := make([]byte, 8)
			for iter := range uint64(4) {
				if _, _, err := c.follow(lb.Directive{Horizon: iter, Done: iter}); err != nil {
					t.Fatal(err)
				}
				before := c.scanned
				for k := range uint64(n) {
					handOver(c, mustPush(t, c, k, buf))
					c.iterationsPushed() // as the shell does after each push
					landAll(t, c, k, iter)
					pullOne(t, c, k, buf)
				}
				if got := c.scanned - before; got != 0 {
					t.Fatalf("iteration %d of %d tensors visited %d tensors in passes over all of them", iter, n, got)
				}
				if got := c.iterationsPushed(); got != iter+1 {
					t.Fatalf("iterationsPushed = %d after iteration %d", got, iter)
				}
			}
		})
	}
}

// Checking a call's keys visits each key once, however many the call
// names (an FPTPull of every tensor names them all), and still refuses a
// key named twice, in this call or not in an earlier one.
func TestSplitVisitsEachKeyOnce(t *testing.T) {
	for _, n := range []int{1, 10, 1000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			c := startedCore(t, 0, 2, false)
			keys, lens := make([]uint64, n), make([]int, n)
			for i := range keys {
				keys[i], lens[i] = uint64(i), 4
				mustDeclare(t, c, keys[i], 4)
			}
			data := make([]byte, 4*n)
			for range 2 { // the same keys again: not a duplicate
				before := c.compared
				if _, _, err := c.split(keys, data, lens, frame.Float32); err != nil {
					t.Fatal(err)
				}
				if got := c.compared - before; got != uint64(n) {
					t.Fatalf("a call of %d keys visited %d keys", n, got)
				}
			}
			dup := append(slices.Clone(keys), keys[n/2])
			if _, _, err := c.split(dup, make([]byte, 4*(n+1)), append(slices.Clone(lens), 4), frame.Float32); err == nil || !strings.Contains(err.Error(), "twice") {
				t.Fatalf("key %d twice in a call of %d: %v, want an error", keys[n/2], n+1, err)
			}
		})
	}
}
