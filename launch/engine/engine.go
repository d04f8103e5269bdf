// Package engine maps a cluster engine's tasks (Slurm, Open MPI's mpirun,
// Kubernetes' Indexed Jobs and JobSets) to fpt's nodes: from the
// variables the engine gives each task, the DMLC_* environment "fpt run"
// starts the task's node with. It is pure: Detect reads an environment
// and returns variables, without I/O, so that the mapping is tested as a
// table and a manifest's pods can be checked against it.
package engine

import (
	"fmt"
	"hash/fnv"
	"net"
	"strconv"
	"strings"

	"github.com/fptps/fpt/config"
)

// A cluster engine (Slurm, Open MPI's mpirun, a Kubernetes Job or JobSet)
// starts the same command once per task and tells each task its index;
// Detect turns that into the node's DMLC_* environment, with one
// mapping for every engine:
//
//   - Slurm and Open MPI, with K tasks on each of N hosts (K ≥ 2, the same
//     on every host): on every host the first task (local rank 0) is a
//     server, of rank the host's index, and the K-1 others are workers,
//     of rank host×(K-1) + local rank − 1; the job's first task also runs
//     the scheduler. So a job has N servers and N×(K-1) workers: ask for
//     one task per GPU plus one. The scheduler is at the first host of
//     the node list (Slurm; Open MPI names none: DMLC_PS_ROOT_URI, unless
//     the job is on one host), on a port derived from the job's id, so
//     that two jobs on one host do not collide.
//   - A Kubernetes JobSet (JOBSET_NAME, REPLICATED_JOB_NAME): the role is
//     the replicated job's name (scheduler, server or worker, or their
//     plurals), the rank JOB_COMPLETION_INDEX; the scheduler is at its
//     pod's name under the JobSet's headless Service,
//     JOBSET-scheduler-0-0.JOBSET.
//   - A Kubernetes Indexed Job (JOB_COMPLETION_INDEX alone), with
//     DMLC_NUM_SERVER S and DMLC_NUM_WORKER W set: index 0 is the
//     scheduler, 1 to S the servers, the others the workers; the
//     scheduler's address, its pod's name under the job's headless
//     Service, is DMLC_PS_ROOT_URI (the manifest's).
//
// Every DMLC_* variable set wins over the mapping's. Where a host runs
// several of a job's processes, FPT_METRICS_ADDR's port (when not 0) is
// the first of theirs: local task i serves at port+i, the scheduler beside
// task 0 at port+K. A worker also gets
// RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE as torchrun sets them
// (among the workers, not the tasks: LOCAL_RANK picks a host's GPU).

// Plan is what Detect makes of a task's environment.
type Plan struct {
	// Engine is the engine found: "slurm", "openmpi", "jobset" or
	// "indexed-job"; "" when none (Env is then empty).
	Engine string
	// Env is the variables to add to the task's environment, KEY=VALUE,
	// none of them already set.
	Env []string
	// Scheduler says this task also runs the scheduler (the job's first
	// task under Slurm and Open MPI), besides its own role; SchedulerEnv
	// is what the scheduler's process sets on top of Env.
	Scheduler    bool
	SchedulerEnv []string
}

// Engine port range: the scheduler's control port is an even port in
// [enginePortBase, enginePortBase+2*enginePorts), its data port the next.
// The range ends below Linux's ephemeral ports (32768 and up by default),
// which any outgoing connection on the host may hold.
const (
	enginePortBase = 20000
	enginePorts    = 6000
	// maxHosts bounds a Slurm node list's expansion (a malformed
	// "n[0-999999999]" must not allocate a billion names).
	maxHosts = 1 << 16
)

// task is a task's place in the job, as the mapping decides it.
type task struct {
	role          string
	rank          int // among its role; the scheduler's is 0
	servers       int
	workers       int
	localWorker   int // a worker's rank among its host's workers
	hostWorkers   int // workers on its host
	local         int // its index among its host's tasks
	hostTasks     int // tasks on its host
	root          string
	port          int
	withScheduler bool
}

