package config

import (
	"errors"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/trace"
	"github.com/fptps/fpt/van"
)

func env(kv map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := kv[k]; return v, ok }
}

func base() map[string]string {
	return map[string]string{
		"DMLC_ROLE":         "worker",
		"DMLC_PS_ROOT_URI":  "127.0.0.1",
		"DMLC_PS_ROOT_PORT": "9000",
		"DMLC_NUM_SERVER":   "2",
		"DMLC_NUM_WORKER":   "3",
	}
}

func TestFromEnvDefaults(t *testing.T) {
	c, err := FromEnv(env(base()))
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		Role: node.Worker, RootURI: "127.0.0.1", RootPort: 9000, NumServers: 2, NumWorkers: 3,
		Van: "epoll", HeartbeatInterval: DefaultHeartbeatInterval, HeartbeatTimeout: DefaultHeartbeatTimeout,
		StartTimeout: DefaultStartTimeout, PartitionBytes: DefaultPartitionBytes,
		MaxFrameBytes: DefaultMaxFrameBytes, PoolBytes: DefaultPoolBytes, LB: true, LBAhead: DefaultLBAhead,
		Channels: DefaultChannels, StallTimeout: DefaultStallTimeout, TraceIters: trace.All, CheckpointEvery: DefaultCheckpointEvery,
		LocalAggregationDir: DefaultLocalAggregationDir,
		WorkerWaitTimeout:   DefaultWorkerWaitTimeout,
		LeaveTimeout:        DefaultLeaveTimeout,
	}
	if c != want {
		t.Fatalf("got %+v\nwant %+v", c, want)
	}
	if got := c.SchedulerEndpoint(); got != "tcp://127.0.0.1:9000" {
		t.Errorf("SchedulerEndpoint = %q", got)
	}
}

func TestFromEnvOptional(t *testing.T) {
	e := base()
	e["FPT_VAN"] = "netconn"
	e["PS_HEARTBEAT_INTERVAL"] = "0.5"
	e["PS_HEARTBEAT_TIMEOUT"] = "3"
	e["FPT_PARTITION_BYTES"] = "65536"
	e["DMLC_NODE_HOST"] = "198.18.0.2"
	e["FPT_NODE_PORT"] = "7000"
	e["PS_VERBOSE"] = "2"
	e["FPT_METRICS_ADDR"] = ":9100"
	e["FPT_STATUS_ADDR"] = "127.0.0.1:0"
	e["FPT_LB"] = "off"
	e["FPT_LB_PROBE_EVERY"] = "7"
	e["FPT_LB_AHEAD"] = "0"
	e["FPT_TRACE_FILE"] = "/tmp/{role}{rank}.json"
	e["FPT_TRACE_ITERS"] = "10-20"
	e["FPT_ON_WORKER_LOSS"] = "continue"
	e["FPT_CHANNELS"] = "4"
	c, err := FromEnv(env(e))
	if err != nil {
		t.Fatal(err)
	}
	if c.Van != "netconn" || c.MetricsAddr != ":9100" || c.StatusAddr != "127.0.0.1:0" || c.HeartbeatInterval != 500*time.Millisecond || c.HeartbeatTimeout != 3*time.Second ||
		c.PartitionBytes != 65536 || c.Channels != 4 || c.NodeHost != "198.18.0.2" || c.NodePort != 7000 || c.Verbose != 2 || c.LB || c.LBProbeEvery != 7 || c.LBAhead != 0 ||
		c.TraceFile != "/tmp/{role}{rank}.json" || c.TraceIters != (trace.Window{First: 10, Last: 20}) ||
		c.WorkerLoss != WorkerLossContinue || !c.Retries() || !c.Grants() || !c.Survives(node.WorkerID(3)) || c.Survives(node.ServerID(0)) {
		t.Fatalf("unexpected %+v", c)
	}
	if h, err := c.ResolveHost(); err != nil || h != "198.18.0.2" {
		t.Errorf("ResolveHost = %q, %v", h, err)
	}
}

