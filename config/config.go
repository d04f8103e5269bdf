// Package config reads a node's launch settings from the environment, the
// way ps-lite and dmlc-tracker pass them (DMLC_*, PS_*), plus fpt's own FPT_*
// settings. It only parses and checks: every problem names the variable at
// fault, so that a mistyped launch script is a one-line fix. Known is the
// one list of the variables fpt knows (vars.go): FromEnv parses through
// it, help text is printed from it (WriteHelp), and Unknown names the
// variables of an environment it does not list, with the nearest known name.
package config

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/trace"
)

// Config is everything a node needs to join a cluster.
type Config struct {
	Role       node.Role // DMLC_ROLE
	RootURI    string    // DMLC_PS_ROOT_URI: the scheduler's host
	RootPort   int       // DMLC_PS_ROOT_PORT: the scheduler's control port
	NumServers int       // DMLC_NUM_SERVER
	NumWorkers int       // DMLC_NUM_WORKER

	// NodeHost is the address other nodes reach this one at
	// (DMLC_NODE_HOST; else the address of DMLC_INTERFACE; else the local
	// address that routes to the scheduler).
	NodeHost  string
	Interface string // DMLC_INTERFACE
	// HostID names the host the node runs on (FPT_HOST_ID); empty: its
	// NodeHost does. Workers of one host form a local group.
	HostID string
	// LocalAggregation is FPT_LOCAL_AGGREGATION.
	LocalAggregation LocalAggregation
	// LocalAggregationDir is FPT_LOCAL_AGGREGATION_DIR: where the groups'
	// shared-memory segments live.
	LocalAggregationDir string
	// NodePort is this node's control port (FPT_NODE_PORT; 0 picks a free
	// one). Its data port is always NodePort+1.
	NodePort int
	Verbose  int // PS_VERBOSE: 0 warnings, 1 progress, 2 debug

	Van               string        // FPT_VAN: epoll (default) or netconn
	HeartbeatInterval time.Duration // PS_HEARTBEAT_INTERVAL, seconds (default 1)
	HeartbeatTimeout  time.Duration // PS_HEARTBEAT_TIMEOUT, seconds (default 10)
	StartTimeout      time.Duration // FPT_START_TIMEOUT, seconds (default 300)
	PartitionBytes    uint64        // FPT_PARTITION_BYTES: largest tensor partition (default 1 MiB)
	MaxFrameBytes     uint64        // FPT_MAX_FRAME_BYTES: largest frame payload accepted (default 1 GiB)
	PoolBytes         int64         // FPT_POOL_BYTES: send pool limit (default 512 MiB)
	// Channels is FPT_CHANNELS: data connections per pair of nodes, 1 to
	// MaxChannels (van.Config.Channels); every node must have the same.
	Channels int
	// MetricsAddr is where the node serves Prometheus metrics
	// (FPT_METRICS_ADDR, "host:port", ":port" for every interface, port 0
	// for any free one); empty: no metrics served.
	MetricsAddr string
	// StatusAddr is where the scheduler serves its status page
	// (FPT_STATUS_ADDR, "host:port" as FPT_METRICS_ADDR; loopback only
	// without a secret or FPT_INSECURE); empty: no page. Other roles
	// ignore it.
	StatusAddr string
	// LB says whether the scheduler's load balancer runs (FPT_LB: on, the
	// default, or off: every tensor stays split evenly over the servers,
	// as in ps-lite).
	LB bool
	// LBProbeEvery makes the LB probe again after this many balanced
	// iterations (FPT_LB_PROBE_EVERY; 0, the default: only when the
	// measurements drift).
	LBProbeEvery uint64
	// LBAhead is how long, at the pace of the latest iterations, the LB
	// lets workers push ahead of the last iteration done (FPT_LB_AHEAD;
	// DefaultLBAhead): short iterations are granted more than 2 ahead,
	// so that no step waits for a grant's round trip through the
	// scheduler. Zero: 2 iterations, however short.
	LBAhead time.Duration
	// RetryServerLoss (FPT_ON_SERVER_LOSS=retry) makes a lost server cost
	// the job a retry of its incomplete iterations over the servers left,
	// instead of the job: workers keep each push's buffer until every
	// worker has that iteration's sum. Off (fail, the default), any node's
	// loss ends the job.
	RetryServerLoss bool
	// WorkerLoss (FPT_ON_WORKER_LOSS) is what a lost worker costs.
	WorkerLoss WorkerLoss
	// WorkerWaitTimeout is how long the job waits under
	// FPT_ON_WORKER_LOSS=wait for a worker to join after one was lost,
	// before it fails naming the lost one (FPT_WORKER_WAIT_TIMEOUT,
	// seconds; default 300). Other policies ignore it.
	WorkerWaitTimeout time.Duration
	// LeaveTimeout bounds a server's leave in order under
	// FPT_ON_SERVER_LOSS=retry (SIGTERM): handing its classic keys over
	// and the workers' last requests; past it the server fails, as a loss
	// (FPT_LEAVE_TIMEOUT, seconds; default 120). A launcher's grace
	// period (Kubernetes': 30 s) should exceed it.
	LeaveTimeout time.Duration

	// Secret is the job's shared secret (FPT_CLUSTER_SECRET, or the
	// contents of the file FPT_CLUSTER_SECRET_FILE names, surrounding
	// white space removed): every node of a job has the same one, and
	// both planes admit only peers that prove they know it. Empty: none.
	Secret string
	// Insecure (FPT_INSECURE=1) lets a node without a secret accept
	// connections from other hosts, as every node did before secrets;
	// without it, a node with no secret binds only loopback.
	Insecure bool
	// StallTimeout is how long the cluster waits for a worker that stopped
	// pushing while the others wait for it before failing it by name
	// (FPT_STALL_TIMEOUT, seconds; default 600; 0 turns it off).
	StallTimeout time.Duration
	// TraceFile is where a server or worker writes its communication
	// timeline (FPT_TRACE_FILE; "{role}" and "{rank}" are replaced by the
	// node's); empty: no tracing.
	TraceFile string
	// TraceIters is the iterations traced (FPT_TRACE_ITERS: "10-20", "10-",
	// "7"; default all).
	TraceIters trace.Window
	// CheckpointDir is where the servers checkpoint the classic store, a
	// set of files per key layout (FPT_CHECKPOINT_DIR); empty: no
	// checkpoints. CheckpointEvery is how often a server writes its file
	// if its store or the layout changed (FPT_CHECKPOINT_EVERY, seconds;
	// default 60); it also writes one at a clean end.
	CheckpointDir   string
	CheckpointEvery time.Duration

	// Rank is the rank this server or worker asks the scheduler for, and
	// RankVar the variable that set it (DMLC_WORKER_ID, DMLC_SERVER_ID or
	// DMLC_TASK_ID, as dmlc-tracker and BytePS launch nodes); RankVar
	// empty: the scheduler assigns one.
	Rank    int
	RankVar string
}

