package tests

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/launch"
)

// helpOf runs a command's help and returns its output (stdout and stderr)
// and exit status.
func helpOf(t *testing.T, argv ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		if _, ok := err.(*exec.ExitError); !ok {
			t.Fatalf("%v: %v", argv, err)
		}
	}
	return string(out), cmd.ProcessState.ExitCode()
}

// Every binary's -h exits 0 and names every variable a node reads, those
// fpt's tools set and those it accepts from launchers: the config
// package's own list, so help cannot fall behind it.
func TestBinaryHelp(t *testing.T) {
	names := config.Names(config.NodeVar, config.ToolVar, config.LauncherVar)
	if len(names) < 20 {
		t.Fatalf("config knows %d variables: %v", len(names), names)
	}
	for _, argv := range [][]string{
		{bin.fpt, "-h"}, {bin.fpt, "--help"}, {bin.fpt, "help"}, {bin.fpt, "run", "-h"},
		{bin.fpt, "bench", "-h"}, {bin.fpt, "netem", "-h"}, {bin.app, "-h"}, {bin.app, "--help"},
	} {
		name := filepath.Base(argv[0]) + " " + strings.Join(argv[1:], " ")
		t.Run(name, func(t *testing.T) {
			out, code := helpOf(t, argv...)
			if code != 0 {
				t.Errorf("exit %d, want 0:\n%s", code, out)
			}
			for _, n := range names {
				if !strings.Contains(out, n) {
					t.Errorf("help does not name %s", n)
				}
			}
			if !strings.Contains(out, "usage") {
				t.Errorf("no usage line:\n%s", out)
			}
		})
	}
}

var (
	// shellVarRe finds a variable a script expands: $NAME or ${NAME...}.
	shellVarRe = regexp.MustCompile(`\$\{?([A-Z][A-Z0-9_]*)`)
	// familyRe finds the names of fpt's and ps-lite's variables in text.
	familyRe = regexp.MustCompile(`\b(?:FPT|PS|DMLC)_[A-Z0-9_]*[A-Z0-9]\b`)
)

// shellOwn are variables the shell sets or every user has, which a
// script's -h need not name.
var shellOwn = []string{"PATH", "HOME", "EPOCHREALTIME", "EPOCHSECONDS", "BASHPID", "RANDOM", "SECONDS"}

// scriptVars are the upper-case variables a script expands outside its
// comments, less the shell's own.
func scriptVars(t *testing.T, path string) []string {
	t.Helper()
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var vars []string
	for line := range strings.SplitSeq(string(src), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		for _, m := range shellVarRe.FindAllStringSubmatch(line, -1) {
			if !slices.Contains(shellOwn, m[1]) && !slices.Contains(vars, m[1]) {
				vars = append(vars, m[1])
			}
		}
	}
	return vars
}

// Every script's -h exits 0, shows none of the script's own code, names
// every variable the script reads, and names no FPT_, PS_ or DMLC_
// variable that config does not know (a stale or misspelled one).
func TestScriptHelp(t *testing.T) {
	scripts, err := filepath.Glob("../scripts/*.sh")
	if err != nil || len(scripts) < 5 {
		t.Fatalf("scripts: %v, %v", scripts, err)
	}
	known := config.Names(config.NodeVar, config.ToolVar, config.LauncherVar, config.TestVar)
	for _, script := range scripts {
		t.Run(filepath.Base(script), func(t *testing.T) {
			vars := scriptVars(t, script)
			for _, flag := range []string{"-h", "--help"} {
				out, code := helpOf(t, script, flag)
				if code != 0 {
					t.Errorf("%s: exit %d, want 0:\n%s", flag, code, out)
				}
				for _, code := range []string{"#!/", "set -euo", `cd "$(dirname`, "usage()"} {
					if strings.Contains(out, code) {
						t.Errorf("%s prints the script's code (%q):\n%s", flag, code, out)
					}
				}
				if !strings.HasPrefix(out, "usage: ") {
					t.Errorf("%s: want a usage line first:\n%s", flag, out)
				}
				for _, v := range vars {
					if !strings.Contains(out, v) {
						t.Errorf("%s does not name %s, which the script reads", flag, v)
					}
				}
				for _, v := range familyRe.FindAllString(out, -1) {
					if !slices.Contains(known, v) && !strings.HasSuffix(v, "_") {
						t.Errorf("%s names %s, which config does not know", flag, v)
					}
				}
			}
		})
	}
}

