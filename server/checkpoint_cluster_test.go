package server_test

import (
	"context"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/internal/memcluster"
	"github.com/fptps/fpt/kvstore"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/server"
	"github.com/fptps/fpt/worker"
)

// Sparse keys over both servers' ranges (ps-lite splits the key space
// evenly), with values of different lengths.
var (
	ckptKeys = []uint64{3, 1000, 1 << 62, 1<<63 + 7, 1<<64 - 2}
	ckptLens = []int{1, 4, 2, 8, 3}
)

const ckptServers = 2

func startCkpt(t *testing.T, dir, every string) (*memcluster.Cluster, error) {
	t.Helper()
	return startCkptEnv(ckptServers, map[string]string{"FPT_CHECKPOINT_DIR": dir, "FPT_CHECKPOINT_EVERY": every})
}

func startCkptEnv(servers int, env map[string]string) (*memcluster.Cluster, error) {
	// The context is the cluster's lifetime, not its start's.
	return memcluster.Start(context.Background(), memcluster.Options{Servers: servers, Workers: 2, Env: env})
}

// startElastic starts a job whose servers may join and leave.
func startElastic(dir, every string, servers int) (*memcluster.Cluster, error) {
	return startCkptEnv(servers, map[string]string{"FPT_CHECKPOINT_DIR": dir, "FPT_CHECKPOINT_EVERY": every, "FPT_ON_SERVER_LOSS": "retry"})
}

// pushRound has every worker push round+rank+key-dependent values into
// every key.
func pushRound(t *testing.T, c *memcluster.Cluster, round int) {
	t.Helper()
	for _, w := range c.Workers {
		vals := ckptVals(func(i, j int) float32 { return float32(round*100 + w.Rank()*10 + i + j) })
		kv := worker.NewKV[float32](w)
		ts, err := kv.Push(ckptKeys, vals, ckptLens, nil)
		if err == nil {
			err = kv.Wait(ts)
		}
		if err != nil {
			t.Fatalf("round %d: worker %d: push: %v", round, w.Rank(), err)
		}
	}
}

func ckptVals(f func(key, elem int) float32) []float32 {
	var vals []float32
	for i, n := range ckptLens {
		for j := range n {
			vals = append(vals, f(i, j))
		}
	}
	return vals
}

func pull(t *testing.T, c *memcluster.Cluster) []float32 {
	t.Helper()
	kv := worker.NewKV[float32](c.Workers[0])
	got := make([]float32, len(ckptVals(func(int, int) float32 { return 0 })))
	ts, err := kv.Pull(ckptKeys, got, ckptLens, nil)
	if err == nil {
		err = kv.Wait(ts)
	}
	if err != nil {
		t.Fatalf("pull: %v", err)
	}
	return got
}

// checkpointed reports whether the newest complete set of checkpoints
// holds exactly ckptKeys with values want.
func checkpointed(dir string, want []float32) bool {
	s, err := server.ReadCheckpoint(dir)
	if err != nil || s.Len() != len(ckptKeys) {
		return false
	}
	var all []float32
	s.Ascend(0, 0, func(_ uint64, v kvstore.Value) bool {
		for i := 0; i < len(v.Data); i += 4 {
			all = append(all, math.Float32frombits(binary.LittleEndian.Uint32(v.Data[i:])))
		}
		return true
	})
	return slices.Equal(all, want)
}

// awaitCheckpointed waits for the periodic checkpoints to hold want.
func awaitCheckpointed(t *testing.T, dir string, want []float32) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !checkpointed(dir, want); {
		if time.Now().After(deadline) {
			t.Fatal("no periodic checkpoint of the pushed values within a minute")
		}
		time.Sleep(10 * time.Millisecond) // the next tick writes them
	}
}