// Defaults for the optional settings.
const (
	DefaultHeartbeatInterval = time.Second
	DefaultHeartbeatTimeout  = 10 * time.Second
	DefaultLBAhead           = 100 * time.Millisecond
	DefaultStartTimeout      = 300 * time.Second
	DefaultPartitionBytes    = 1 << 20
	DefaultMaxFrameBytes     = 1 << 30
	DefaultPoolBytes         = 512 << 20
	// DefaultChannels and MaxChannels are van.DefaultChannels and
	// van.MaxChannels (config does not import the data plane).
	DefaultChannels          = 1
	MaxChannels              = 64
	DefaultStallTimeout      = 600 * time.Second
	DefaultWorkerWaitTimeout = 300 * time.Second
	DefaultLeaveTimeout      = 120 * time.Second
	DefaultCheckpointEvery   = 60 * time.Second
	// MinSecretBytes is the shortest secret accepted: 16 bytes of a random
	// one are 128 bits.
	MinSecretBytes = 16
)

// VarError is a problem with one environment variable.
type VarError struct {
	Var    string
	Value  string
	Reason string
}

func (e *VarError) Error() string {
	if e.Value == "" {
		return e.Var + ": " + e.Reason
	}
	return fmt.Sprintf("%s=%q: %s", e.Var, e.Value, e.Reason)
}

// FromEnv reads a Config through lookup (os.LookupEnv in production). It
// reports every bad or missing variable at once, joined; each is a *VarError.
// It reads the variables of Known, in its order, each through its own
// entry (so a later entry may check itself against an earlier one).
func FromEnv(lookup func(string) (string, bool)) (Config, error) {
	p := parser{lookup: lookup}
	var c Config
	for _, v := range Known() {
		if v.read != nil {
			v.read(&p, v.Name, &c)
		}
	}
	c.TraceFile, _ = p.optional("FPT_TRACE_FILE")
	c.TraceIters = trace.All
	if v, ok := p.optional("FPT_TRACE_ITERS"); ok {
		w, err := trace.ParseWindow(v)
		if err != nil {
			p.fail("FPT_TRACE_ITERS", v, trace.ErrWindow.Error())
		}
		c.TraceIters = w
	}
	return c, errors.Join(p.errs...)
}

