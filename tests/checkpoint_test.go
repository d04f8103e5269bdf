package tests

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/kvstore"
	"github.com/fptps/fpt/server"
)

// A real job with FPT_CHECKPOINT_DIR leaves a complete set of checkpoints,
// a file per server, at its clean end; the values themselves surviving a
// restart, and a membership change, are server's TestCheckpoint* tests. Here, with real
// processes: a server restarted on a torn file exits 1 naming it, and the
// job stops rather than training on from zeros, whatever
// FPT_ON_SERVER_LOSS says; the set is left as it was.
func TestCheckpointRealProcesses(t *testing.T) {
	dir := t.TempDir()
	env := []string{"FPT_CHECKPOINT_DIR=" + dir}
	args := []string{"-iters", "2", "-classic", "2", "-max-bytes", "65536", "-quiet"}
	c := startCluster(t, spec{servers: 2, workers: 2, env: env, appArgs: args})
	c.waitAll(2 * time.Minute)
	files, _ := filepath.Glob(filepath.Join(dir, "*.ckpt"))
	if len(files) != 2 {
		t.Fatalf("checkpoint files after a clean end: %v, want one per server", files)
	}
	if s, err := server.ReadCheckpoint(dir); err != nil || s.Len() == 0 {
		t.Fatalf("the checkpoint holds no keys: %v", err)
	}

	torn := files[1]
	fi, err := os.Stat(torn)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(torn, fi.Size()/2); err != nil {
		t.Fatal(err)
	}
	// Under either policy for a lost server: with retry, a server that
	// failed after the start would be a loss the job survives, and the
	// others' checkpoints would replace the set it did not load.
	for _, policy := range []string{"fail", "retry"} {
		restartOnTorn(t, append(env, "FPT_ON_SERVER_LOSS="+policy), args, torn)
	}
	if after, _ := filepath.Glob(filepath.Join(dir, "*")); !slices.Equal(after, files) {
		t.Fatalf("files after the failed restarts: %v, want the set's %v, untouched", after, files)
	}
}

// restartOnTorn starts a 2 × 2 job on a checkpoint set whose file torn is
// torn: every process must exit non-zero, the server that reads it and
// the scheduler naming it.
func restartOnTorn(t *testing.T, env, args []string, torn string) {
	t.Helper()
	c := startCluster(t, spec{servers: 2, workers: 2, env: env, appArgs: args})
	if err := c.Wait(2 * time.Minute); err == nil {
		t.Fatalf("a job restarted on a torn checkpoint ran to its end (%v)", env)
	}
	named := map[string]bool{}
	for _, p := range c.Procs {
		if !p.Wait(time.Minute) || p.ExitCode() == 0 {
			c.dump()
			t.Fatalf("%s exited %d on a torn checkpoint, want a failure (%v)", p.Name, p.ExitCode(), env)
		}
		stderr := strings.TrimSpace(p.Stderr.String())
		t.Logf("%s exited %d: %s", p.Name, p.ExitCode(), stderr[strings.LastIndex(stderr, "\n")+1:])
		named[strings.TrimRight(p.Name, "0123456789")] = named[strings.TrimRight(p.Name, "0123456789")] || strings.Contains(stderr, torn)
	}
	// The server that read it (the one that wrote it) names the
	// file, and so does the scheduler, which relays it to every node.
	if !named["server"] || !named["scheduler"] {
		c.dump()
		t.Fatalf("the torn file %s named by: %v (%v)", torn, named, env)
	}
}

// TestCheckpointAfterJoinRealProcesses: a classic job's checkpoints
// follow a server's join, and a later run with fewer servers takes every
// key back. Run 1 is TestClassicKeysMove's job (2 servers, a third joins,
// every classic value verified by test_kv_app) with FPT_CHECKPOINT_DIR;
// its clean end leaves the set of the layout with three servers. Run 2,
// of two servers and no classic rounds, loads it: each server keeps the
// keys of its half, from whichever of the three files hold them, and its
// own first checkpoint (run 2's set, written at once) holds exactly the
// keys and values of run 1's, byte for byte; run 1's set is then removed.
// Serving the loaded values is server's TestCheckpointAfterAJoin.
func TestCheckpointAfterJoinRealProcesses(t *testing.T) {
	dir := t.TempDir()
	env := "FPT_CHECKPOINT_DIR=" + dir
	c := startClassicJob(t, 2, "off", env)
	if _, err := c.Add("server"); err != nil {
		t.Fatal(err)
	}
	classicSurvived(t, c, "server joined")
	files, _ := filepath.Glob(filepath.Join(dir, "*.ckpt"))
	if len(files) != 3 || !strings.Contains(files[0], "-layout-1-") {
		t.Fatalf("checkpoint files after run 1: %v, want three of layout 1", files)
	}
	want, err := server.ReadCheckpoint(dir)
	if err != nil || want.Len() != classicMoveTensors {
		t.Fatalf("run 1's checkpoint: %v (%d keys, want %d)", err, want.Len(), classicMoveTensors)
	}

	c = startCluster(t, spec{servers: 2, workers: 2, env: []string{env},
		appArgs: []string{"-iters", "1", "-classic", "0", "-max-bytes", "65536", "-quiet"}})
	c.waitAll(2 * time.Minute)
	loaded := 0
	for _, name := range []string{"server0", "server1"} {
		for _, m := range loadedRe.FindAllStringSubmatch(c.proc(name).Stderr.String(), -1) {
			n, _ := strconv.Atoi(m[1])
			loaded += n
			t.Logf("%s: %s", name, m[0])
		}
	}
	if loaded != classicMoveTensors {
		t.Errorf("the servers of run 2 logged %d keys loaded, want %d", loaded, classicMoveTensors)
	}
	files, _ = filepath.Glob(filepath.Join(dir, "*.ckpt"))
	if len(files) != 2 || !strings.Contains(files[0], "-layout-0-") {
		t.Fatalf("checkpoint files after run 2: %v, want two of layout 0", files)
	}
	got, err := server.ReadCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	var gotKeys, wantKeys []uint64
	got.Ascend(0, 0, func(k uint64, v kvstore.Value) bool {
		gotKeys = append(gotKeys, k)
		if w, ok := want.Get(k); !ok || w.DType != v.DType || !bytes.Equal(w.Data, v.Data) {
			t.Errorf("key %d: %d bytes of %s after run 2, not run 1's value", k, len(v.Data), v.DType)
		}
		return true
	})
	want.Ascend(0, 0, func(k uint64, _ kvstore.Value) bool { wantKeys = append(wantKeys, k); return true })
	if !slices.Equal(gotKeys, wantKeys) {
		t.Fatalf("keys after run 2 %v, run 1's %v", gotKeys, wantKeys)
	}
}

// loadedRe is a server's line for the checkpoint it loaded.
var loadedRe = regexp.MustCompile(`msg="checkpoint loaded" .*?keys=(\d+)`)
