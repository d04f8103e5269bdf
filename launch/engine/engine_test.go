package engine

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/fptps/fpt/config"
)

func TestExpandHostlist(t *testing.T) {
	tests := []struct {
		list string
		want []string
		err  string
	}{
		{"node1", []string{"node1"}, ""},
		{"node[1-3,5]", []string{"node1", "node2", "node3", "node5"}, ""},
		{"gpu[08-10],cpu7", []string{"gpu08", "gpu09", "gpu10", "cpu7"}, ""},
		{"a,b[1-2],c", []string{"a", "b1", "b2", "c"}, ""},
		{"rack[1-2]-n[01-02]", []string{"rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"}, ""},
		{"n[8-10]", []string{"n8", "n9", "n10"}, ""},
		{"", nil, "empty"},
		{"n[1-", nil, "without ']'"},
		{"n1]", nil, "without '['"},
		{"n[3-1]", nil, "bad range"},
		{"n[x]", nil, "bad range"},
		{"n[0-99999999999]", nil, "bad range"},
		{"n[0-9999],m[0-99999]", nil, "bad range"},
		{"n[0-255]-[0-255]-[0-2]", nil, "more than"},
		{"a,,b", nil, "empty name"},
	}
	for _, tt := range tests {
		got, err := ExpandHostlist(tt.list)
		switch {
		case tt.err == "" && err != nil:
			t.Errorf("%q: %v", tt.list, err)
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("%q: error %v, want one with %q", tt.list, err, tt.err)
		case tt.err == "" && !slices.Equal(got, tt.want):
			t.Errorf("%q: %v, want %v", tt.list, got, tt.want)
		}
	}
}

