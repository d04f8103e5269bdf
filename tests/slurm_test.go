package tests

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fptps/fpt/internal/localcluster"
)

// slurmCluster is a one-node Slurm cluster of the test's own: its own
// configuration, state and spool directories, munge key and socket, and
// ports, so that it touches no Slurm the machine may run.
type slurmCluster struct {
	dir  string
	conf string
	env  []string // what its clients (srun, sbatch, sinfo) run with
}

// startSlurm starts munged, slurmctld and slurmd, and waits until the node
// is idle. It skips the test where Slurm or munge is not installed, or
// where the test does not run as root (slurmd runs the tasks as their
// user). Every daemon it started is stopped when the test ends, failed
// or not.
func startSlurm(t *testing.T) *slurmCluster {
	t.Helper()
	for _, cmd := range []string{"munged", "slurmctld", "slurmd", "sbatch", "sinfo", "scancel"} {
		if _, err := exec.LookPath(cmd); err != nil {
			msg := fmt.Sprintf("Slurm is not installed (no %s): scripts/setup.sh test installs slurm-wlm and munge", cmd)
			if os.Getenv("CI") == "true" {
				t.Fatal(msg + " (CI=true, so this fails rather than skips)")
			}
			t.Skip(msg)
		}
	}
	if os.Geteuid() != 0 {
		msg := "a Slurm cluster of the test's own needs root (slurmd runs tasks as their user; CI runs as root)"
		if os.Getenv(skipRootTestsEnv) == "1" {
			t.Skipf("%s (%s=1)", msg, skipRootTestsEnv)
		}
		t.Fatalf("%s; set %s=1 to skip it", msg, skipRootTestsEnv)
	}
	// A short path: the munge socket's must fit a sockaddr_un.
	dir, err := os.MkdirTemp("", "fpt-slurm-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	for _, d := range []string{"munge", "state", "spool", "log"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	key := make([]byte, 1024)
	rand.Read(key)
	if err := os.WriteFile(filepath.Join(dir, "munge", "munge.key"), key, 0o400); err != nil {
		t.Fatal(err)
	}
	ports := make([]int, 2)
	for i := range ports {
		if ports[i], err = localcluster.FreePort(); err != nil {
			t.Fatal(err)
		}
	}
	s := &slurmCluster{dir: dir, conf: filepath.Join(dir, "slurm.conf")}
	socket := filepath.Join(dir, "munge", "socket")
	conf := fmt.Sprintf(`ClusterName=fpttest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=%d
SlurmdPort=%d
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=%s
CredType=cred/munge
StateSaveLocation=%[4]s/state
SlurmdSpoolDir=%[4]s/spool
SlurmctldPidFile=%[4]s/slurmctld.pid
SlurmdPidFile=%[4]s/slurmd.pid
SlurmctldLogFile=%[4]s/log/slurmctld.log
SlurmdLogFile=%[4]s/log/slurmd.log
PlugStackConfig=%[4]s/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
SlurmdParameters=config_overrides
NodeName=localhost NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=fpt Nodes=ALL Default=YES State=UP MaxTime=10
`, ports[0], ports[1], socket, dir)
	if err := os.WriteFile(s.conf, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "plugstack.conf"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	s.env = append(environWithout("SLURM_", "FPT_", "DMLC_", "PS_"), "SLURM_CONF="+s.conf)
	daemon := func(name string, argv ...string) {
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = s.env
		log, err := os.Create(filepath.Join(dir, "log", name+".out"))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = log, log
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatalf("starting %s: %v", name, err)
		}
		done := make(chan struct{})
		go func() { cmd.Wait(); log.Close(); close(done) }()
		// Cleanups run last first: slurmd, then slurmctld, then munged.
		t.Cleanup(func() {
			cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				cmd.Process.Kill()
				<-done
			}
		})
	}
	daemon("munged", "munged", "-F", "-f", "--key-file="+filepath.Join(dir, "munge", "munge.key"), "--socket="+socket,
		"--pid-file="+filepath.Join(dir, "munge", "pid"), "--log-file="+filepath.Join(dir, "log", "munged.log"),
		"--seed-file="+filepath.Join(dir, "munge", "seed"))
	waitFor(t, "munged's socket", func() bool { _, err := os.Stat(socket); return err == nil })
	daemon("slurmctld", "slurmctld", "-D", "-c", "-f", s.conf)
	daemon("slurmd", "slurmd", "-D", "-f", s.conf, "-N", "localhost")
	t.Cleanup(func() {
		// Jobs first (before the daemons above go): their tasks run
		// under slurmstepd, which outlives slurmd.
		s.run("scancel", "--partition=fpt")
	})
	waitFor(t, "the Slurm node to be idle", func() bool {
		out, _ := s.run("sinfo", "-h", "-o", "%t")
		return strings.TrimSpace(out) == "idle"
	})
	return s
}

// run runs a Slurm client command against the cluster.
func (s *slurmCluster) run(argv ...string) (string, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = s.env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// dumpLogs logs the daemons' logs, for a failure.
func (s *slurmCluster) dumpLogs(t *testing.T) {
	for _, f := range []string{"slurmctld.log", "slurmd.log", "munged.log", "slurmctld.out", "slurmd.out", "munged.out"} {
		b, _ := os.ReadFile(filepath.Join(s.dir, "log", f))
		t.Logf("%s:\n%s", f, tail(string(b)))
	}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 20 s for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// deploy/slurm/fpt.sbatch on a one-node Slurm cluster of the test's own,
// with 4 tasks on the node: fpt run maps them to the scheduler and a
// server (task 0) and 3 workers, which train with every value checked
// exactly.
func TestSlurmJob(t *testing.T) {
	s := startSlurm(t)
	out := filepath.Join(s.dir, "job.out")
	script, err := filepath.Abs("../deploy/slurm/fpt.sbatch")
	if err != nil {
		t.Fatal(err)
	}
	// Bounded, so that a job that hangs fails the test and the cleanups
	// (scancel, the daemons) still run.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sbatch", "--wait", "--nodes=1", "--ntasks-per-node=4", "--time=2", "--output="+out,
		script, bin.app, "-iters", "3", "-max-bytes", "65536", "-quiet")
	cmd.Env = append(s.env, "FPT="+bin.fpt, "PS_VERBOSE=1", "FPT_START_TIMEOUT=60")
	sb, err := cmd.CombinedOutput()
	job, _ := os.ReadFile(out)
	if err != nil {
		s.dumpLogs(t)
		t.Fatalf("sbatch --wait: %v\n%s\njob output:\n%s", err, sb, tail(string(job)))
	}
	for _, want := range []string{"fpt run: engine slurm", "this task also runs the scheduler", "LOCAL_WORLD_SIZE=3"} {
		if !strings.Contains(string(job), want) {
			t.Errorf("job output lacks %q", want)
		}
	}
	if n := strings.Count(string(job), "values checked exactly"); n != 3 {
		t.Errorf("%d workers passed, want 3:\n%s", n, tail(string(job)))
	}
}