// TestWorkerLoss: what each FPT_ON_WORKER_LOSS means to the code that
// asks. wait is continue as far as a lost worker goes (the scheduler then
// holds the grants), so every test of continue holds for it.
func TestWorkerLoss(t *testing.T) {
	cases := []struct {
		value, timeout        string
		loss                  WorkerLoss
		wait                  time.Duration
		mayLeave, retries, lb bool // WorkersMayLeave, Retries, Grants with FPT_LB=off
	}{
		{"", "", WorkerLossFail, DefaultWorkerWaitTimeout, false, false, false},
		{"fail", "", WorkerLossFail, DefaultWorkerWaitTimeout, false, false, false},
		{"continue", "", WorkerLossContinue, DefaultWorkerWaitTimeout, true, true, true},
		{"wait", "", WorkerLossWait, DefaultWorkerWaitTimeout, true, true, true},
		{"wait", "0.05", WorkerLossWait, 50 * time.Millisecond, true, true, true},
		{" wait ", "600", WorkerLossWait, 600 * time.Second, true, true, true},
	}
	for _, tc := range cases {
		t.Run(tc.value+"/"+tc.timeout, func(t *testing.T) {
			e := base()
			e["FPT_LB"] = "off"
			if tc.value != "" {
				e["FPT_ON_WORKER_LOSS"] = tc.value
			}
			if tc.timeout != "" {
				e["FPT_WORKER_WAIT_TIMEOUT"] = tc.timeout
			}
			c, err := FromEnv(env(e))
			if err != nil {
				t.Fatal(err)
			}
			if c.WorkerLoss != tc.loss || c.WorkerWaitTimeout != tc.wait || c.WorkersMayLeave() != tc.mayLeave || c.Retries() != tc.retries ||
				c.Grants() != tc.lb || c.Survives(node.WorkerID(2)) != tc.mayLeave || c.Survives(node.ServerID(0)) || c.Survives(node.SchedulerID) {
				t.Fatalf("%+v: loss %v, wait %s, may leave %v, retries %v, grants %v, survives a worker %v",
					c, c.WorkerLoss, c.WorkerWaitTimeout, c.WorkersMayLeave(), c.Retries(), c.Grants(), c.Survives(node.WorkerID(2)))
			}
			if got := c.WorkerLoss.String(); got != strings.TrimSpace(tc.value) && tc.value != "" {
				t.Errorf("String() = %q, want %q", got, tc.value)
			}
		})
	}
}