// Detect reads the task's environment through lookup and returns its
// plan: the engine found and the DMLC_* (and, for a worker, torchrun's)
// variables it sets. An engine's variable that makes no sense is a
// *config.VarError naming it.
func Detect(lookup func(string) (string, bool)) (Plan, error) {
	get := func(name string) string {
		v, _ := lookup(name)
		return strings.TrimSpace(v)
	}
	var (
		t      task
		engine string
		err    error
	)
	switch {
	case get("SLURM_PROCID") != "" && get("SLURM_NTASKS") != "":
		engine = "slurm"
		t, err = slurmTask(get)
	case get("OMPI_COMM_WORLD_RANK") != "":
		engine = "openmpi"
		t, err = mpiTask(get)
	case get("JOB_COMPLETION_INDEX") != "" && get("JOBSET_NAME") != "":
		engine = "jobset"
		t, err = jobSetTask(get)
	case get("JOB_COMPLETION_INDEX") != "":
		engine = "indexed-job"
		t, err = indexedJobTask(get)
	default:
		return Plan{}, nil
	}
	if err != nil {
		return Plan{Engine: engine}, err
	}
	p := Plan{Engine: engine, Env: t.env(get), Scheduler: t.withScheduler && get("DMLC_ROLE") == ""}
	if addr, ok := t.metricsAddr(get("FPT_METRICS_ADDR"), t.local); ok {
		p.Env = append(p.Env, "FPT_METRICS_ADDR="+addr)
	}
	if addr, ok := t.metricsAddr(get("FPT_METRICS_ADDR"), t.hostTasks); ok && p.Scheduler {
		p.SchedulerEnv = []string{"FPT_METRICS_ADDR=" + addr}
	}
	return p, nil
}

// metricsAddr is the metrics address of the process at offset among its
// host's: FPT_METRICS_ADDR's port plus offset, when the host runs several
// processes (each needs a port of its own) and the port is fixed.
func (t task) metricsAddr(addr string, offset int) (string, bool) {
	if addr == "" || t.hostTasks < 2 || offset == 0 {
		return "", false
	}
	host, port, err := net.SplitHostPort(addr)
	n, perr := strconv.Atoi(port)
	if err != nil || perr != nil || n == 0 || n+offset > 65535 {
		return "", false // port 0, or a malformed one the node reports
	}
	return net.JoinHostPort(host, strconv.Itoa(n+offset)), true
}

// env is the task's variables, less those already set.
func (t task) env(get func(string) string) []string {
	var out []string
	set := func(k, v string) {
		if get(k) == "" {
			out = append(out, k+"="+v)
		}
	}
	set("DMLC_ROLE", t.role)
	set("DMLC_NUM_SERVER", strconv.Itoa(t.servers))
	set("DMLC_NUM_WORKER", strconv.Itoa(t.workers))
	if t.root != "" {
		set("DMLC_PS_ROOT_URI", t.root)
	}
	set("DMLC_PS_ROOT_PORT", strconv.Itoa(t.port))
	role := t.role
	if r := get("DMLC_ROLE"); r != "" {
		role = r
	}
	if role != t.role {
		// Overridden: the mapping's rank is not this role's.
		return out
	}
	switch role {
	case "server":
		set("DMLC_SERVER_ID", strconv.Itoa(t.rank))
	case "worker":
		set("DMLC_WORKER_ID", strconv.Itoa(t.rank))
		set("RANK", strconv.Itoa(t.rank))
		set("WORLD_SIZE", strconv.Itoa(t.workers))
		set("LOCAL_RANK", strconv.Itoa(t.localWorker))
		set("LOCAL_WORLD_SIZE", strconv.Itoa(t.hostWorkers))
	}
	return out
}

// number reads a non-negative integer (at most max) from name.
func number(get func(string) string, name string, max int) (int, error) {
	v := get(name)
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > max {
		return 0, &config.VarError{Var: name, Value: v, Reason: fmt.Sprintf("must be an integer from 0 to %d", max)}
	}
	return n, nil
}

// hostTask places task local (of perHost) on host h of hosts: the mapping
// of the engines that run several tasks on each host.
func hostTask(h, hosts, local, perHost int, sizeVar string) (task, error) {
	if perHost < 2 {
		return task{}, &config.VarError{Var: sizeVar, Value: strconv.Itoa(perHost * hosts),
			Reason: fmt.Sprintf("%d task(s) on each of %d host(s): fpt runs a server and at least one worker on every host, so at least 2 per host", perHost, hosts)}
	}
	t := task{servers: hosts, workers: hosts * (perHost - 1), hostWorkers: perHost - 1, local: local, hostTasks: perHost}
	if local == 0 {
		t.role, t.rank = "server", h
		t.withScheduler = h == 0
		return t, nil
	}
	t.role, t.rank, t.localWorker = "worker", h*(perHost-1)+local-1, local-1
	return t, nil
}

