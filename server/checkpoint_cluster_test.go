package server_test

import (
	"context"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/internal/memcluster"
	"github.com/fptps/fpt/kvstore"
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
	// The context is the cluster's lifetime, not its start's.
	return memcluster.Start(context.Background(), memcluster.Options{Servers: ckptServers, Workers: 2,
		Env: map[string]string{"FPT_CHECKPOINT_DIR": dir, "FPT_CHECKPOINT_EVERY": every}})
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

// checkpointed reports whether every server's file holds all of its keys'
// current values (together: ckptKeys' values want).
func checkpointed(dir string, want []float32) bool {
	var all []float32
	keys := 0
	for rank := range ckptServers {
		b, err := os.ReadFile(filepath.Join(dir, "server-"+strconv.Itoa(rank)+".ckpt"))
		if err != nil {
			return false
		}
		s, err := kvstore.Load(b)
		if err != nil {
			return false
		}
		keys += s.Len()
		s.Ascend(0, 0, func(_ uint64, v kvstore.Value) bool {
			for i := 0; i < len(v.Data); i += 4 {
				all = append(all, math.Float32frombits(binary.LittleEndian.Uint32(v.Data[i:])))
			}
			return true
		})
	}
	return keys == len(ckptKeys) && slices.Equal(all, want)
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
	for deadline := time.Now().Add(time.Minute); !checkpointed(dir, before); {
		if time.Now().After(deadline) {
			t.Fatal("no periodic checkpoint of the pushed values within a minute")
		}
		time.Sleep(10 * time.Millisecond) // the next tick writes them
	}
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

	// A torn checkpoint stops the job at start, naming the file.
	torn := filepath.Join(dir, "server-1.ckpt")
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