func TestFromEnvErrorsNameTheVariable(t *testing.T) {
	tests := []struct {
		name  string
		edit  func(map[string]string)
		wants []string
	}{
		{"missing role", func(e map[string]string) { delete(e, "DMLC_ROLE") }, []string{"DMLC_ROLE"}},
		{"bad role", func(e map[string]string) { e["DMLC_ROLE"] = "boss" }, []string{"DMLC_ROLE"}},
		{"missing uri", func(e map[string]string) { e["DMLC_PS_ROOT_URI"] = "  " }, []string{"DMLC_PS_ROOT_URI"}},
		{"bad port", func(e map[string]string) { e["DMLC_PS_ROOT_PORT"] = "70000" }, []string{"DMLC_PS_ROOT_PORT"}},
		{"zero servers", func(e map[string]string) { e["DMLC_NUM_SERVER"] = "0" }, []string{"DMLC_NUM_SERVER"}},
		{"word workers", func(e map[string]string) { e["DMLC_NUM_WORKER"] = "two" }, []string{"DMLC_NUM_WORKER"}},
		{"several", func(e map[string]string) { delete(e, "DMLC_NUM_WORKER"); e["FPT_VAN"] = "rdma" }, []string{"DMLC_NUM_WORKER", "FPT_VAN"}},
		{"timeout below interval", func(e map[string]string) { e["PS_HEARTBEAT_INTERVAL"] = "5"; e["PS_HEARTBEAT_TIMEOUT"] = "2" }, []string{"PS_HEARTBEAT_TIMEOUT"}},
		{"no channels", func(e map[string]string) { e["FPT_CHANNELS"] = "0" }, []string{"FPT_CHANNELS"}},
		{"negative channels", func(e map[string]string) { e["FPT_CHANNELS"] = "-2" }, []string{"FPT_CHANNELS"}},
		{"absurd channels", func(e map[string]string) { e["FPT_CHANNELS"] = "1000" }, []string{"FPT_CHANNELS"}},
		{"channels not a number", func(e map[string]string) { e["FPT_CHANNELS"] = "four" }, []string{"FPT_CHANNELS"}},
		{"partition above frame", func(e map[string]string) { e["FPT_PARTITION_BYTES"] = "4096"; e["FPT_MAX_FRAME_BYTES"] = "2048" }, []string{"FPT_PARTITION_BYTES"}},
		{"verbose", func(e map[string]string) { e["PS_VERBOSE"] = "9" }, []string{"PS_VERBOSE"}},
		{"metrics without port", func(e map[string]string) { e["FPT_METRICS_ADDR"] = "localhost" }, []string{"FPT_METRICS_ADDR"}},
		{"metrics bad port", func(e map[string]string) { e["FPT_METRICS_ADDR"] = ":99999" }, []string{"FPT_METRICS_ADDR"}},
		{"status without port", func(e map[string]string) { e["FPT_STATUS_ADDR"] = "localhost" }, []string{"FPT_STATUS_ADDR"}},
		{"lb word", func(e map[string]string) { e["FPT_LB"] = "maybe" }, []string{"FPT_LB"}},
		{"lb probe negative", func(e map[string]string) { e["FPT_LB_PROBE_EVERY"] = "-1" }, []string{"FPT_LB_PROBE_EVERY"}},
		{"metrics word port", func(e map[string]string) { e["FPT_METRICS_ADDR"] = "0.0.0.0:http" }, []string{"FPT_METRICS_ADDR"}},
		{"status without port", func(e map[string]string) { e["FPT_STATUS_ADDR"] = "localhost" }, []string{"FPT_STATUS_ADDR"}},
		{"interval NaN", func(e map[string]string) { e["PS_HEARTBEAT_INTERVAL"] = "NaN" }, []string{"PS_HEARTBEAT_INTERVAL"}},
		{"interval tiny", func(e map[string]string) { e["PS_HEARTBEAT_INTERVAL"] = "1e-10" }, []string{"PS_HEARTBEAT_INTERVAL"}},
		{"timeout infinite", func(e map[string]string) { e["PS_HEARTBEAT_TIMEOUT"] = "+Inf" }, []string{"PS_HEARTBEAT_TIMEOUT"}},
		{"start timeout negative", func(e map[string]string) { e["FPT_START_TIMEOUT"] = "-5" }, []string{"FPT_START_TIMEOUT"}},
		{"stall timeout NaN", func(e map[string]string) { e["FPT_STALL_TIMEOUT"] = "nan" }, []string{"FPT_STALL_TIMEOUT"}},
		{"checkpoint every zero", func(e map[string]string) { e["FPT_CHECKPOINT_EVERY"] = "0" }, []string{"FPT_CHECKPOINT_EVERY"}},
		{"secret short", func(e map[string]string) { e["FPT_CLUSTER_SECRET"] = "hunter2" }, []string{"FPT_CLUSTER_SECRET"}},
		{"secret twice", func(e map[string]string) {
			e["FPT_CLUSTER_SECRET"] = "0123456789abcdef0123"
			e["FPT_CLUSTER_SECRET_FILE"] = "/dev/null"
		}, []string{"FPT_CLUSTER_SECRET_FILE"}},
		{"secret file missing", func(e map[string]string) { e["FPT_CLUSTER_SECRET_FILE"] = "/no/such/secret" }, []string{"FPT_CLUSTER_SECRET_FILE"}},
		{"insecure word", func(e map[string]string) { e["FPT_INSECURE"] = "please" }, []string{"FPT_INSECURE"}},
		{"worker loss word", func(e map[string]string) { e["FPT_ON_WORKER_LOSS"] = "hold" }, []string{"FPT_ON_WORKER_LOSS", "fail, continue or wait"}},
		{"worker wait zero", func(e map[string]string) { e["FPT_WORKER_WAIT_TIMEOUT"] = "0" }, []string{"FPT_WORKER_WAIT_TIMEOUT"}},
		{"worker wait negative", func(e map[string]string) { e["FPT_WORKER_WAIT_TIMEOUT"] = "-300" }, []string{"FPT_WORKER_WAIT_TIMEOUT"}},
		{"worker wait with a unit", func(e map[string]string) { e["FPT_WORKER_WAIT_TIMEOUT"] = "5m" }, []string{"FPT_WORKER_WAIT_TIMEOUT", "seconds"}},
		{"bad trace window", func(e map[string]string) { e["FPT_TRACE_ITERS"] = "20-10" }, []string{"FPT_TRACE_ITERS", "A ≤ B"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := base()
			tt.edit(e)
			_, err := FromEnv(env(e))
			if err == nil {
				t.Fatal("no error")
			}
			var ve *VarError
			if !errors.As(err, &ve) {
				t.Fatalf("error %v is not a *VarError", err)
			}
			for _, w := range tt.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %s", err, w)
				}
			}
		})
	}
}