func slurmTask(get func(string) string) (task, error) {
	procID, err := number(get, "SLURM_PROCID", 1<<20)
	if err != nil {
		return task{}, err
	}
	ntasks, err := number(get, "SLURM_NTASKS", 1<<20)
	if err != nil {
		return task{}, err
	}
	listVar := "SLURM_STEP_NODELIST"
	if get(listVar) == "" {
		listVar = "SLURM_JOB_NODELIST"
	}
	if get(listVar) == "" {
		listVar = "SLURM_NODELIST"
	}
	hosts, err := ExpandHostlist(get(listVar))
	if err != nil {
		return task{}, &config.VarError{Var: listVar, Value: get(listVar), Reason: err.Error()}
	}
	if ntasks%len(hosts) != 0 || procID >= ntasks {
		return task{}, &config.VarError{Var: "SLURM_NTASKS", Value: get("SLURM_NTASKS"),
			Reason: fmt.Sprintf("not the same number of tasks on each of the %d hosts of %s (srun --ntasks-per-node)", len(hosts), listVar)}
	}
	perHost := ntasks / len(hosts)
	// Slurm's default (block) distribution numbers a host's tasks
	// together; SLURM_NODEID and SLURM_LOCALID say where this one is
	// whatever the distribution.
	h, local := procID/perHost, procID%perHost
	if get("SLURM_NODEID") != "" {
		if h, err = number(get, "SLURM_NODEID", len(hosts)-1); err != nil {
			return task{}, err
		}
	}
	if get("SLURM_LOCALID") != "" {
		if local, err = number(get, "SLURM_LOCALID", perHost-1); err != nil {
			return task{}, err
		}
	}
	t, err := hostTask(h, len(hosts), local, perHost, "SLURM_NTASKS")
	if err != nil {
		return task{}, err
	}
	t.root = hosts[0]
	t.port = jobPort("slurm", get("SLURM_JOB_ID")+"."+get("SLURM_STEP_ID"))
	return t, nil
}

func mpiTask(get func(string) string) (task, error) {
	rank, err := number(get, "OMPI_COMM_WORLD_RANK", 1<<20)
	if err != nil {
		return task{}, err
	}
	size, err := number(get, "OMPI_COMM_WORLD_SIZE", 1<<20)
	if err != nil {
		return task{}, err
	}
	local, err := number(get, "OMPI_COMM_WORLD_LOCAL_RANK", 1<<20)
	if err != nil {
		return task{}, err
	}
	perHost := size
	if get("OMPI_COMM_WORLD_LOCAL_SIZE") != "" {
		if perHost, err = number(get, "OMPI_COMM_WORLD_LOCAL_SIZE", 1<<20); err != nil {
			return task{}, err
		}
	}
	if perHost == 0 || size%perHost != 0 || rank >= size || local >= perHost {
		return task{}, &config.VarError{Var: "OMPI_COMM_WORLD_SIZE", Value: get("OMPI_COMM_WORLD_SIZE"),
			Reason: "not the same number of tasks on every host (mpirun --map-by ppr:K:node)"}
	}
	// mpirun's default mapping (by slot) numbers a host's tasks together.
	hosts := size / perHost
	t, err := hostTask((rank-local)/perHost, hosts, local, perHost, "OMPI_COMM_WORLD_SIZE")
	if err != nil {
		return task{}, err
	}
	switch {
	case hosts == 1:
		t.root = "127.0.0.1"
	case get("DMLC_PS_ROOT_URI") == "":
		return task{}, &config.VarError{Var: "DMLC_PS_ROOT_URI", Reason: fmt.Sprintf(
			"required for a job over %d hosts under mpirun, which names none: the first host's address (mpirun -x DMLC_PS_ROOT_URI=HOST)", hosts)}
	}
	id := get("OMPI_MCA_ess_base_jobid")
	if id == "" {
		id = get("PMIX_NAMESPACE")
	}
	t.port = jobPort("openmpi", id)
	return t, nil
}

func jobSetTask(get func(string) string) (task, error) {
	index, err := number(get, "JOB_COMPLETION_INDEX", 1<<20)
	if err != nil {
		return task{}, err
	}
	name := get("JOBSET_NAME")
	t := task{rank: index, hostWorkers: 1}
	switch rj := get("REPLICATED_JOB_NAME"); rj {
	case "scheduler":
		t.role = "scheduler"
	case "server", "servers":
		t.role = "server"
	case "worker", "workers":
		t.role = "worker"
	default:
		return task{}, &config.VarError{Var: "REPLICATED_JOB_NAME", Value: rj,
			Reason: "must name the JobSet's replicated job of the role: scheduler, server(s) or worker(s)"}
	}
	if t.servers, t.workers, err = counts(get); err != nil {
		return task{}, err
	}
	// The JobSet's headless Service is named after it; pod names are
	// JOBSET-REPLICATEDJOB-JOBINDEX-PODINDEX.
	t.root = name + "-scheduler-0-0." + name
	t.port = jobPort("jobset", name)
	return t, nil
}