// A misspelled variable is named, with the name meant, in a warning from
// the real process as it starts; and a rank out of range is a
// configuration error naming its variable.
func TestUnknownVariableWarning(t *testing.T) {
	run := func(env ...string) (string, int) {
		cmd := exec.Command(bin.app, "-iters", "1")
		cmd.Env = append(environWithout("FPT_", "PS_", "DMLC_"), env...)
		out, _ := cmd.CombinedOutput()
		return string(out), cmd.ProcessState.ExitCode()
	}
	// DMLC_NUM_WROKER in place of DMLC_NUM_WORKER: the warning says why the
	// required variable is missing.
	out, code := run("DMLC_ROLE=worker", "DMLC_PS_ROOT_URI=127.0.0.1", "DMLC_PS_ROOT_PORT=1",
		"DMLC_NUM_SERVER=1", "DMLC_NUM_WROKER=1", "FPT_PARTITON_BYTES=65536", "DMLC_TASK_ID=0", "DMLC_JOB_CLUSTER=local")
	if code != launch.ExitUsage {
		t.Errorf("exit %d, want %d:\n%s", code, launch.ExitUsage, out)
	}
	mustContain(t, "stderr", out,
		"test_kv_app: warning: unknown variable DMLC_NUM_WROKER; did you mean DMLC_NUM_WORKER?",
		"test_kv_app: warning: unknown variable FPT_PARTITON_BYTES; did you mean FPT_PARTITION_BYTES?",
		"DMLC_NUM_WORKER: required but not set")
	if strings.Contains(out, "DMLC_TASK_ID;") || strings.Contains(out, "DMLC_JOB_CLUSTER") {
		t.Errorf("a warning about a variable dmlc-tracker sets:\n%s", out)
	}
	out, code = run("DMLC_ROLE=worker", "DMLC_PS_ROOT_URI=127.0.0.1", "DMLC_PS_ROOT_PORT=1",
		"DMLC_NUM_SERVER=1", "DMLC_NUM_WORKER=2", "DMLC_WORKER_ID=2")
	if code != launch.ExitUsage {
		t.Errorf("rank out of range: exit %d, want %d:\n%s", code, launch.ExitUsage, out)
	}
	mustContain(t, "stderr", out, `DMLC_WORKER_ID="2": worker rank 2 is out of range: DMLC_NUM_WORKER=2 gives ranks 0 to 1`)
	if strings.Contains(out, "warning") {
		t.Errorf("a warning with only known variables:\n%s", out)
	}
}

// environWithout is this process's environment less the variables whose
// names have one of the prefixes.
func environWithout(prefixes ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(kv, p) }) {
			env = append(env, kv)
		}
	}
	return env
}

// The C++ client explains itself too: its flags, and where the node's
// variables are listed; and the C library warns about a misspelled
// variable at fpt_start, from the C environment, as the binaries do.
func TestKVStoreClientCLI(t *testing.T) {
	client := filepath.Join(libPrograms(t, "default"), "kvstore_client")
	out, code := helpOf(t, client, "-h")
	if code != 0 {
		t.Errorf("exit %d, want 0:\n%s", code, out)
	}
	mustContain(t, "kvstore_client -h", out, "usage: kvstore_client", "-iters N", "-max-bytes B", "DMLC_ROLE", "bin/fpt -h")

	// No scheduler: the start fails after FPT_START_TIMEOUT, warning first.
	cmd := exec.Command(client, "-iters", "1")
	cmd.Env = append(environWithout("FPT_", "PS_", "DMLC_"), "DMLC_ROLE=worker", "DMLC_PS_ROOT_URI=127.0.0.1",
		"DMLC_PS_ROOT_PORT=1", "DMLC_NUM_SERVER=1", "DMLC_NUM_WORKER=1", "FPT_START_TIMEOUT=0.5", "FPT_VANN=epoll")
	b, _ := cmd.CombinedOutput()
	mustContain(t, "kvstore_client's output", string(b), "fpt_start: warning: unknown variable FPT_VANN; did you mean FPT_VAN?")
}

// fpt run PROG: a worker becomes PROG (its status and environment are
// PROG's), any other role runs its node without running PROG.
func TestFptRun(t *testing.T) {
	tests := []struct {
		name   string
		env    []string
		args   []string
		code   int
		expect string
	}{
		{"no program", []string{"DMLC_ROLE=worker"}, nil, launch.ExitUsage, "fpt run: no program"},
		{"no such program", []string{"DMLC_ROLE=worker"}, []string{"--", "/no/such/prog"}, launch.ExitUsage, "/no/such/prog"},
		{"worker execs", []string{"DMLC_ROLE=worker", "DMLC_TASK_ID=3"}, []string{"sh", "-c", `echo "ran as $DMLC_ROLE $DMLC_TASK_ID"; exit 7`}, 7, "ran as worker 3"},
		{"server runs its node", []string{"DMLC_ROLE=server"}, []string{"sh", "-c", "echo prog ran; exit 7"}, launch.ExitUsage, "DMLC_PS_ROOT_URI: required but not set"},
		{"no role", nil, []string{"sh", "-c", "echo prog ran; exit 7"}, launch.ExitUsage, "DMLC_ROLE: required but not set"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(bin.fpt, append([]string{"run"}, tt.args...)...)
			cmd.Env = append(environWithout("FPT_", "PS_", "DMLC_"), tt.env...)
			b, _ := cmd.CombinedOutput()
			out := string(b)
			if code := cmd.ProcessState.ExitCode(); code != tt.code {
				t.Errorf("exit %d, want %d:\n%s", code, tt.code, out)
			}
			mustContain(t, "output", out, tt.expect)
			if tt.code != 7 && strings.Contains(out, "prog ran") {
				t.Errorf("PROG ran:\n%s", out)
			}
		})
	}
}