func TestCheckpointSurvivesRestart(t *testing.T) {
	dir := t.TempDir()

	// A job that is killed: only the periodic checkpoints save it.
	c, err := startCkpt(t, dir, "0.05")
	if err != nil {
		t.Fatal(err)
	}
	pushRound(t, c, 1)
	pushRound(t, c, 2)
	before := pull(t, c)
	awaitCheckpointed(t, dir, before)
	c.Close()

	// Restarted with the same dir, the servers answer pulls with the
	// values of before, though nothing was pushed.
	c, err = startCkpt(t, dir, "3600")
	if err != nil {
		t.Fatal(err)
	}
	if got := pull(t, c); !slices.Equal(got, before) {
		t.Fatalf("after a restart, pulled %v, want %v", got, before)
	}
	// A clean end writes the last pushes (no tick in an hour).
	pushRound(t, c, 3)
	after := pull(t, c)
	if err := c.Finish(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !checkpointed(dir, after) {
		t.Fatal("a clean end did not checkpoint the last push")
	}
	c, err = startCkpt(t, dir, "3600")
	if err != nil {
		t.Fatal(err)
	}
	if got := pull(t, c); !slices.Equal(got, after) {
		t.Fatalf("after a second restart, pulled %v, want %v", got, after)
	}
	if err := c.Finish(context.Background()); err != nil {
		t.Fatal(err)
	}
	if leftover, _ := filepath.Glob(filepath.Join(dir, "*.tmp*")); len(leftover) > 0 {
		t.Fatalf("temporary files left: %v", leftover)
	}

	// Only the last set is left; a torn file of it stops the job at
	// start, naming the file.
	files, _ := filepath.Glob(filepath.Join(dir, "*.ckpt"))
	if len(files) != ckptServers {
		t.Fatalf("checkpoint files %v, want the last set's %d", files, ckptServers)
	}
	torn := files[1]
	fi, err := os.Stat(torn)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(torn, fi.Size()-3); err != nil {
		t.Fatal(err)
	}
	c, err = startCkpt(t, dir, "3600")
	if err == nil {
		c.Close()
		t.Fatal("a cluster started on a torn checkpoint")
	}
	if !strings.Contains(err.Error(), torn) || !strings.Contains(err.Error(), "checksum") {
		t.Fatalf("error %q does not name the torn file %s and its fault", err, torn)
	}
}

// TestCheckpointAfterAJoin: a server joins a classic job, so its keys are
// cut over three servers; killed after its checkpoints caught up, the job
// restarted with two servers, then with three, pulls every value of
// before the kill. Each server takes its keys from whichever files of
// the set hold them: loading by rank, the first restart's servers would
// miss the keys the joiner held.
func TestCheckpointAfterAJoin(t *testing.T) {
	dir := t.TempDir()
	c, err := startElastic(dir, "0.05", 2)
	if err != nil {
		t.Fatal(err)
	}
	pushRound(t, c, 1)
	if _, err := c.AddServer(); err != nil {
		c.Close()
		t.Fatal(err)
	}
	for round := 2; round <= 4; round++ {
		pushRound(t, c, round)
	}
	before := pull(t, c)
	awaitCheckpointed(t, dir, before)
	// After the join, a set of three files: the two servers' first set
	// goes once it is complete (its last writer removes it).
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(5 * time.Millisecond) {
		files, _ := filepath.Glob(filepath.Join(dir, "*.ckpt"))
		if len(files) == 3 && !slices.ContainsFunc(files, func(f string) bool { return !strings.Contains(f, "-layout-1-") }) {
			break
		}
		if time.Now().After(deadline) {
			c.Close()
			t.Fatalf("checkpoint files %v, want three of layout 1", files)
		}
	}
	c.Close()

	for _, servers := range []int{2, 3} {
		if got := restartedPull(t, dir, servers); !slices.Equal(got, before) {
			t.Fatalf("restarted with %d servers, pulled %v, want %v", servers, got, before)
		}
	}
}

// restartedPull starts an elastic job of servers on dir's checkpoints,
// pulls every key and ends the job.
func restartedPull(t *testing.T, dir string, servers int) []float32 {
	t.Helper()
	c, err := startElastic(dir, "3600", servers)
	if err != nil {
		t.Fatal(err)
	}
	got := pull(t, c)
	if err := c.Finish(context.Background()); err != nil {
		t.Fatal(err)
	}
	return got
}

// TestCheckpointAfterALeave: a server of three leaves in order (as on
// SIGTERM), handing its keys to the two others; the job killed after
// their checkpoints caught up and restarted with three servers pulls
// every value of before the kill. The leaver's last file holds keys that
// moved on, and older values: only the set without it is read.
func TestCheckpointAfterALeave(t *testing.T) {
	dir := t.TempDir()
	c, err := startElastic(dir, "0.05", 3)
	if err != nil {
		t.Fatal(err)
	}
	pushRound(t, c, 1)
	leaver := node.ServerID(1)
	// Its launch may not have handed it over as serving yet.
	for deadline := time.Now().Add(time.Minute); c.Interrupt(leaver) != nil; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			c.Close()
			t.Fatalf("%s not serving within a minute", leaver)
		}
	}
	m := c.Member(node.ServerID(0))
	for deadline := time.Now().Add(time.Minute); !m.HasLeft(leaver); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			c.Close()
			t.Fatalf("%s did not leave within a minute", leaver)
		}
	}
	pushRound(t, c, 2)
	before := pull(t, c)
	awaitCheckpointed(t, dir, before)
	c.Close()
	if got := restartedPull(t, dir, 3); !slices.Equal(got, before) {
		t.Fatalf("restarted, pulled %v, want %v", got, before)
	}
}
