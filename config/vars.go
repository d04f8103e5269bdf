package config

import (
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/trace"
)

// Use says who reads a known variable.
type Use uint8

// The uses of a known variable.
const (
	// NodeVar is read by every node (fpt, test_kv_app, the C library)
	// when it starts.
	NodeVar Use = iota + 1
	// LauncherVar is set by ps-lite, dmlc-tracker or the frameworks that
	// launch through them; fpt accepts it and does not use it.
	LauncherVar
	// ToolVar is set by one of fpt's tools for the processes it starts,
	// or read by a tool (fptrun, the Python package) rather than a node.
	ToolVar
	// TestVar is read by fpt's tests only.
	TestVar
)

// Var is one environment variable fpt knows: its name, what it means, its
// default as help shows it ("" when it has none), and, for a node's
// variable, how FromEnv reads it. Known is the one list: FromEnv parses
// through it, help text is printed from it, and Unknown checks against it.
type Var struct {
	Name     string
	Meaning  string
	Default  string
	Required bool
	Use      Use
	read     func(p *parser, name string, c *Config)
}

// Known is every variable fpt knows, in the order FromEnv reads them (an
// entry may check itself against the fields earlier ones set). It builds a
// fresh slice on each call.
func Known() []Var {
	return []Var{
		// Where the node stands in the cluster.
		{Name: "DMLC_ROLE", Meaning: "the node's role: scheduler, server or worker", Required: true, Use: NodeVar,
			read: func(p *parser, name string, c *Config) {
				if v, ok := p.required(name); ok {
					r, err := node.ParseRole(v)
					if err != nil {
						p.fail(name, v, "must be scheduler, server or worker")
					}
					c.Role = r
				}
			}},
		{Name: "DMLC_PS_ROOT_URI", Meaning: "the scheduler's host", Required: true, Use: NodeVar,
			read: func(p *parser, name string, c *Config) {
				if v, ok := p.required(name); ok {
					c.RootURI = v
				}
			}},
		{Name: "DMLC_PS_ROOT_PORT", Meaning: "the scheduler's control port", Required: true, Use: NodeVar,
			read: func(p *parser, name string, c *Config) { c.RootPort = p.port(name, true) }},
		{Name: "DMLC_NUM_SERVER", Meaning: "how many servers the cluster has", Required: true, Use: NodeVar,
			read: func(p *parser, name string, c *Config) { c.NumServers = p.positive(name) }},
		{Name: "DMLC_NUM_WORKER", Meaning: "how many workers the cluster has", Required: true, Use: NodeVar,
			read: func(p *parser, name string, c *Config) { c.NumWorkers = p.positive(name) }},
		{Name: "DMLC_WORKER_ID", Meaning: "a worker's rank, from 0 (over DMLC_TASK_ID; servers ignore it)", Use: NodeVar,
			Default: "the scheduler assigns ranks",
			read: func(p *parser, name string, c *Config) {
				if c.Role == node.Worker {
					p.rank(name, 0, c)
				}
			}},
		{Name: "DMLC_SERVER_ID", Meaning: "a server's rank, from 0 (over DMLC_TASK_ID; workers ignore it)", Use: NodeVar,
			Default: "the scheduler assigns ranks",
			read: func(p *parser, name string, c *Config) {
				if c.Role == node.Server {
					p.rank(name, 0, c)
				}
			}},
		{Name: "DMLC_TASK_ID", Use: NodeVar,
			Meaning: "dmlc-tracker's task index: pins a worker's rank to it, a server's to it minus DMLC_NUM_WORKER (the local tracker numbers workers first)",
			Default: "the scheduler assigns ranks",
			read: func(p *parser, name string, c *Config) {
				if c.RankVar != "" {
					return // DMLC_WORKER_ID or DMLC_SERVER_ID said
				}
				switch c.Role {
				case node.Worker:
					p.rank(name, 0, c)
				case node.Server:
					p.rank(name, c.NumWorkers, c)
				}
			}},
		{Name: "DMLC_NODE_HOST", Meaning: "the address other nodes reach this one at", Use: NodeVar,
			Default: "DMLC_INTERFACE's address, else the one that routes to the scheduler",
			read:    func(p *parser, name string, c *Config) { c.NodeHost, _ = p.optional(name) }},
		{Name: "DMLC_INTERFACE", Meaning: "the network interface whose IPv4 address is the node's", Use: NodeVar,
			read: func(p *parser, name string, c *Config) { c.Interface, _ = p.optional(name) }},
		{Name: "FPT_HOST_ID", Meaning: "the host a server or worker runs on, for its local group (workers of one host); set it where DMLC_NODE_HOST does not tell hosts apart (containers, one address per process)", Default: "DMLC_NODE_HOST", Use: NodeVar,
			read: func(p *parser, name string, c *Config) {
				v, _ := p.optional(name)
				if len(v) > MaxHostIDLen {
					p.fail(name, v, fmt.Sprintf("longer than %d bytes", MaxHostIDLen))
					v = ""
				}
				c.HostID = v
			}},
		{Name: "FPT_NODE_PORT", Meaning: "the node's control port; its data port is the next one", Default: "a free port", Use: NodeVar,
			read: func(p *parser, name string, c *Config) {
				c.NodePort = p.port(name, false)
				if c.NodePort == 65535 {
					p.fail(name, "65535", "the data port is NodePort+1, so it must be below 65535")
				}
			}},
		{Name: "PS_VERBOSE", Meaning: "logging: 0 warnings, 1 progress, 2 debug", Default: "0", Use: NodeVar,
			read: func(p *parser, name string, c *Config) { c.Verbose = int(p.integer(name, 0, 0, 2)) }},

		// Transport and timing.
		{Name: "FPT_VAN", Meaning: "the data plane: epoll or netconn", Default: "epoll", Use: NodeVar,
			read: func(p *parser, name string, c *Config) { c.Van = p.choice(name, "epoll", "netconn") }},
		{Name: "PS_HEARTBEAT_INTERVAL", Meaning: "seconds between heartbeats", Default: seconds(DefaultHeartbeatInterval), Use: NodeVar,
			read: func(p *parser, name string, c *Config) {
				c.HeartbeatInterval = p.seconds(name, DefaultHeartbeatInterval)
			}},
		{Name: "PS_HEARTBEAT_TIMEOUT", Meaning: "seconds without a heartbeat after which a node is dead; above the interval", Default: seconds(DefaultHeartbeatTimeout), Use: NodeVar,
			read: func(p *parser, name string, c *Config) {
				c.HeartbeatTimeout = p.seconds(name, DefaultHeartbeatTimeout)
				if c.HeartbeatTimeout <= c.HeartbeatInterval {
					p.fail(name, p.raw(name), "must be longer than PS_HEARTBEAT_INTERVAL")
				}
			}},
		{Name: "FPT_START_TIMEOUT", Meaning: "seconds the cluster may take to start", Default: seconds(DefaultStartTimeout), Use: NodeVar,
			read: func(p *parser, name string, c *Config) { c.StartTimeout = p.seconds(name, DefaultStartTimeout) }},
		{Name: "FPT_STALL_TIMEOUT", Meaning: "seconds the others wait for a worker that stopped pushing before it is failed by name; 0: forever", Default: seconds(DefaultStallTimeout), Use: NodeVar,
			read: func(p *parser, name string, c *Config) {
				c.StallTimeout = DefaultStallTimeout
				if v, ok := p.optional(name); ok && v == "0" {
					c.StallTimeout = 0
				} else if ok {
					c.StallTimeout = p.seconds(name, DefaultStallTimeout)
				}
			}},
		{Name: "FPT_ON_SERVER_LOSS", Meaning: "what a lost server costs: fail (the job ends, naming it) or retry (its incomplete iterations are pushed again over the servers left; FPTPush/FPTPull only, a push completes once every worker has its iteration's sum)", Default: "fail", Use: NodeVar,
			read: func(p *parser, name string, c *Config) {
				c.RetryServerLoss = p.choice(name, "fail", "retry") == "retry"
			}},
		{Name: "FPT_ON_WORKER_LOSS", Meaning: "what a lost worker costs: fail (the job ends, naming it), continue (the iterations not every worker has the sums of are summed again over the workers left, and fpt_num_workers_at says so; FPTPush/FPTPull only, a push and a pull complete once every worker has its iteration's sum) or wait (as continue, then no further iteration starts until a worker joins; FPT_WORKER_WAIT_TIMEOUT)", Default: "fail", Use: NodeVar,
			read: func(p *parser, name string, c *Config) {
				switch p.choice(name, "fail", "continue", "wait") {
				case "continue":
					c.WorkerLoss = WorkerLossContinue
				case "wait":
					c.WorkerLoss = WorkerLossWait
				}
			}},
		{Name: "FPT_WORKER_WAIT_TIMEOUT", Meaning: "under FPT_ON_WORKER_LOSS=wait, seconds the job waits for a worker to join after one was lost, before it fails naming the lost one", Default: seconds(DefaultWorkerWaitTimeout), Use: NodeVar,
			read: func(p *parser, name string, c *Config) {
				c.WorkerWaitTimeout = p.seconds(name, DefaultWorkerWaitTimeout)
			}},
		{Name: "FPT_LEAVE_TIMEOUT", Meaning: "under FPT_ON_SERVER_LOSS=retry, seconds a server sent SIGTERM may take to leave the job in order (hand its classic keys over), after which it fails as a lost one", Default: seconds(DefaultLeaveTimeout), Use: NodeVar,
			read: func(p *parser, name string, c *Config) {
				c.LeaveTimeout = p.seconds(name, DefaultLeaveTimeout)
			}},
		{Name: "FPT_MAX_FRAME_BYTES", Meaning: "largest frame payload accepted, bytes", Default: strconv.Itoa(DefaultMaxFrameBytes), Use: NodeVar,
			read: func(p *parser, name string, c *Config) {
				c.MaxFrameBytes = uint64(p.integer(name, DefaultMaxFrameBytes, 1<<10, 1<<48))
			}},
		{Name: "FPT_PARTITION_BYTES", Meaning: "largest tensor partition, bytes; at most FPT_MAX_FRAME_BYTES", Default: strconv.Itoa(DefaultPartitionBytes), Use: NodeVar,
			read: func(p *parser, name string, c *Config) {
				c.PartitionBytes = uint64(p.integer(name, DefaultPartitionBytes, 8, 1<<40))
				if c.PartitionBytes > c.MaxFrameBytes {
					p.fail(name, p.raw(name), "must not exceed FPT_MAX_FRAME_BYTES")
				}
			}},
		{Name: "FPT_POOL_BYTES", Meaning: "limit of the send pool, bytes", Default: strconv.Itoa(DefaultPoolBytes), Use: NodeVar,
			read: func(p *parser, name string, c *Config) { c.PoolBytes = p.integer(name, DefaultPoolBytes, 1<<16, 1<<50) }},
		{Name: "FPT_CHANNELS", Meaning: "data connections per pair of nodes, partitions striped over them; the same on every node", Default: strconv.Itoa(DefaultChannels), Use: NodeVar,
			read: func(p *parser, name string, c *Config) {
				c.Channels = int(p.integer(name, DefaultChannels, 1, MaxChannels))
			}},

		// The load balancer.
		{Name: "FPT_LB", Meaning: "the scheduler's load balancer: on, or off (every tensor split evenly over the servers, as in ps-lite)", Default: "on", Use: NodeVar,
			read: func(p *parser, name string, c *Config) {
				c.LB = true
				if v, ok := p.optional(name); ok {
					switch v {
					case "on", "1", "true":
					case "off", "0", "false":
						c.LB = false
					default:
						p.fail(name, v, "must be on or off")
					}
				}
			}},
		{Name: "FPT_LB_PROBE_EVERY", Meaning: "probe again after this many balanced iterations; 0: only when the measurements drift", Default: "0", Use: NodeVar,
			read: func(p *parser, name string, c *Config) { c.LBProbeEvery = uint64(p.integer(name, 0, 0, 1<<40)) }},
		{Name: "FPT_LB_AHEAD", Meaning: "seconds of iterations, at their latest pace, that workers may push ahead of the last one done (up to 1024 iterations, at least 2, and 2 while a probe is on), so that short steps do not wait for the scheduler's grants; a worker whose iterations are shorter reports to the LB once per half of it; 0: 2 iterations", Default: seconds(DefaultLBAhead), Use: NodeVar,
			read: func(p *parser, name string, c *Config) {
				if v, ok := p.optional(name); ok && v == "0" {
					return
				}
				c.LBAhead = p.seconds(name, DefaultLBAhead)
			}},

		// Security.
		{Name: "FPT_LOCAL_AGGREGATION", Meaning: "sum the contributions of a host's workers (one FPT_HOST_ID or address) on the host, in shared memory, and send one sum per host: off, auto (on where a host runs several workers, else off) or on (the LB then balances by host; a worker lost under FPT_ON_WORKER_LOSS=continue or wait, or a server under FPT_ON_SERVER_LOSS=retry, re-forms the groups over the workers left from its retry's iteration, and a joining worker joins its host's group from its first iteration); fptrun sets auto for a job it starts whole on one machine; see docs/local-aggregation.md", Default: "off", Use: NodeVar,
			read: func(p *parser, name string, c *Config) {
				switch p.choice(name, "off", "auto", "on") {
				case "auto":
					c.LocalAggregation = LocalAggregationAuto
				case "on":
					c.LocalAggregation = LocalAggregationOn
				}
			}},
		{Name: "FPT_LOCAL_AGGREGATION_DIR", Meaning: "where a host's group makes its shared-memory segment; a worker that cannot make one there (missing, not writable, full) sums alone, over the network, and logs why", Default: DefaultLocalAggregationDir, Use: NodeVar,
			read: func(p *parser, name string, c *Config) {
				c.LocalAggregationDir = DefaultLocalAggregationDir
				if v, ok := p.optional(name); ok && v != "" {
					c.LocalAggregationDir = v
				}
			}},
		{Name: "FPT_CLUSTER_SECRET", Meaning: fmt.Sprintf("the job's shared secret, at least %d bytes (e.g. openssl rand -hex 16); every node has the same one", MinSecretBytes), Use: NodeVar,
			Default: "none: the node binds loopback only",
			read:    func(p *parser, name string, c *Config) { c.Secret = p.secret(name, "FPT_CLUSTER_SECRET_FILE") }},
		{Name: "FPT_CLUSTER_SECRET_FILE", Meaning: "a regular file of at most 4 KiB holding the secret instead (surrounding white space removed, as from FPT_CLUSTER_SECRET)", Use: NodeVar},
		{Name: "FPT_INSECURE", Meaning: "1: a node without a secret accepts connections from other hosts", Default: "0", Use: NodeVar,
			read: func(p *parser, name string, c *Config) { c.Insecure = p.flag(name) }},

		// What the node serves besides the cluster.
		{Name: "FPT_METRICS_ADDR", Meaning: "where the node serves Prometheus metrics: host:port, :port for every interface, port 0 for any free one; empty: none", Use: NodeVar,
			read: func(p *parser, name string, c *Config) { c.MetricsAddr = p.addr(name) }},
		{Name: "FPT_STATUS_ADDR", Meaning: "address of the scheduler's status page (host:port); empty: none", Use: NodeVar,
			read: func(p *parser, name string, c *Config) { c.StatusAddr = p.addr(name) }},
		{Name: "FPT_TRACE_FILE", Meaning: "where a server or worker writes its communication timeline (Chrome trace JSON; {role} and {rank} are replaced by the node's); empty: none", Use: NodeVar,
			read: func(p *parser, name string, c *Config) { c.TraceFile, _ = p.optional(name) }},
		{Name: "FPT_TRACE_ITERS", Meaning: "the iterations the timeline covers: 10-20, 10- or 7", Default: "all", Use: NodeVar,
			read: func(p *parser, name string, c *Config) {
				c.TraceIters = trace.All
				if v, ok := p.optional(name); ok {
					w, err := trace.ParseWindow(v)
					if err != nil {
						p.fail(name, v, trace.ErrWindow.Error())
					}
					c.TraceIters = w
				}
			}},

		// The servers' classic store.
		{Name: "FPT_CHECKPOINT_DIR", Meaning: "where the servers checkpoint the classic key-value store, a set of files per key layout, and load the newest complete set from when the job starts; empty: no checkpoints", Use: NodeVar,
			read: func(p *parser, name string, c *Config) { c.CheckpointDir, _ = p.optional(name) }},
		{Name: "FPT_CHECKPOINT_EVERY", Meaning: "seconds between a server's checkpoints, written only if its store or the key layout changed, and at a clean end", Default: seconds(DefaultCheckpointEvery), Use: NodeVar,
			read: func(p *parser, name string, c *Config) {
				c.CheckpointEvery = p.seconds(name, DefaultCheckpointEvery)
			}},

		// Set by ps-lite launchers, dmlc-tracker and the frameworks on
		// them; read by ps-lite (a different transport) or by the
		// launchers themselves. A launch script written for ps-lite runs
		// fpt unchanged, so these are known, not mistakes.
		{Name: "DMLC_JOB_CLUSTER", Meaning: "dmlc-tracker's cluster type (local, ssh, mpi...)", Use: LauncherVar},
		{Name: "DMLC_NUM_ATTEMPT", Meaning: "dmlc-tracker's retry count", Use: LauncherVar},
		{Name: "DMLC_TRACKER_URI", Meaning: "dmlc-tracker's rabit tracker host", Use: LauncherVar},
		{Name: "DMLC_TRACKER_PORT", Meaning: "dmlc-tracker's rabit tracker port", Use: LauncherVar},
		{Name: "DMLC_SUBMIT_CLUSTER", Meaning: "dmlc-submit's default --cluster", Use: LauncherVar},
		{Name: "DMLC_JOB_ARCHIVES", Meaning: "dmlc-tracker's archives to unpack", Use: LauncherVar},
		{Name: "DMLC_HDFS_OPTS", Meaning: "dmlc-tracker's libhdfs options", Use: LauncherVar},
		{Name: "DMLC_WORKER_CORES", Meaning: "dmlc-tracker's cores per worker", Use: LauncherVar},
		{Name: "DMLC_WORKER_MEMORY_MB", Meaning: "dmlc-tracker's memory per worker", Use: LauncherVar},
		{Name: "DMLC_SERVER_CORES", Meaning: "dmlc-tracker's cores per server", Use: LauncherVar},
		{Name: "DMLC_SERVER_MEMORY_MB", Meaning: "dmlc-tracker's memory per server", Use: LauncherVar},
		{Name: "DMLC_RANK", Meaning: "ps-lite's record of its own rank, for recovery", Use: LauncherVar},
		{Name: "DMLC_LOCAL", Meaning: "ps-lite's ZeroMQ in-process mode", Use: LauncherVar},
		{Name: "DMLC_USE_KUBERNETES", Meaning: "ps-lite's ZeroMQ binding on Kubernetes", Use: LauncherVar},
		{Name: "DMLC_PS_VAN_TYPE", Meaning: "ps-lite's transport (zmq, ibverbs, p3)", Use: LauncherVar},
		{Name: "DMLC_PS_WATER_MARK", Meaning: "ps-lite's ZeroMQ high-water mark", Use: LauncherVar},
		{Name: "DMLC_LOG_DEBUG", Meaning: "dmlc-core's debug logging", Use: LauncherVar},
		{Name: "DMLC_LOG_STACK_TRACE_DEPTH", Meaning: "dmlc-core's stack trace depth", Use: LauncherVar},
		{Name: "PS_DROP_MSG", Meaning: "ps-lite's test message drop rate", Use: LauncherVar},
		{Name: "PS_RESEND", Meaning: "ps-lite's resending of unacknowledged messages", Use: LauncherVar},
		{Name: "PS_RESEND_TIMEOUT", Meaning: "ps-lite's resend timeout", Use: LauncherVar},

		// Set by fpt's tools for the processes they start.
		{Name: "FPT_BENCH_CHILD", Meaning: "set by fpt bench on the workers of its cluster", Use: ToolVar},
		{Name: "FPT_PYTHON", Meaning: "the Python interpreter fptrun, the examples and the tests run (default: the first python3 on PATH, then /usr/bin/python3, that imports torch)", Use: ToolVar},
		{Name: "FPT_LIB", Meaning: "the libfpt.so the Python package loads (default: the repository's build/lib, then the loader's search path)", Use: ToolVar},
		{Name: "FPT_BIN", Meaning: "the bin/fpt fptrun starts the scheduler and servers with (default: the repository's)", Use: ToolVar},
		{Name: "FPT_NETEM_HOST", Meaning: "set by fpt netem: the host's index", Use: ToolVar},
		{Name: "FPT_NETEM_HOSTS", Meaning: "set by fpt netem: how many hosts", Use: ToolVar},
		{Name: "FPT_NETEM_ADDR", Meaning: "set by fpt netem: the host's address", Use: ToolVar},
		{Name: "FPT_NETEM_ROOT", Meaning: "set by fpt netem: host 0's address", Use: ToolVar},
		{Name: "FPT_NETEM_IFACE", Meaning: "set by fpt netem: the host's interface", Use: ToolVar},

		// Read by fpt's tests, which run nodes with them set. A harness's
		// own switches (a test's child process, a gated start) are named
		// FPTTEST_*, outside the families Unknown checks, and are not here.
		{Name: "FPT_TEST_LOG", Meaning: "tests: log the vans", Use: TestVar},
		{Name: "FPT_ADVERSARIAL", Meaning: "tests: 0 skips the adversarial suite", Use: TestVar},
		{Name: "FPT_SKIP_ROOT_TESTS", Meaning: "tests: skip the tests that need root", Use: TestVar},
		{Name: "FPT_NETEM_TEST_RUN", Meaning: "tests: marks a netem test's processes", Use: TestVar},
		{Name: "FPT_NETEM_TEST_HELPER", Meaning: "tests: the netem test helper's part", Use: TestVar},
		{Name: "FPT_NETEM_TEST_ADDR", Meaning: "tests: the netem test helper's address", Use: TestVar},
		{Name: "FPT_NETEM_TEST_BYTES", Meaning: "tests: bytes the netem test helper sends", Use: TestVar},
	}
}