// The engines' tasks become nodes by one mapping (Detect's doc).
func TestDetect(t *testing.T) {
	slurm := func(procID, localID, nodeID string, extra ...string) []string {
		return append([]string{"SLURM_PROCID=" + procID, "SLURM_NTASKS=6", "SLURM_LOCALID=" + localID, "SLURM_NODEID=" + nodeID,
			"SLURM_JOB_NODELIST=gpu[07-08]", "SLURM_JOB_ID=4242", "SLURM_STEP_ID=0"}, extra...)
	}
	slurmPort := "DMLC_PS_ROOT_PORT=" + strconv.Itoa(jobPort("slurm", "4242.0"))
	mpi := func(rank, local string, extra ...string) []string {
		return append([]string{"OMPI_COMM_WORLD_RANK=" + rank, "OMPI_COMM_WORLD_SIZE=3", "OMPI_COMM_WORLD_LOCAL_RANK=" + local,
			"OMPI_COMM_WORLD_LOCAL_SIZE=3", "OMPI_MCA_ess_base_jobid=77"}, extra...)
	}
	mpiPort := "DMLC_PS_ROOT_PORT=" + strconv.Itoa(jobPort("openmpi", "77"))
	jobset := func(rj, index string) []string {
		return []string{"JOBSET_NAME=train", "REPLICATED_JOB_NAME=" + rj, "JOB_COMPLETION_INDEX=" + index,
			"DMLC_NUM_SERVER=2", "DMLC_NUM_WORKER=4"}
	}
	jsPort := "DMLC_PS_ROOT_PORT=" + strconv.Itoa(jobPort("jobset", "train"))
	indexed := func(index string) []string {
		return []string{"JOB_COMPLETION_INDEX=" + index, "HOSTNAME=train-" + index, "DMLC_NUM_SERVER=1", "DMLC_NUM_WORKER=2",
			"DMLC_PS_ROOT_URI=train-0.train"}
	}
	ijPort := "DMLC_PS_ROOT_PORT=" + strconv.Itoa(jobPort("indexed-job", "train"))
	tests := []struct {
		name      string
		env       []string
		engine    string
		want      []string
		scheduler bool
		err       string // the variable named
	}{
		{"no engine", []string{"HOME=/root"}, "", nil, false, ""},
		{"slurm: the first task is server 0 and the scheduler", slurm("0", "0", "0"), "slurm",
			[]string{"DMLC_ROLE=server", "DMLC_NUM_SERVER=2", "DMLC_NUM_WORKER=4", "DMLC_PS_ROOT_URI=gpu07", slurmPort, "DMLC_SERVER_ID=0"}, true, ""},
		{"slurm: a host's first task is its server", slurm("3", "0", "1"), "slurm",
			[]string{"DMLC_ROLE=server", "DMLC_NUM_SERVER=2", "DMLC_NUM_WORKER=4", "DMLC_PS_ROOT_URI=gpu07", slurmPort, "DMLC_SERVER_ID=1"}, false, ""},
		{"slurm: the others are workers", slurm("5", "2", "1"), "slurm",
			[]string{"DMLC_ROLE=worker", "DMLC_NUM_SERVER=2", "DMLC_NUM_WORKER=4", "DMLC_PS_ROOT_URI=gpu07", slurmPort,
				"DMLC_WORKER_ID=3", "RANK=3", "WORLD_SIZE=4", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2"}, false, ""},
		{"slurm: without SLURM_NODEID and SLURM_LOCALID, block order", []string{"SLURM_PROCID=4", "SLURM_NTASKS=6",
			"SLURM_JOB_NODELIST=gpu[07-08]", "SLURM_JOB_ID=4242", "SLURM_STEP_ID=0"}, "slurm",
			[]string{"DMLC_ROLE=worker", "DMLC_NUM_SERVER=2", "DMLC_NUM_WORKER=4", "DMLC_PS_ROOT_URI=gpu07", slurmPort,
				"DMLC_WORKER_ID=2", "RANK=2", "WORLD_SIZE=4", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=2"}, false, ""},
		{"slurm: DMLC_* set win", slurm("0", "0", "0", "DMLC_PS_ROOT_URI=10.0.0.1", "DMLC_PS_ROOT_PORT=9000"), "slurm",
			[]string{"DMLC_ROLE=server", "DMLC_NUM_SERVER=2", "DMLC_NUM_WORKER=4", "DMLC_SERVER_ID=0"}, true, ""},
		{"slurm: metrics ports apart on a host", slurm("4", "1", "1", "FPT_METRICS_ADDR=:9100"), "slurm",
			[]string{"DMLC_ROLE=worker", "DMLC_NUM_SERVER=2", "DMLC_NUM_WORKER=4", "DMLC_PS_ROOT_URI=gpu07", slurmPort,
				"DMLC_WORKER_ID=2", "RANK=2", "WORLD_SIZE=4", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=2", "FPT_METRICS_ADDR=:9101"}, false, ""},
		{"slurm: a role set takes no rank and no scheduler", slurm("0", "0", "0", "DMLC_ROLE=worker"), "slurm",
			[]string{"DMLC_NUM_SERVER=2", "DMLC_NUM_WORKER=4", "DMLC_PS_ROOT_URI=gpu07", slurmPort}, false, ""},
		{"slurm: one task per host", []string{"SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_JOB_NODELIST=n[1-2]"}, "slurm", nil, false, "SLURM_NTASKS"},
		{"slurm: tasks not even over the hosts", []string{"SLURM_PROCID=0", "SLURM_NTASKS=5", "SLURM_JOB_NODELIST=n[1-2]"}, "slurm", nil, false, "SLURM_NTASKS"},
		{"slurm: a bad node list", []string{"SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_JOB_NODELIST=n[1-"}, "slurm", nil, false, "SLURM_JOB_NODELIST"},
		{"slurm: a bad rank", []string{"SLURM_PROCID=x", "SLURM_NTASKS=4", "SLURM_JOB_NODELIST=n1"}, "slurm", nil, false, "SLURM_PROCID"},
		{"slurm: the step's node list first", []string{"SLURM_PROCID=1", "SLURM_NTASKS=2", "SLURM_STEP_NODELIST=b1",
			"SLURM_JOB_NODELIST=a[1-4]", "SLURM_JOB_ID=1", "SLURM_STEP_ID=2"}, "slurm",
			[]string{"DMLC_ROLE=worker", "DMLC_NUM_SERVER=1", "DMLC_NUM_WORKER=1", "DMLC_PS_ROOT_URI=b1",
				"DMLC_PS_ROOT_PORT=" + strconv.Itoa(jobPort("slurm", "1.2")), "DMLC_WORKER_ID=0", "RANK=0", "WORLD_SIZE=1", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1"}, false, ""},
		{"openmpi: one host", mpi("0", "0"), "openmpi",
			[]string{"DMLC_ROLE=server", "DMLC_NUM_SERVER=1", "DMLC_NUM_WORKER=2", "DMLC_PS_ROOT_URI=127.0.0.1", mpiPort, "DMLC_SERVER_ID=0"}, true, ""},
		{"openmpi: a worker", mpi("2", "2"), "openmpi",
			[]string{"DMLC_ROLE=worker", "DMLC_NUM_SERVER=1", "DMLC_NUM_WORKER=2", "DMLC_PS_ROOT_URI=127.0.0.1", mpiPort,
				"DMLC_WORKER_ID=1", "RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2"}, false, ""},
		{"openmpi: several hosts need DMLC_PS_ROOT_URI", []string{"OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=4",
			"OMPI_COMM_WORLD_LOCAL_RANK=0", "OMPI_COMM_WORLD_LOCAL_SIZE=2"}, "openmpi", nil, false, "DMLC_PS_ROOT_URI"},
		{"openmpi: several hosts", []string{"OMPI_COMM_WORLD_RANK=3", "OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_LOCAL_RANK=1",
			"OMPI_COMM_WORLD_LOCAL_SIZE=2", "DMLC_PS_ROOT_URI=h1"}, "openmpi",
			[]string{"DMLC_ROLE=worker", "DMLC_NUM_SERVER=2", "DMLC_NUM_WORKER=2", "DMLC_PS_ROOT_PORT=" + strconv.Itoa(jobPort("openmpi", "")),
				"DMLC_WORKER_ID=1", "RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1"}, false, ""},
		{"jobset: the scheduler", jobset("scheduler", "0"), "jobset",
			[]string{"DMLC_ROLE=scheduler", "DMLC_PS_ROOT_URI=train-scheduler-0-0.train", jsPort}, false, ""},
		{"jobset: a server", jobset("server", "1"), "jobset",
			[]string{"DMLC_ROLE=server", "DMLC_PS_ROOT_URI=train-scheduler-0-0.train", jsPort, "DMLC_SERVER_ID=1"}, false, ""},
		{"jobset: a worker", jobset("workers", "3"), "jobset",
			[]string{"DMLC_ROLE=worker", "DMLC_PS_ROOT_URI=train-scheduler-0-0.train", jsPort,
				"DMLC_WORKER_ID=3", "RANK=3", "WORLD_SIZE=4", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1"}, false, ""},
		{"jobset: an unknown replicated job", jobset("trainer", "0"), "jobset", nil, false, "REPLICATED_JOB_NAME"},
		{"jobset: sizes required", []string{"JOBSET_NAME=t", "REPLICATED_JOB_NAME=worker", "JOB_COMPLETION_INDEX=0"}, "jobset", nil, false, "DMLC_NUM_SERVER"},
		{"indexed job: the scheduler", indexed("0"), "indexed-job", []string{"DMLC_ROLE=scheduler", ijPort}, false, ""},
		{"indexed job: a server", indexed("1"), "indexed-job", []string{"DMLC_ROLE=server", ijPort, "DMLC_SERVER_ID=0"}, false, ""},
		{"indexed job: a worker", indexed("3"), "indexed-job", []string{"DMLC_ROLE=worker", ijPort,
			"DMLC_WORKER_ID=1", "RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1"}, false, ""},
		{"indexed job: an index too many", indexed("4"), "indexed-job", nil, false, "JOB_COMPLETION_INDEX"},
		{"indexed job: no root", []string{"JOB_COMPLETION_INDEX=0", "DMLC_NUM_SERVER=1", "DMLC_NUM_WORKER=1"}, "indexed-job", nil, false, "DMLC_PS_ROOT_URI"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := map[string]string{}
			for _, kv := range tt.env {
				k, v, _ := strings.Cut(kv, "=")
				env[k] = v
			}
			p, err := Detect(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
			if p.Engine != tt.engine {
				t.Errorf("engine %q, want %q", p.Engine, tt.engine)
			}
			if tt.err != "" {
				var ve *config.VarError
				if !errors.As(err, &ve) || ve.Var != tt.err {
					t.Fatalf("error %v, want one naming %s", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(p.Env, tt.want) {
				t.Errorf("env\n %v\nwant\n %v", p.Env, tt.want)
			}
			if p.Scheduler != tt.scheduler {
				t.Errorf("scheduler %v, want %v", p.Scheduler, tt.scheduler)
			}
		})
	}
}

// Two jobs' schedulers on one host get different ports, each an even one
// in the range, its successor (the data port) in the range too.
func TestJobPort(t *testing.T) {
	// Below Linux's ephemeral ports: an outgoing connection never holds it.
	if last := enginePortBase + 2*enginePorts - 1; last >= 32768 {
		t.Errorf("the engine's ports reach %d, into the ephemeral range (32768 and up)", last)
	}
	seen := map[int]string{}
	for _, id := range []string{"1.0", "2.0", "1.1", "4242.0", "4243.0"} {
		p := jobPort("slurm", id)
		if p < enginePortBase || p+1 >= enginePortBase+2*enginePorts || p%2 != 0 {
			t.Errorf("job %s: port %d out of range", id, p)
		}
		if other, ok := seen[p]; ok {
			t.Errorf("jobs %s and %s share port %d", id, other, p)
		}
		seen[p] = id
	}
}

// The scheduler beside task 0 serves its metrics past the host's tasks';
// task 0 keeps the port given; port 0 is left alone.
func TestSchedulerMetricsPort(t *testing.T) {
	env := map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "3", "SLURM_LOCALID": "0", "SLURM_JOB_NODELIST": "n1",
		"FPT_METRICS_ADDR": "10.0.0.1:9100"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	p, err := Detect(lookup)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Scheduler || !slices.Equal(p.SchedulerEnv, []string{"FPT_METRICS_ADDR=10.0.0.1:9103"}) {
		t.Errorf("scheduler %v, its env %v; want FPT_METRICS_ADDR=10.0.0.1:9103", p.Scheduler, p.SchedulerEnv)
	}
	for _, kv := range p.Env {
		if strings.HasPrefix(kv, "FPT_METRICS_ADDR=") {
			t.Errorf("task 0 moved its metrics: %s", kv)
		}
	}
	env["FPT_METRICS_ADDR"] = ":0"
	if p, _ := Detect(lookup); len(p.SchedulerEnv) != 0 {
		t.Errorf("port 0 moved: %v", p.SchedulerEnv)
	}
}