func TestFromEnvSecurity(t *testing.T) {
	file := t.TempDir() + "/secret"
	if err := os.WriteFile(file, []byte("  fedcba9876543210fedcba98\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name         string
		env          map[string]string
		secret       string
		insecure     bool
		stallTimeout time.Duration
	}{
		{"none", nil, "", false, DefaultStallTimeout},
		{"inline", map[string]string{"FPT_CLUSTER_SECRET": "0123456789abcdef"}, "0123456789abcdef", false, DefaultStallTimeout},
		{"file, trimmed", map[string]string{"FPT_CLUSTER_SECRET_FILE": file}, "fedcba9876543210fedcba98", false, DefaultStallTimeout},
		{"insecure", map[string]string{"FPT_INSECURE": "1"}, "", true, DefaultStallTimeout},
		{"stall off", map[string]string{"FPT_STALL_TIMEOUT": "0"}, "", false, 0},
		{"stall 90", map[string]string{"FPT_STALL_TIMEOUT": "90"}, "", false, 90 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := base()
			for k, v := range tt.env {
				e[k] = v
			}
			c, err := FromEnv(env(e))
			if err != nil {
				t.Fatal(err)
			}
			if c.Secret != tt.secret || c.Insecure != tt.insecure || c.StallTimeout != tt.stallTimeout {
				t.Errorf("secret %q, insecure %v, stall %s; want %q, %v, %s", c.Secret, c.Insecure, c.StallTimeout, tt.secret, tt.insecure, tt.stallTimeout)
			}
		})
	}
	// A secret never appears in an error message.
	e := base()
	e["FPT_CLUSTER_SECRET"] = "tooshort"
	if _, err := FromEnv(env(e)); err == nil || strings.Contains(err.Error(), "tooshort") {
		t.Errorf("error %v: want one that does not repeat the secret", err)
	}
}

// TestSecretRefused: a secret file that is not a short regular file, or a
// secret of white space in either form, is refused naming the variable,
// without hanging on a FIFO or reading /dev/zero without end.
func TestSecretRefused(t *testing.T) {
	dir := t.TempDir()
	fifo := dir + "/fifo"
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	blank := dir + "/blank"
	big := dir + "/big"
	if err := os.WriteFile(blank, []byte(strings.Repeat(" ", 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(big, []byte(strings.Repeat("s", maxSecretFileBytes+1)), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, variable, value, want string
	}{
		{"fifo", "FPT_CLUSTER_SECRET_FILE", fifo, "not a regular file"},
		{"dev zero", "FPT_CLUSTER_SECRET_FILE", "/dev/zero", "not a regular file"},
		{"directory", "FPT_CLUSTER_SECRET_FILE", dir, "not a regular file"},
		{"too big", "FPT_CLUSTER_SECRET_FILE", big, "more than"},
		{"blank file", "FPT_CLUSTER_SECRET_FILE", blank, "0 bytes"},
		{"blank inline", "FPT_CLUSTER_SECRET", strings.Repeat(" ", 16), "0 bytes"},
		{"padded short inline", "FPT_CLUSTER_SECRET", "  short-secret \t\n", "12 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := base()
			e[tt.variable] = tt.value
			done := make(chan error, 1)
			go func() { _, err := FromEnv(env(e)); done <- err }()
			var err error
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("FromEnv still reading the secret after 10 s")
			}
			if err == nil || !strings.Contains(err.Error(), tt.variable) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v: want one naming %s and saying %q", err, tt.variable, tt.want)
			}
		})
	}
	// The two forms agree: padding is dropped from either.
	e := base()
	e["FPT_CLUSTER_SECRET"] = " 0123456789abcdef\n"
	if c, err := FromEnv(env(e)); err != nil || c.Secret != "0123456789abcdef" {
		t.Fatalf("padded inline secret: %q, %v; want it trimmed", c.Secret, err)
	}
}