type parser struct {
	lookup func(string) (string, bool)
	errs   []error
}

// hostPort reads an optional listening address, "host:port" or ":port"
// ("" when unset).
func (p *parser) fail(name, value, reason string) {
	p.errs = append(p.errs, &VarError{Var: name, Value: value, Reason: reason})
}

func (p *parser) raw(name string) string {
	v, _ := p.lookup(name)
	return v
}

func (p *parser) optional(name string) (string, bool) {
	v, ok := p.lookup(name)
	v = strings.TrimSpace(v)
	return v, ok && v != ""
}

// choice returns name's value, one of choices (the first when unset); any
// other value is an error naming them, and gives the first.
func (p *parser) choice(name string, choices ...string) string {
	v, ok := p.optional(name)
	switch {
	case !ok:
		return choices[0]
	case slices.Contains(choices, v):
		return v
	}
	p.fail(name, v, "must be "+strings.Join(choices[:len(choices)-1], ", ")+" or "+choices[len(choices)-1])
	return choices[0]
}

func (p *parser) required(name string) (string, bool) {
	v, ok := p.optional(name)
	if !ok {
		p.fail(name, "", "required but not set")
	}
	return v, ok
}

func (p *parser) positive(name string) int {
	v, ok := p.required(name)
	if !ok {
		return 0
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 1<<15 {
		p.fail(name, v, "must be an integer from 1 to 32768")
		return 0
	}
	return n
}

func (p *parser) port(name string, required bool) int {
	var v string
	var ok bool
	if required {
		v, ok = p.required(name)
	} else {
		v, ok = p.optional(name)
	}
	if !ok {
		return 0
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 65535 {
		p.fail(name, v, "must be a port number from 1 to 65535")
		return 0
	}
	return n
}

func (p *parser) integer(name string, def, lo, hi int64) int64 {
	v, ok := p.optional(name)
	if !ok {
		return def
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < lo || n > hi {
		p.fail(name, v, fmt.Sprintf("must be an integer from %d to %d", lo, hi))
		return def
	}
	return n
}

// seconds reads a duration in seconds: a finite number from a millisecond
// to a day. NaN, infinities, negative and tiny values are mistakes (a
// ticker of 0 would panic, NaN passes every comparison).
func (p *parser) seconds(name string, def time.Duration) time.Duration {
	v, ok := p.optional(name)
	if !ok {
		return def
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || f < 0.001 || f > 86400 {
		p.fail(name, v, "must be a number of seconds from 0.001 to 86400")
		return def
	}
	return time.Duration(f * float64(time.Second))
}

// flag reads a boolean: 1/true/on or 0/false/off.
func (p *parser) flag(name string) bool {
	v, ok := p.optional(name)
	if !ok {
		return false
	}
	switch strings.ToLower(v) {
	case "1", "true", "on", "yes":
		return true
	case "0", "false", "off", "no":
		return false
	}
	p.fail(name, v, "must be 1 or 0")
	return false
}

// maxSecretFileBytes bounds what is read of FPT_CLUSTER_SECRET_FILE: a
// secret is a few dozen bytes, and a path such as /dev/zero must not make
// the node read until it runs out of memory.
const maxSecretFileBytes = 4096

// secret reads the secret from the variable name or from the file the
// variable fileName names (one, not both). Both forms lose surrounding white
// space, and a secret of blanks is refused rather than taken for none
// (an empty variable is unset). The value itself never appears
// in an error.
func (p *parser) secret(name, fileName string) string {
	v, inline := p.optional(name)
	path, file := p.optional(fileName)
	if raw, _ := p.lookup(name); raw != "" && !inline {
		// Set to blanks: meant as a secret, not as none.
		inline = true
	}
	switch {
	case inline && file:
		p.fail(fileName, path, "set it or "+name+", not both")
		return ""
	case file:
		b, err := readSecretFile(path)
		if err != nil {
			p.fail(fileName, path, err.Error())
			return ""
		}
		v = strings.TrimSpace(string(b))
		if len(v) < MinSecretBytes {
			p.fail(fileName, path, fmt.Sprintf("holds %d bytes besides white space; a secret has at least %d", len(v), MinSecretBytes))
			return ""
		}
		return v
	case inline:
		v = strings.TrimSpace(v)
		if len(v) < MinSecretBytes {
			p.fail(name, "", fmt.Sprintf("is %d bytes besides white space; a secret has at least %d (e.g. openssl rand -hex 16)", len(v), MinSecretBytes))
			return ""
		}
		return v
	}
	return ""
}

// readSecretFile reads a regular file of at most maxSecretFileBytes. It
// opens without blocking, so a FIFO with no writer cannot hang the node,
// and refuses anything but a regular file before reading.
func readSecretFile(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("cannot be read: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("cannot be read: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("is not a regular file (%s)", st.Mode().Type())
	}
	b, err := io.ReadAll(io.LimitReader(f, maxSecretFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("cannot be read: %w", err)
	}
	if len(b) > maxSecretFileBytes {
		return nil, fmt.Errorf("holds more than %d bytes; a secret is a short line", maxSecretFileBytes)
	}
	return b, nil
}

// ResolveHost works out the address other nodes should use to reach this
// one: DMLC_NODE_HOST if set; else the first IPv4 address of DMLC_INTERFACE;
// else the local address the kernel would use to reach the scheduler (a UDP
// "dial" sends nothing, it only consults the routing table).
func (c *Config) ResolveHost() (string, error) {
	if c.NodeHost != "" {
		return c.NodeHost, nil
	}
	if c.Interface != "" {
		ifi, err := net.InterfaceByName(c.Interface)
		if err != nil {
			return "", &VarError{Var: "DMLC_INTERFACE", Value: c.Interface, Reason: err.Error()}
		}
		addrs, err := ifi.Addrs()
		if err != nil {
			return "", &VarError{Var: "DMLC_INTERFACE", Value: c.Interface, Reason: err.Error()}
		}
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
				return ipn.IP.String(), nil
			}
		}
		return "", &VarError{Var: "DMLC_INTERFACE", Value: c.Interface, Reason: "interface has no IPv4 address"}
	}
	conn, err := net.Dial("udp", net.JoinHostPort(c.RootURI, strconv.Itoa(c.RootPort)))
	if err != nil {
		return "", &VarError{Var: "DMLC_PS_ROOT_URI", Value: c.RootURI, Reason: "no route to the scheduler: " + err.Error()}
	}
	defer conn.Close()
	return conn.LocalAddr().(*net.UDPAddr).IP.String(), nil
}

// SchedulerEndpoint is the scheduler's ZeroMQ endpoint.
func (c *Config) SchedulerEndpoint() string {
	return "tcp://" + net.JoinHostPort(c.RootURI, strconv.Itoa(c.RootPort))
}

// WorkerLoss is what a lost worker costs the job (FPT_ON_WORKER_LOSS).
type WorkerLoss int

const (
	// WorkerLossFail ends the job, naming the worker (the default).
	WorkerLossFail WorkerLoss = iota
	// WorkerLossContinue goes on with the workers left: the iterations
	// some worker may not have every sum of are summed again over them,
	// and each iteration's sum says how many workers it adds up.
	WorkerLossContinue
	// WorkerLossWait is WorkerLossContinue, after which no further
	// iteration starts until a worker joins the job; the job fails,
	// naming the lost worker, if none has within WorkerWaitTimeout.
	WorkerLossWait
)

func (w WorkerLoss) String() string {
	switch w {
	case WorkerLossFail:
		return "fail"
	case WorkerLossContinue:
		return "continue"
	case WorkerLossWait:
		return "wait"
	}
	return fmt.Sprintf("WorkerLoss(%d)", int(w))
}

// Grants reports whether the scheduler's LB grants run: with the LB on,
// and with either loss policy that retries, since a retry rides on them
// (the LB then stays at the even split over the servers).
func (c *Config) Grants() bool {
	return c.LB || c.Retries()
}

// Retries reports whether a lost node may cost a retry rather than the
// job: workers then keep each push's buffer until every worker has its
// iteration's sum.
func (c *Config) Retries() bool {
	return c.RetryServerLoss || c.WorkerLoss != WorkerLossFail
}

// WorkersMayLeave reports whether a lost worker may leave the job rather
// than end it (FPT_ON_WORKER_LOSS=continue or wait): the iterations some
// worker may not have every sum of are then summed again over the workers
// left, so pulls too complete only once every worker has their sums.
func (c *Config) WorkersMayLeave() bool {
	return c.WorkerLoss == WorkerLossContinue || c.WorkerLoss == WorkerLossWait
}

// Survives reports whether the job may go on without node id: a server
// under FPT_ON_SERVER_LOSS=retry, a worker under
// FPT_ON_WORKER_LOSS=continue or wait. A frame lost with such a peer is
// sent again by the retry its loss brings, if it is lost.
func (c *Config) Survives(id node.ID) bool {
	r, ok := id.Role()
	switch {
	case !ok:
		return false
	case r == node.Server:
		return c.RetryServerLoss
	case r == node.Worker:
		return c.WorkersMayLeave()
	}
	return false
}
