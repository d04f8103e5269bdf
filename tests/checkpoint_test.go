package tests

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/server"
)

// A real job with FPT_CHECKPOINT_DIR leaves a complete set of checkpoints,
// a file per server, at its clean end; the values themselves surviving a
// restart, and a membership change, are server's TestCheckpoint* tests. Here, with real
// processes: a server restarted on a torn file exits 1 naming it, and the
// job stops rather than training on from zeros.
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
	c = startCluster(t, spec{servers: 2, workers: 2, env: env, appArgs: args})
	if err := c.Wait(2 * time.Minute); err == nil {
		t.Fatal("a job restarted on a torn checkpoint ran to its end")
	}
	named := map[string]bool{}
	for _, p := range c.Procs {
		if !p.Wait(time.Minute) || p.ExitCode() == 0 {
			c.dump()
			t.Fatalf("%s exited %d on a torn checkpoint, want a failure", p.Name, p.ExitCode())
		}
		stderr := strings.TrimSpace(p.Stderr.String())
		t.Logf("%s exited %d: %s", p.Name, p.ExitCode(), stderr[strings.LastIndex(stderr, "\n")+1:])
		named[strings.TrimRight(p.Name, "0123456789")] = named[strings.TrimRight(p.Name, "0123456789")] || strings.Contains(stderr, torn)
	}
	// The server that read it (the one that wrote it) names the
	// file, and so does the scheduler, which relays it to every node.
	if !named["server"] || !named["scheduler"] {
		c.dump()
		t.Fatalf("the torn file %s named by: %v", torn, named)
	}
}
