package tests

import (
	"context"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/classic"
)

var (
	// recutRe is the scheduler's line for a new layout of the classic
	// key ranges; appliedRe a server's line for applying one.
	recutRe   = regexp.MustCompile(`msg="classic key ranges re-cut" .*?layout_version=(\d+) .*`)
	appliedRe = regexp.MustCompile(`msg="classic key layout applied" .*?keys_moved_out=(\d+) .*`)
)

// classicMoveTensors is the model's tensor count: test_kv_app's classic
// keys are i·(2^64-1)/tensors, for i below it.
const classicMoveTensors = 4

// TestClassicKeysMove: classic keys stored on the servers before a server
// joins are on their new owners after it, with their values. A 2 × 2 job
// under FPT_ON_SERVER_LOSS=retry runs test_kv_app's classic Push/Pull
// rounds right after Init (--classic-first), so both servers' stores hold
// the classic keys, then trains; a third server joins in iteration joinAt,
// which re-cuts the key ranges over three (layout version 1), and the
// servers hand the keys they no longer own to their new owners. The
// classic rounds after training pull values that must be every round's
// sum, before training too: without the keys' move a pull would find a
// key never pushed on its new owner, or a value without the rounds before
// training (test_kv_app exits non-zero on either). Checked: every process
// exits 0, the workers verified every iteration and both classic phases,
// the scheduler re-cut the ranges to version 1 on the join, and the
// servers moved out exactly the keys the cut over three servers gives to
// another server.
func TestClassicKeysMove(t *testing.T) {
	// The keys whose owner changes from the cut over 2 servers to the cut
	// over 3 (the joined server appended: the others keep their index).
	wantMoved := 0
	for i := range uint64(classicMoveTensors) {
		k := i * (math.MaxUint64 / classicMoveTensors)
		if classic.ServerFor(k, 2) != classic.ServerFor(k, 3) {
			wantMoved++
		}
	}
	if wantMoved == 0 {
		t.Fatal("no classic key changes server: the test would prove nothing")
	}
	for _, lb := range []string{"off", "on"} {
		t.Run("LB "+lb, func(t *testing.T) {
			c := startClassicJob(t, 2, lb)
			joiner, err := c.Add("server")
			if err != nil {
				t.Fatal(err)
			}
			classicSurvived(t, c, "server joined")
			if moved := movedOut(t, c, "server0", "server1", joiner.Name); moved != wantMoved {
				t.Errorf("the servers logged %d classic keys moved out, want %d", moved, wantMoved)
			}
		})
	}
}

// classicRounds is how many classic rounds test_kv_app runs before and
// after training in these tests.
const classicRounds = 2