// seconds prints a default duration the way its variable is written.
func seconds(d time.Duration) string {
	return strconv.FormatFloat(d.Seconds(), 'f', -1, 64)
}

// Names are the names of the known variables of the given uses, in
// Known's order.
func Names(uses ...Use) []string {
	var names []string
	for _, v := range Known() {
		for _, u := range uses {
			if v.Use == u {
				names = append(names, v.Name)
			}
		}
	}
	return names
}

// helpWidth is the width help text is wrapped to.
const helpWidth = 100

// WriteHelp writes the environment part of a binary's help: every node
// variable with its meaning and default, then the names of those fpt's
// tools set and of those it accepts from ps-lite launchers without using.
func WriteHelp(w io.Writer) error {
	var b strings.Builder
	b.WriteString("Environment (read when a node starts):\n")
	col := 0
	for _, name := range Names(NodeVar) {
		col = max(col, len(name))
	}
	col += 4
	for _, v := range Known() {
		if v.Use != NodeVar {
			continue
		}
		text := v.Meaning
		switch {
		case v.Required:
			text += " [required]"
		case v.Default != "":
			text += " [default: " + v.Default + "]"
		}
		for i, line := range wrap(text, helpWidth-col) {
			name := ""
			if i == 0 {
				name = v.Name
			}
			fmt.Fprintf(&b, "  %-*s%s\n", col-2, name, line)
		}
	}
	for _, l := range wrap("Set by fpt's tools for the processes they start: "+strings.Join(Names(ToolVar), ", ")+".", helpWidth) {
		b.WriteString(l + "\n")
	}
	for _, l := range wrap("Set by ps-lite launchers and dmlc-tracker, accepted and not used: "+strings.Join(Names(LauncherVar), ", ")+".", helpWidth) {
		b.WriteString(l + "\n")
	}
	b.WriteString("A node warns about any other FPT_*, PS_* or DMLC_* variable: a typo, most likely.\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// wrap breaks text into lines of at most width bytes at spaces (a longer
// word gets a line of its own).
func wrap(text string, width int) []string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(text) {
		switch {
		case line == "":
			line = word
		case len(line)+1+len(word) <= width:
			line += " " + word
		default:
			lines = append(lines, line)
			line = word
		}
	}
	return append(lines, line)
}

// rank reads a pinned rank from name, less offset (DMLC_TASK_ID counts
// the workers before the servers), and checks it against the cluster's
// size.
func (p *parser) rank(name string, offset int, c *Config) {
	v, ok := p.optional(name)
	if !ok {
		return
	}
	n, err := strconv.Atoi(v)
	want, what := c.NumWorkers, "DMLC_NUM_WORKER"
	if c.Role == node.Server {
		want, what = c.NumServers, "DMLC_NUM_SERVER"
	}
	switch {
	case err != nil:
		p.fail(name, v, "must be a whole number")
		return
	case want == 0:
		return // the size itself is wrong, and reported
	case n-offset < 0 || n-offset >= want:
		reason := fmt.Sprintf("%s rank %d is out of range: %s=%d gives ranks 0 to %d", c.Role, n-offset, what, want, want-1)
		if offset > 0 {
			reason = fmt.Sprintf("a server's task id is DMLC_NUM_WORKER (%d) plus its rank, here %d; %s=%d gives ranks 0 to %d", offset, n-offset, what, want, want-1)
		}
		p.fail(name, v, reason)
		return
	}
	c.Rank, c.RankVar = n-offset, name
}

// addr reads a listening address: host:port or :port, port 0 to 65535.
func (p *parser) addr(name string) string {
	v, ok := p.optional(name)
	if !ok {
		return ""
	}
	_, port, err := net.SplitHostPort(v)
	if n, perr := strconv.Atoi(port); err != nil || perr != nil || n < 0 || n > 65535 {
		p.fail(name, v, "must be host:port or :port, with a port from 0 to 65535")
	}
	return v
}