func TestResolveHostLoopback(t *testing.T) {
	c, err := FromEnv(env(base()))
	if err != nil {
		t.Fatal(err)
	}
	h, err := c.ResolveHost()
	if err != nil || h != "127.0.0.1" {
		t.Fatalf("ResolveHost = %q, %v; want 127.0.0.1", h, err)
	}
	c.Interface = "no-such-if0"
	if _, err := c.ResolveHost(); err == nil || !strings.Contains(err.Error(), "DMLC_INTERFACE") {
		t.Fatalf("bad interface error = %v", err)
	}
}

func TestUnknown(t *testing.T) {
	tests := []struct {
		name    string
		environ []string
		want    []string
	}{
		{"none", []string{"PATH=/bin", "HOME=/root"}, nil},
		{"known", []string{"FPT_PARTITION_BYTES=1", "DMLC_ROLE=worker", "PS_VERBOSE=1", "FPT_NETEM_HOST=0"}, nil},
		{"launcher's", []string{"DMLC_TASK_ID=0", "DMLC_JOB_CLUSTER=local", "DMLC_NUM_ATTEMPT=0", "DMLC_PS_VAN_TYPE=zmq", "PS_RESEND=1"}, nil},
		{"typo", []string{"FPT_PARTITON_BYTES=1"}, []string{"unknown variable FPT_PARTITON_BYTES; did you mean FPT_PARTITION_BYTES?"}},
		{"swapped letters", []string{"DMLC_NUM_WROKER=2"}, []string{"unknown variable DMLC_NUM_WROKER; did you mean DMLC_NUM_WORKER?"}},
		{"plural", []string{"DMLC_NUM_SERVERS=2"}, []string{"unknown variable DMLC_NUM_SERVERS; did you mean DMLC_NUM_SERVER?"}},
		{"ps prefix", []string{"PS_VERBOS=1"}, []string{"unknown variable PS_VERBOS; did you mean PS_VERBOSE?"}},
		{"nothing near", []string{"FPT_COMPLETELY_DIFFERENT=1"}, []string{"unknown variable FPT_COMPLETELY_DIFFERENT"}},
		{"empty value, sorted, once", []string{"FPT_VANN=", "FPT_LBB=on", "FPT_VANN="}, []string{
			"unknown variable FPT_LBB; did you mean FPT_LB?", "unknown variable FPT_VANN; did you mean FPT_VAN?"}},
		{"other families", []string{"BYTEPS_LOCAL_RANK=0", "FPTX=1", "XPS_VERBOSE=1", "fpt_van=epoll"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Unknown(tt.environ); !slices.Equal(got, tt.want) {
				t.Errorf("Unknown(%q) = %q, want %q", tt.environ, got, tt.want)
			}
		})
	}
}

func TestDistance(t *testing.T) {
	tests := []struct {
		a, b string
		want int
	}{
		{"", "", 0},
		{"", "abc", 3},
		{"abc", "", 3},
		{"kitten", "sitting", 3},
		{"FPT_VAN", "FPT_VAN", 0},
		{"FPT_PARTITON_BYTES", "FPT_PARTITION_BYTES", 1},
		{"WROKER", "WORKER", 2},
	}
	for _, tt := range tests {
		if got := distance(tt.a, tt.b); got != tt.want {
			t.Errorf("distance(%q, %q) = %d, want %d", tt.a, tt.b, got, tt.want)
		}
		if got := distance(tt.b, tt.a); got != tt.want {
			t.Errorf("distance(%q, %q) = %d, want %d", tt.b, tt.a, got, tt.want)
		}
	}
}