func indexedJobTask(get func(string) string) (task, error) {
	index, err := number(get, "JOB_COMPLETION_INDEX", 1<<20)
	if err != nil {
		return task{}, err
	}
	t := task{hostWorkers: 1}
	if t.servers, t.workers, err = counts(get); err != nil {
		return task{}, err
	}
	switch {
	case index == 0:
		t.role = "scheduler"
	case index <= t.servers:
		t.role, t.rank = "server", index-1
	case index <= t.servers+t.workers:
		t.role, t.rank = "worker", index-1-t.servers
	default:
		return task{}, &config.VarError{Var: "JOB_COMPLETION_INDEX", Value: get("JOB_COMPLETION_INDEX"), Reason: fmt.Sprintf(
			"beyond the scheduler, DMLC_NUM_SERVER=%d servers and DMLC_NUM_WORKER=%d workers: the Job's completions must be %d",
			t.servers, t.workers, 1+t.servers+t.workers)}
	}
	if get("DMLC_PS_ROOT_URI") == "" {
		return task{}, &config.VarError{Var: "DMLC_PS_ROOT_URI", Reason: "required in an Indexed Job: the scheduler's pod (index 0) under the job's headless Service, as JOB-0.SERVICE"}
	}
	// Every pod of the job has the same prefix, JOB-INDEX.
	host := get("HOSTNAME")
	if i := strings.LastIndexByte(host, '-'); i > 0 {
		host = host[:i]
	}
	t.port = jobPort("indexed-job", host)
	return t, nil
}

// counts reads DMLC_NUM_SERVER and DMLC_NUM_WORKER, which a Kubernetes
// manifest sets (a pod cannot see the other jobs' sizes).
func counts(get func(string) string) (servers, workers int, err error) {
	for _, v := range []struct {
		name string
		n    *int
	}{{"DMLC_NUM_SERVER", &servers}, {"DMLC_NUM_WORKER", &workers}} {
		s := get(v.name)
		n, e := strconv.Atoi(s)
		if e != nil || n < 1 {
			return 0, 0, &config.VarError{Var: v.name, Value: s, Reason: "required under Kubernetes: the manifest sets the job's size"}
		}
		*v.n = n
	}
	return servers, workers, nil
}

// jobPort derives the scheduler's port from the job's id, so that two
// jobs on one host do not collide, and every task of a job agrees on it.
func jobPort(engine, id string) int {
	h := fnv.New32a()
	h.Write([]byte(engine + "/" + id))
	return enginePortBase + 2*int(h.Sum32()%enginePorts)
}

// ExpandHostlist expands a Slurm node list: comma-separated names, each
// with bracketed ranges ("node[1-3,5]", "rack[1-2]-gpu[01-02]": zero
// padding kept).
func ExpandHostlist(list string) ([]string, error) {
	list = strings.TrimSpace(list)
	if list == "" {
		return nil, fmt.Errorf("empty node list")
	}
	var out []string
	for _, item := range splitTop(list) {
		if item == "" {
			return nil, fmt.Errorf("an empty name in %q", list)
		}
		names, err := expandItem(item, maxHosts-len(out))
		if err != nil {
			return nil, err
		}
		out = append(out, names...)
	}
	return out, nil
}

// splitTop splits s at the commas outside brackets.
func splitTop(s string) []string {
	var out []string
	depth, start := 0, 0
	for i, c := range s {
		switch c {
		case '[':
			depth++
		case ']':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	return append(out, s[start:])
}

// expandItem expands one name with bracketed ranges into at most room
// names.
func expandItem(item string, room int) ([]string, error) {
	open := strings.IndexByte(item, '[')
	if open < 0 {
		if strings.ContainsRune(item, ']') {
			return nil, fmt.Errorf("%q: a ']' without '['", item)
		}
		return []string{item}, nil
	}
	end := strings.IndexByte(item[open:], ']')
	if end < 0 {
		return nil, fmt.Errorf("%q: a '[' without ']'", item)
	}
	end += open
	prefix, ranges, rest := item[:open], item[open+1:end], item[end+1:]
	tails, err := expandItem(rest, room)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, r := range strings.Split(ranges, ",") {
		lo, hi, ok := strings.Cut(r, "-")
		if !ok {
			hi = lo
		}
		a, err1 := strconv.Atoi(lo)
		b, err2 := strconv.Atoi(hi)
		if err1 != nil || err2 != nil || a < 0 || b < a || b-a >= maxHosts {
			return nil, fmt.Errorf("%q: bad range %q", item, r)
		}
		if (b-a+1)*len(tails) > room-len(out) {
			return nil, fmt.Errorf("%q: more than %d hosts", item, maxHosts)
		}
		for n := a; n <= b; n++ {
			num := fmt.Sprintf("%0*d", len(lo), n)
			for _, t := range tails {
				out = append(out, prefix+num+t)
			}
		}
	}
	return out, nil
}