// startClassicJob starts a job of servers × 2 under
// FPT_ON_SERVER_LOSS=retry with the LB lb, whose workers run
// classicRounds classic rounds right after Init (--classic-first), so
// that every server holds classic keys, then train and run them again;
// it returns once worker 0 is in iteration joinAt. Tensors of 4 KiB to
// 2 MiB over 64 KiB partitions: the larger keys move in many KVMove
// frames. env is added to every node's.
func startClassicJob(t *testing.T, servers int, lb string, env ...string) *cluster {
	t.Helper()
	c := startCluster(t, spec{servers: servers, workers: 2,
		env: append([]string{"FPT_ON_SERVER_LOSS=retry", "FPT_LB=" + lb, "FPT_PARTITION_BYTES=65536"}, env...),
		appArgs: []string{"-iters", strconv.Itoa(failoverIters), "-compute", "20ms",
			"-tensors", strconv.Itoa(classicMoveTensors), "-min-bytes", "4096", "-max-bytes", "2097152",
			"-classic", strconv.Itoa(classicRounds), "--classic-first"}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := waitOutput(ctx, c.proc("worker0"), regexp.MustCompile(fmt.Sprintf(`iteration %d/`, joinAt))); err != nil {
		c.dump()
		t.Fatal(err)
	}
	return c
}

// classicSurvived fails the test unless every process exits 0, the
// workers verified every iteration and both classic phases, and the
// scheduler re-cut the classic key ranges once, to layout_version=1, for
// reason. It returns the scheduler's log.
func classicSurvived(t *testing.T, c *cluster, reason string) string {
	t.Helper()
	c.survived(nil)
	for _, w := range []string{"worker0", "worker1"} {
		mustContain(t, w+" stdout", c.proc(w).Stdout.String(),
			"classic Push/Pull before training over",
			"classic Push/Pull/PushPull over",
			fmt.Sprintf("and %d classic rounds", classicRounds))
	}
	log := c.proc("scheduler").Stderr.String()
	recuts := recutRe.FindAllStringSubmatch(log, -1)
	if len(recuts) != 1 || recuts[0][1] != "1" || !strings.Contains(recuts[0][0], `reason="`+reason+`"`) {
		t.Errorf("the scheduler's re-cuts of the classic key ranges: %q; want one, to layout_version=1, %q:\n%s", recuts, reason, tail(log))
	} else {
		t.Logf("scheduler: %s", recuts[0][0])
	}
	return log
}

// movedOut adds up the classic keys the servers procs logged as moved out.
func movedOut(t *testing.T, c *cluster, procs ...string) int {
	t.Helper()
	moved := 0
	for _, p := range procs {
		for _, m := range appliedRe.FindAllStringSubmatch(c.proc(p).Stderr.String(), -1) {
			n, _ := strconv.Atoi(m[1])
			moved += n
			t.Logf("%s: %s", p, m[0])
		}
	}
	return moved
}

// leftRe is the scheduler's line for a server that left in order.
var leftRe = regexp.MustCompile(`msg="server left the job in order: its classic keys are handed over" .*?node=(\S+)@`)

// TestClassicKeysMoveOffLeavingServer: a server sent SIGTERM leaves the
// running job in order and takes no classic key with it. A 3 × 2 job
// under FPT_ON_SERVER_LOSS=retry, LB off and on, runs test_kv_app's
// classic rounds right after Init (--classic-first), so every server
// holds classic keys, then trains; in iteration joinAt the process
// server1 is sent SIGTERM. The scheduler re-cuts the key ranges over the
// other two (layout version 1, "server leaving") and takes the server out
// of the LB's decisions; the server hands every key it holds to its new
// owner, waits until both workers said they send it nothing more, and
// exits 0. The classic rounds after training must pull every round's
// sum, before training too (test_kv_app exits non-zero otherwise), and
// every iteration is verified. Checked besides: every process exits 0,
// the scheduler logged the server's departure in order, and the server
// moved out exactly the keys the cut over three servers gave its rank.
func TestClassicKeysMoveOffLeavingServer(t *testing.T) {
	for _, lb := range []string{"off", "on"} {
		t.Run("LB "+lb, func(t *testing.T) { leaveInOrder(t, lb) })
	}
}

func leaveInOrder(t *testing.T, lb string) {
	c := startClassicJob(t, 3, lb)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	started, err := waitOutput(ctx, c.proc("server1"), startedRe)
	if err != nil {
		t.Fatal(err)
	}
	id := started[1] // "server<rank>(<id>)": ranks follow registration
	rank, err := strconv.Atoi(strings.TrimPrefix(id[:strings.Index(id, "(")], "server"))
	if err != nil {
		t.Fatalf("server1 started as %q: %v", id, err)
	}
	wantMoved := 0
	for i := range uint64(classicMoveTensors) {
		if classic.ServerFor(i*(math.MaxUint64/classicMoveTensors), 3) == rank {
			wantMoved++
		}
	}
	if wantMoved == 0 {
		t.Fatalf("%s holds no classic key: the test would prove nothing", id)
	}
	terminated := time.Now()
	if err := c.proc("server1").Terminate(); err != nil {
		t.Fatal(err)
	}
	log := classicSurvived(t, c, "server leaving")
	t.Logf("%s exited %v after SIGTERM", id, c.proc("server1").ExitedAt().Sub(terminated).Round(time.Millisecond))
	if m := leftRe.FindStringSubmatch(log); m == nil || m[1] != id {
		t.Errorf("the scheduler did not log %s's departure in order (%q):\n%s", id, m, tail(log))
	} else {
		t.Logf("scheduler: %s", m[0])
	}
	if moved := movedOut(t, c, "server1"); moved != wantMoved {
		t.Errorf("%s logged %d classic keys moved out, want %d (all it held)", id, moved, wantMoved)
	}
}
