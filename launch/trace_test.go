package launch_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/launch"
)

// A trace file in a directory that does not exist is a configuration
// error found before the node joins (exit 2, naming FPT_TRACE_FILE), not a
// failure once the whole cluster has started.
func TestTraceDirMissing(t *testing.T) {
	env := map[string]string{"DMLC_ROLE": "server", "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": strconv.Itoa(freePort(t)),
		"DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "1", "FPT_START_TIMEOUT": "30",
		"FPT_TRACE_FILE": t.TempDir() + "/no/such/dir/{role}{rank}.json"}
	began := time.Now()
	code, stderr := mainInChild(t, env)
	if code != launch.ExitUsage || !strings.Contains(stderr, "FPT_TRACE_FILE") || !strings.Contains(stderr, "does not exist") {
		t.Errorf("exit %d, stderr %q; want %d naming FPT_TRACE_FILE", code, stderr, launch.ExitUsage)
	}
	if d := time.Since(began); d > 20*time.Second {
		t.Errorf("took %s: the node waited for the cluster before refusing", d)
	}
}