// The list is one: names unique, in their families, node variables
// documented, and every node variable FromEnv reads is in it.
func TestKnown(t *testing.T) {
	seen := map[string]bool{}
	for _, v := range Known() {
		if seen[v.Name] {
			t.Errorf("%s listed twice", v.Name)
		}
		seen[v.Name] = true
		if !hasPrefix(v.Name) || v.Meaning == "" || v.Use == 0 {
			t.Errorf("%+v: want an FPT_, PS_ or DMLC_ name, a meaning and a use", v)
		}
		if v.read != nil && v.Use != NodeVar {
			t.Errorf("%s is read by FromEnv but not a node variable", v.Name)
		}
	}
	// Every variable FromEnv looks up is listed as a node variable.
	nodeVars := Names(NodeVar)
	e := base()
	_, err := FromEnv(func(k string) (string, bool) {
		if !slices.Contains(nodeVars, k) {
			t.Errorf("FromEnv reads %s, which Known does not list as a node variable", k)
		}
		v, ok := e[k]
		return v, ok
	})
	if err != nil {
		t.Fatal(err)
	}
	var help strings.Builder
	if err := WriteHelp(&help); err != nil {
		t.Fatal(err)
	}
	for _, v := range Known() {
		if v.Use != TestVar && !strings.Contains(help.String(), v.Name) {
			t.Errorf("help does not name %s:\n%s", v.Name, help.String())
		}
	}
}

func TestFromEnvRank(t *testing.T) {
	tests := []struct {
		name    string
		role    string
		env     map[string]string
		rank    int
		rankVar string
		errVar  string
	}{
		{"none", "worker", nil, 0, "", ""},
		{"worker task id", "worker", map[string]string{"DMLC_TASK_ID": "2"}, 2, "DMLC_TASK_ID", ""},
		{"server task id counts workers first", "server", map[string]string{"DMLC_TASK_ID": "4"}, 1, "DMLC_TASK_ID", ""},
		{"worker id over task id", "worker", map[string]string{"DMLC_TASK_ID": "7", "DMLC_WORKER_ID": "1"}, 1, "DMLC_WORKER_ID", ""},
		{"server id over task id", "server", map[string]string{"DMLC_TASK_ID": "0", "DMLC_SERVER_ID": "1"}, 1, "DMLC_SERVER_ID", ""},
		// Kubernetes sets DMLC_SERVER_ID=0 on workers too.
		{"worker ignores server id", "worker", map[string]string{"DMLC_SERVER_ID": "0", "DMLC_WORKER_ID": "2"}, 2, "DMLC_WORKER_ID", ""},
		{"server ignores worker id", "server", map[string]string{"DMLC_WORKER_ID": "9"}, 0, "", ""},
		{"scheduler ignores all", "scheduler", map[string]string{"DMLC_TASK_ID": "99", "DMLC_WORKER_ID": "x"}, 0, "", ""},
		{"worker id too big", "worker", map[string]string{"DMLC_WORKER_ID": "3"}, 0, "", "DMLC_WORKER_ID"},
		{"worker id negative", "worker", map[string]string{"DMLC_WORKER_ID": "-1"}, 0, "", "DMLC_WORKER_ID"},
		{"server task id below the workers", "server", map[string]string{"DMLC_TASK_ID": "1"}, 0, "", "DMLC_TASK_ID"},
		{"server task id too big", "server", map[string]string{"DMLC_TASK_ID": "5"}, 0, "", "DMLC_TASK_ID"},
		{"word", "worker", map[string]string{"DMLC_TASK_ID": "one"}, 0, "", "DMLC_TASK_ID"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := base() // 2 servers, 3 workers
			e["DMLC_ROLE"] = tt.role
			for k, v := range tt.env {
				e[k] = v
			}
			c, err := FromEnv(env(e))
			if tt.errVar != "" {
				if err == nil || !strings.Contains(err.Error(), tt.errVar) {
					t.Fatalf("error %v, want one naming %s", err, tt.errVar)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Rank != tt.rank || c.RankVar != tt.rankVar {
				t.Errorf("rank %d from %q, want %d from %q", c.Rank, c.RankVar, tt.rank, tt.rankVar)
			}
		})
	}
}

// config mirrors the data plane's bounds on FPT_CHANNELS rather than
// importing it; the two must agree.
func TestChannelsBoundsMatchVan(t *testing.T) {
	if DefaultChannels != van.DefaultChannels || MaxChannels != van.MaxChannels {
		t.Fatalf("config's channels %d (max %d), van's %d (max %d)", DefaultChannels, MaxChannels, van.DefaultChannels, van.MaxChannels)
	}
}
