package cluster

import (
	"encoding/binary"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/classic"
	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/control"
	"github.com/fptps/fpt/localagg"
	"github.com/fptps/fpt/node"
)

// The member's core, fed sequences of control messages, heartbeat ticks,
// calls and lost peers at chosen times, without a cluster or a clock.

var t0 = time.Unix(1000, 0)

const (
	hbTimeout = time.Second
	schedConn = "sched" // the scheduler's connection (Origin)
)

// me is the core's node: worker 0 of two servers and two workers.
var me = node.WorkerID(0)

func testConfig() config.Config {
	return config.Config{Role: node.Worker, RootURI: "10.0.0.9", RootPort: 9000, NumServers: 2, NumWorkers: 2,
		HeartbeatInterval: 100 * time.Millisecond, HeartbeatTimeout: hbTimeout}
}

func infoOf(id node.ID) node.Info {
	r, _ := id.Role()
	return node.Info{ID: id, Role: r, Host: "10.0.0.1", ControlPort: 7000 + 2*int(id), DataPort: 7001 + 2*int(id)}
}

// nodeTable is the scheduler's table for a job of the given servers and
// workers, sent to recipient; a joining one (FlagJoin) carries the next
// barrier numbers next and layout l.
func nodeTable(recipient node.ID, servers, workers int, join bool, next uint64, l classic.Layout) *control.Message {
	m := &control.Message{Command: control.NodeTable, Sender: node.SchedulerID, Recipient: recipient, Origin: schedConn,
		Body: binary.LittleEndian.AppendUint64(nil, 42)}
	for i := range servers {
		m.Nodes = append(m.Nodes, infoOf(node.ServerID(i)))
	}
	for i := range workers {
		m.Nodes = append(m.Nodes, infoOf(node.WorkerID(i)))
	}
	if join {
		m.Flags |= control.FlagJoin
		for range node.AllGroup {
			m.Body = binary.LittleEndian.AppendUint64(m.Body, next)
		}
		m.Body = l.AppendBinary(m.Body)
	}
	return m
}

// sched is a message from the scheduler's connection.
func sched(m control.Message) *control.Message {
	m.Sender, m.Origin = node.SchedulerID, schedConn
	return &m
}

func layoutMsg(l classic.Layout) *control.Message {
	return sched(control.Message{Command: control.Layout, Body: l.AppendBinary(nil)})
}

// ev is one input to the core, at t0+at. Exactly one of the others is
// set; none is a heartbeat tick.
type ev struct {
	at       time.Duration
	msg      *control.Message
	progress uint64 // a tick's
	barrier  node.Group
	final    bool    // the barrier is the final one (FlagFinal)
	lost     node.ID // the data plane lost this peer
	grace    bool    // the latest lost peer's grace ends
	fail     string
}

// sent is a message to the scheduler, as far as the cases tell them apart.
type sent struct {
	cmd    control.Command
	target node.ID
	seq    uint64
}

// outcome is what the cases assert of a ready.
type outcome struct {
	send       []sent
	fail       string // in the failure; "" none
	release    []barrierKey
	terminated bool
	departed   bool
	role       []control.Command
	left       *departure
	dial       node.ID
	grace      node.ID
	rejects    []string
	table      bool
	startErr   string // in the start's error; "" none
}

func outcomeOf(t *testing.T, r ready) outcome {
	t.Helper()
	var o outcome
	for _, m := range r.send {
		o.send = append(o.send, sent{m.Command, m.Target, m.Seq})
	}
	if r.fail != nil {
		o.fail = r.fail.Error()
	}
	o.release, o.terminated, o.departed, o.left, o.table = r.release, r.terminated, r.departed, r.left, r.table
	for _, m := range r.role {
		o.role = append(o.role, m.Command)
	}
	if r.dial != nil {
		o.dial = r.dial.ID
	}
	if r.grace != nil {
		o.grace = r.grace.id
	}
	for _, rj := range r.rejects {
		o.rejects = append(o.rejects, rj.msg)
	}
	if r.startErr != nil {
		o.startErr = r.startErr.Error()
	}
	return o
}

// feed gives c the events in order and returns the last one's ready.
func feed(t *testing.T, c *core, evs []ev) ready {
	t.Helper()
	var r ready
	var lost *lostPeer
	for _, e := range evs {
		now := t0.Add(e.at)
		switch {
		case e.msg != nil:
			r = c.step(e.msg, now)
		case e.barrier != 0:
			var flags uint8
			if e.final {
				flags = control.FlagFinal
			}
			m, err := c.barrier(e.barrier, flags)
			if err != nil {
				t.Fatalf("barrier over %d: %v", e.barrier, err)
			}
			r = ready{send: []*control.Message{m}}
		case e.lost != 0:
			r = c.peerLost(e.lost, errors.New("connection reset"))
		case e.grace:
			r = c.graceOver(*lost)
		case e.fail != "":
			r = c.fail(errors.New(e.fail), 0)
		default:
			r = c.tick(now, e.progress)
		}
		if r.grace != nil {
			lost = r.grace
		}
		for _, m := range r.send {
			if m.Sender != c.self().ID {
				t.Errorf("%s sent as %s, want %s", m.Command, m.Sender, c.self().ID)
			}
		}
	}
	return r
}

// registered is a core that took the node table and began its heartbeats
// at t0.
func registered(t *testing.T) *core {
	t.Helper()
	c := newCore(testConfig())
	c.bound(node.Info{Role: node.Worker, Host: "10.0.0.1", ControlPort: infoOf(me).ControlPort, DataPort: infoOf(me).DataPort})
	if r := c.step(nodeTable(me, 2, 2, false, 0, classic.Layout{}), t0); !r.table || r.startErr != nil {
		t.Fatalf("node table not taken: %v", r.startErr)
	}
	c.begin(t0)
	return c
}

func TestCoreMembership(t *testing.T) {
	ms := time.Millisecond
	s0, s1, w1 := node.ServerID(0), node.ServerID(1), node.WorkerID(1)
	beat := func(progress uint64) sent { return sent{control.Heartbeat, 0, progress} }
	ack := sched(control.Message{Command: control.HeartbeatAck})
	tests := []struct {
		name   string
		events []ev
		want   outcome
		check  func(t *testing.T, c *core)
	}{
		// Heartbeats.
		{"a tick sends a heartbeat with the progress", []ev{{at: 100 * ms, progress: 7}},
			outcome{send: []sent{beat(7)}}, nil},
		{"answered heartbeats keep the node alive", []ev{
			{at: 100 * ms}, {at: 600 * ms, msg: ack}, {at: 700 * ms}, {at: 800 * ms}, {at: 900 * ms},
			{at: 1000 * ms}, {at: 1100 * ms}, {at: 1200 * ms}, {at: 1300 * ms}, {at: 1400 * ms}, {at: 1500 * ms}, {at: 1600 * ms, progress: 3},
		}, outcome{send: []sent{beat(3)}}, nil},
		{"silence up to the timeout is no failure", []ev{
			{at: 200 * ms}, {at: 400 * ms}, {at: 600 * ms}, {at: 800 * ms}, {at: 1000 * ms},
		}, outcome{send: []sent{beat(0)}}, nil},
		{"no answer past the timeout: the scheduler is unreachable", []ev{
			{at: 200 * ms}, {at: 400 * ms}, {at: 600 * ms}, {at: 800 * ms}, {at: 1000 * ms}, {at: 1200 * ms},
		}, outcome{send: []sent{beat(0), {control.NodeFailed, node.SchedulerID, 0}},
			fail: "scheduler at tcp://10.0.0.9:9000 unreachable: no heartbeat answer for 1.2s"}, nil},
		{"an unreachable scheduler fails the node once; heartbeats go on", []ev{
			{at: 600 * ms}, {at: 1200 * ms}, {at: 1800 * ms},
		}, outcome{send: []sent{beat(0)}}, nil},
		{"an ack from a stranger's connection does not count", []ev{
			{at: 600 * ms}, {at: 900 * ms, msg: &control.Message{Command: control.HeartbeatAck, Sender: node.SchedulerID, Origin: "other"}},
			{at: 1200 * ms},
		}, outcome{send: []sent{beat(0), {control.NodeFailed, node.SchedulerID, 0}}, fail: "unreachable"}, nil},
		{"a tick gap past the timeout: this node was stopped, and is the culprit", []ev{
			{at: 100 * ms}, {at: 1200 * ms},
		}, outcome{send: []sent{{control.NodeFailed, me, 0}},
			fail: "this node (worker0(9)@10.0.0.1:7018) was stopped or starved for 1.1s"}, nil},
		{"a gap of exactly the timeout is not", []ev{{at: 100 * ms}, {at: 900 * ms, msg: ack}, {at: 1100 * ms}},
			outcome{send: []sent{beat(0)}}, nil},
		{"a stopped node sends no more heartbeats", []ev{{at: 2 * time.Second}, {at: 2100 * ms}},
			outcome{}, nil},
		{"no heartbeats after Terminate", []ev{{at: 100 * ms, msg: sched(control.Message{Command: control.Terminate})}, {at: 5 * time.Second}},
			outcome{}, nil},

		// Barriers.
		{"a barrier's release", []ev{{barrier: node.AllGroup}, {msg: sched(control.Message{Command: control.BarrierDone, Group: node.AllGroup, Seq: 0})}},
			outcome{release: []barrierKey{{node.AllGroup, 0}}}, nil},
		{"barriers count per group", []ev{{barrier: node.AllGroup}, {barrier: node.WorkerGroup}, {barrier: node.AllGroup}},
			outcome{send: []sent{{control.Barrier, 0, 1}}}, nil},
		{"a release nobody waits for", []ev{{barrier: node.AllGroup}, {msg: sched(control.Message{Command: control.BarrierDone, Group: node.AllGroup, Seq: 1})}},
			outcome{}, nil},
		{"a release is delivered once", []ev{{barrier: node.AllGroup}, {msg: sched(control.Message{Command: control.BarrierDone, Group: node.AllGroup, Seq: 0})},
			{msg: sched(control.Message{Command: control.BarrierDone, Group: node.AllGroup, Seq: 0})}},
			outcome{}, nil},
		{"a forged release, from another connection", []ev{{barrier: node.AllGroup},
			{msg: &control.Message{Command: control.BarrierDone, Sender: node.SchedulerID, Origin: "other", Group: node.AllGroup}}},
			outcome{rejects: []string{"sender"}}, nil},
		{"a forged release, from a member over the scheduler's connection", []ev{{barrier: node.AllGroup},
			{msg: &control.Message{Command: control.BarrierDone, Sender: w1, Origin: schedConn, Group: node.AllGroup}}},
			outcome{rejects: []string{"sender"}}, nil},

		// Failure and shut-down.
		{"the scheduler's notice names the dead node", []ev{{msg: sched(control.Message{Command: control.NodeFailed, Target: s1, Text: "no heartbeat"})}},
			outcome{send: []sent{{control.NodeFailed, s1, 0}}, fail: "cluster: server1(10)@10.0.0.1:7020 failed: no heartbeat"}, nil},
		{"the first failure wins", []ev{{fail: "the role gave up"}, {msg: sched(control.Message{Command: control.NodeFailed, Target: s1, Text: "x"})}},
			outcome{}, func(t *testing.T, c *core) {
				if c.err.Error() != "the role gave up" || !c.abortVan() {
					t.Errorf("failure %v, abortVan %v; want the first, and true", c.err, c.abortVan())
				}
			}},
		{"a node's own failure names it", []ev{{fail: "disk full"}},
			outcome{send: []sent{{control.NodeFailed, me, 0}}, fail: "disk full"}, func(t *testing.T, c *core) {
				if !c.abortVan() {
					t.Error("a failed node drains its data plane; want it aborted")
				}
			}},
		{"a live node drains its data plane", nil, outcome{}, func(t *testing.T, c *core) {
			if c.abortVan() {
				t.Error("a live node aborts its data plane; want it drained")
			}
		}},
		{"Terminate is confirmed, and ends the node's barriers", []ev{{msg: sched(control.Message{Command: control.Terminate})}},
			outcome{send: []sent{{control.Terminate, 0, 0}}, terminated: true}, nil},
		{"a second Terminate is confirmed only", []ev{{msg: sched(control.Message{Command: control.Terminate})}, {msg: sched(control.Message{Command: control.Terminate})}},
			outcome{send: []sent{{control.Terminate, 0, 0}}}, nil},
		{"a forged Terminate", []ev{{msg: &control.Message{Command: control.Terminate, Sender: node.SchedulerID, Origin: "other"}}},
			outcome{rejects: []string{"sender"}}, nil},

		// Lost peers.
		{"a lost peer is reported, and waited on", []ev{{lost: s1}},
			outcome{send: []sent{{control.NodeFailed, s1, 0}}, grace: s1}, nil},
		{"no verdict within the grace: the loss is the node's failure, unreported", []ev{{lost: s1}, {at: 2 * time.Second, grace: true}},
			outcome{fail: "cluster: lost server1(10)@10.0.0.1:7020: connection reset"}, nil},
		{"the verdict came first: the peer left, and the job goes on", []ev{{lost: s1},
			{msg: sched(control.Message{Command: control.NodeLeft, Target: s1})}, {grace: true}},
			outcome{}, nil},
		{"the scheduler's verdict names the lost peer", []ev{{lost: s1},
			{msg: sched(control.Message{Command: control.NodeFailed, Target: s1, Text: "lost by worker0"})}, {grace: true}},
			outcome{}, func(t *testing.T, c *core) {
				if !strings.Contains(c.err.Error(), "failed: lost by worker0") {
					t.Errorf("failure %v; want the scheduler's verdict", c.err)
				}
			}},
		{"a peer lost after Terminate", []ev{{msg: sched(control.Message{Command: control.Terminate})}, {lost: s1}},
			outcome{}, nil},
		{"a connection from a stranger drops", []ev{{lost: node.WorkerID(7)}},
			outcome{}, nil},

		// The table: joins and departures.
		{"a server leaves", []ev{{msg: sched(control.Message{Command: control.NodeLeft, Target: s1, Flags: control.FlagGraceful})}},
			outcome{left: &departure{s1, true}}, func(t *testing.T, c *core) {
				if _, ok := c.topo.byID[s1]; ok || !c.hasLeft(s1) || len(c.topo.table) != 3 {
					t.Errorf("table %v, left %v; want server 1 moved out", c.topo.table, c.topo.left)
				}
				if got := c.describe(s1); got != "server1(10)@10.0.0.1:7020" {
					t.Errorf("a node that left is named %q", got)
				}
			}},
		{"this node left in order", []ev{{msg: sched(control.Message{Command: control.NodeLeft, Target: me, Flags: control.FlagGraceful})}},
			outcome{departed: true}, nil},
		{"NodeLeft for the scheduler", []ev{{msg: sched(control.Message{Command: control.NodeLeft, Target: node.SchedulerID})}},
			outcome{}, nil},
		{"NodeLeft for this node, not in order", []ev{{msg: sched(control.Message{Command: control.NodeLeft, Target: me})}},
			outcome{}, nil},
		{"a worker joins: it is dialled", []ev{{msg: sched(control.Message{Command: control.NodeJoined, Nodes: []node.Info{infoOf(node.WorkerID(2))}})}},
			outcome{dial: node.WorkerID(2)}, func(t *testing.T, c *core) {
				if len(c.topo.table) != 5 || c.topo.table[4].ID != node.WorkerID(2) {
					t.Errorf("table %v; want worker 2 last", c.topo.table)
				}
			}},
		{"a member cannot join again", []ev{{msg: sched(control.Message{Command: control.NodeJoined, Nodes: []node.Info{infoOf(w1)}})}},
			outcome{}, nil},
		{"a scheduler cannot join", []ev{{msg: sched(control.Message{Command: control.NodeJoined, Nodes: []node.Info{infoOf(node.SchedulerID)}})}},
			outcome{}, nil},

		// Layouts and the role's messages.
		{"a newer layout reaches the role", []ev{{msg: layoutMsg(classic.Layout{Version: 1, Servers: []node.ID{s1}})}},
			outcome{role: []control.Command{control.Layout}}, func(t *testing.T, c *core) {
				if c.layout.Version != 1 || c.tableLayout.Version != 0 || len(c.tableLayout.Servers) != 2 {
					t.Errorf("layout %v, table's %v", c.layout, c.tableLayout)
				}
			}},
		{"an older layout does not", []ev{{msg: layoutMsg(classic.Layout{Version: 2, Servers: []node.ID{s1}})},
			{msg: layoutMsg(classic.Layout{Version: 1, Servers: []node.ID{s0}})}},
			outcome{}, func(t *testing.T, c *core) {
				if c.layout.Version != 2 {
					t.Errorf("layout %v; want version 2", c.layout)
				}
			}},
		{"nor the same version again", []ev{{msg: layoutMsg(classic.Layout{Version: 1, Servers: []node.ID{s1}})},
			{msg: layoutMsg(classic.Layout{Version: 1, Servers: []node.ID{s0}})}},
			outcome{}, nil},
		{"a garbled layout is refused", []ev{{msg: sched(control.Message{Command: control.Layout, Body: []byte{1, 2, 3}})}},
			outcome{rejects: []string{"layout"}}, nil},
		{"the LB's messages go to the role", []ev{{msg: sched(control.Message{Command: control.Decision})}},
			outcome{role: []control.Command{control.Decision}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := registered(t)
			got := outcomeOf(t, feed(t, c, tt.events))
			wantFail, wantStart := tt.want.fail, tt.want.startErr
			if !strings.Contains(got.fail, wantFail) || (wantFail == "") != (got.fail == "") {
				t.Errorf("failure %q; want one with %q", got.fail, wantFail)
			}
			got.fail, got.startErr, tt.want.fail, tt.want.startErr = "", "", "", ""
			if wantStart != "" {
				t.Fatalf("startErr asserted of a registered core")
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ready\n got %+v\nwant %+v", got, tt.want)
			}
			if tt.check != nil {
				tt.check(t, c)
			}
		})
	}
}

// Registration: what the node table must say, and what ends a start
// before it.
func TestCoreRegistration(t *testing.T) {
	s0, s1 := node.ServerID(0), node.ServerID(1)
	l := classic.Layout{Version: 3, Servers: []node.ID{s1}}
	tests := []struct {
		name     string
		cfg      func(*config.Config)
		msgs     []*control.Message
		table    bool
		startErr string
		check    func(t *testing.T, c *core)
	}{
		{"the job's table", nil, []*control.Message{nodeTable(me, 2, 2, false, 0, l)}, true, "", func(t *testing.T, c *core) {
			if c.topo.self.ID != me || c.topo.stamp != 42 || c.topo.join || len(c.topo.table) != 4 {
				t.Errorf("topology %+v", c.topo)
			}
			if want := (classic.Layout{Servers: []node.ID{s0, s1}}); !reflect.DeepEqual(c.layout, want) || !reflect.DeepEqual(c.tableLayout, want) {
				t.Errorf("layouts %v, %v; want %v", c.layout, c.tableLayout, want)
			}
		}},
		{"a joining node's table: barrier numbers and layout", nil, []*control.Message{nodeTable(me, 1, 2, true, 5, l)}, true, "", func(t *testing.T, c *core) {
			if !c.topo.join || !reflect.DeepEqual(c.layout, l) || !reflect.DeepEqual(c.tableLayout, l) {
				t.Errorf("join %v, layouts %v, %v; want a joining node of layout %v", c.topo.join, c.layout, c.tableLayout, l)
			}
			m, err := c.barrier(node.WorkerGroup, 0)
			if err != nil || m.Seq != 5 {
				t.Errorf("first barrier %v, %v; want seq 5", m, err)
			}
		}},
		{"messages before the table wait", nil, []*control.Message{sched(control.Message{Command: control.HeartbeatAck})}, false, "", nil},
		{"the scheduler gives up", nil, []*control.Message{sched(control.Message{Command: control.NodeFailed, Text: "worker1 cannot start"})}, false,
			"the scheduler gave up before the cluster started: worker1 cannot start", nil},
		{"the scheduler terminates", nil, []*control.Message{sched(control.Message{Command: control.Terminate})}, false,
			"terminated by the scheduler while registering", nil},
		{"a table of another size", nil, []*control.Message{nodeTable(me, 1, 2, false, 0, l)}, false,
			"node table has 1 servers and 2 workers; DMLC_NUM_SERVER=2, DMLC_NUM_WORKER=2", nil},
		{"a joining table without a server", nil, []*control.Message{nodeTable(me, 0, 2, true, 0, l)}, false, "node table has 0 servers", nil},
		{"a table that does not list this node", nil, []*control.Message{nodeTable(node.WorkerID(5), 2, 2, false, 0, l)}, false,
			"does not list this node", nil},
		{"a table without the stamp", nil, []*control.Message{func() *control.Message {
			m := nodeTable(me, 2, 2, false, 0, l)
			m.Body = nil
			return m
		}()}, false, "without the job's stamp", nil},
		{"an id of another role", nil, []*control.Message{func() *control.Message {
			m := nodeTable(me, 2, 2, false, 0, l)
			m.Nodes[0].Role = node.Worker
			return m
		}()}, false, "does not fit role", nil},
		{"an id twice", nil, []*control.Message{func() *control.Message {
			m := nodeTable(me, 2, 2, false, 0, l)
			m.Nodes = append(m.Nodes, m.Nodes[0])
			return m
		}()}, false, "twice", nil},
		{"a rank other than the one asked", func(c *config.Config) { c.RankVar, c.Rank = "DMLC_RANK", 1 },
			[]*control.Message{nodeTable(me, 2, 2, false, 0, l)}, false, "not rank 1 as DMLC_RANK asks", nil},
		{"the rank asked", func(c *config.Config) { c.RankVar, c.Rank = "DMLC_RANK", 0 },
			[]*control.Message{nodeTable(me, 2, 2, false, 0, l)}, true, "", nil},
		{"a joining table with garbled barrier numbers", nil, []*control.Message{func() *control.Message {
			m := nodeTable(me, 2, 2, true, 0, l)
			m.Body = m.Body[:12]
			return m
		}()}, false, "bytes of barrier numbers", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig()
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			c := newCore(cfg)
			c.bound(node.Info{Role: node.Worker, Host: "10.0.0.1", ControlPort: infoOf(me).ControlPort, DataPort: infoOf(me).DataPort})
			var r ready
			for _, m := range tt.msgs {
				r = c.step(m, t0)
			}
			if r.table != tt.table {
				t.Errorf("table taken %v, want %v", r.table, tt.table)
			}
			switch {
			case tt.startErr == "" && r.startErr != nil:
				t.Errorf("start failed: %v", r.startErr)
			case tt.startErr != "" && (r.startErr == nil || !strings.Contains(r.startErr.Error(), tt.startErr)):
				t.Errorf("start error %v; want one with %q", r.startErr, tt.startErr)
			}
			if r.fail != nil || len(r.send) != 0 {
				t.Errorf("registering failed the node (%v) or sent %v", r.fail, r.send)
			}
			if tt.check != nil {
				tt.check(t, c)
			}
		})
	}
}

// While registering, the scheduler's port is probed: once it answered,
// it must go on answering, or the start fails naming the scheduler.
func TestCoreRegisterProbe(t *testing.T) {
	ms := time.Millisecond
	// step is a tick (ok unset) or a probe's answer, at t0+at.
	type step struct {
		at     time.Duration
		answer bool
		ok     bool
	}
	tests := []struct {
		name     string
		steps    []step
		probe    bool   // the last step asks for a probe
		startErr string // in the last step's error
	}{
		{"the first tick probes", []step{{at: 100 * ms}}, true, ""},
		{"one probe out at a time", []step{{at: 100 * ms}, {at: 200 * ms}}, false, ""},
		{"the next once answered", []step{{at: 100 * ms}, {at: 150 * ms, answer: true}, {at: 200 * ms}}, true, ""},
		{"a port never answering is a scheduler not started yet", []step{
			{at: 100 * ms}, {at: 150 * ms, answer: true}, {at: 5 * time.Second}, {at: 5100 * ms, answer: true}, {at: time.Minute},
		}, true, ""},
		{"a port that stops answering, within the timeout", []step{
			{at: 100 * ms}, {at: 150 * ms, answer: true, ok: true}, {at: 200 * ms}, {at: 250 * ms, answer: true}, {at: 1150 * ms},
		}, true, ""},
		{"a port that stops answering, past the timeout", []step{
			{at: 100 * ms}, {at: 150 * ms, answer: true, ok: true}, {at: 200 * ms}, {at: 250 * ms, answer: true}, {at: 1200 * ms},
		}, false, "the scheduler at 10.0.0.9:9000 stopped answering while the cluster was assembling: nothing has listened there for 1.05s"},
		{"a probe that hangs past the timeout", []step{
			{at: 100 * ms}, {at: 150 * ms, answer: true, ok: true}, {at: 200 * ms}, {at: 2 * time.Second},
		}, false, "stopped answering"},
		{"answering again in time", []step{
			{at: 100 * ms}, {at: 150 * ms, answer: true, ok: true}, {at: 200 * ms}, {at: 250 * ms, answer: true},
			{at: 300 * ms}, {at: 1100 * ms, answer: true, ok: true}, {at: 2000 * ms},
		}, true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCore(testConfig())
			c.bound(node.Info{Role: node.Worker, Host: "10.0.0.1", ControlPort: infoOf(me).ControlPort, DataPort: infoOf(me).DataPort})
			var r ready
			for _, s := range tt.steps {
				if s.answer {
					c.probed(s.ok, t0.Add(s.at))
					r = ready{}
					continue
				}
				r = c.tick(t0.Add(s.at), 0)
			}
			if r.probe != tt.probe {
				t.Errorf("probe %v, want %v", r.probe, tt.probe)
			}
			switch {
			case tt.startErr == "" && r.startErr != nil:
				t.Errorf("start failed: %v", r.startErr)
			case tt.startErr != "" && (r.startErr == nil || !strings.Contains(r.startErr.Error(), tt.startErr)):
				t.Errorf("start error %v; want one with %q", r.startErr, tt.startErr)
			}
			if r.fail != nil || len(r.send) != 0 {
				t.Errorf("a tick while registering failed the node (%v) or sent %v", r.fail, r.send)
			}
		})
	}
	// Once the table came, ticks are heartbeats: no probe.
	c := registered(t)
	c.probed(true, t0)
	if r := c.tick(t0.Add(5*time.Second), 0); r.probe || r.startErr != nil {
		t.Errorf("a tick after the table probed (%v) or failed the start (%v)", r.probe, r.startErr)
	}
}

// A scheduler's port whose every handshake fails (another secret, another
// program) ends the start after PS_HEARTBEAT_TIMEOUT of failures, naming
// why; a success, or a failure with another peer, does not.
func TestCoreHandshakes(t *testing.T) {
	ms := time.Millisecond
	const sched, other = "tcp://10.0.0.9:9000", "tcp://10.0.0.3:7000"
	refused := errors.New("authentication failed: the peer's key does not match this node's secret")
	// step is a tick (ep unset) or a handshake's outcome, at t0+at.
	type step struct {
		at  time.Duration
		ep  string
		err error
	}
	tests := []struct {
		name     string
		secret   string
		steps    []step
		startErr string // in the last tick's error; "" none
	}{
		{"failing, within the timeout", "", []step{{at: 100 * ms, ep: sched, err: refused}, {at: 1000 * ms}}, ""},
		{"failing past the timeout", "", []step{{at: 100 * ms, ep: sched, err: refused}, {at: 700 * ms, ep: sched, err: refused}, {at: 1200 * ms}},
			"the scheduler's port 10.0.0.9:9000 answers, but every handshake with it has failed for 1.1s (PS_HEARTBEAT_TIMEOUT is 1s), the latest: authentication failed"},
		{"the hint names the secret when there is one", "a-secret-of-16-bytes+", []step{{at: 100 * ms, ep: sched, err: refused}, {at: 1200 * ms}},
			"is FPT_CLUSTER_SECRET (or FPT_CLUSTER_SECRET_FILE) the same on every node"},
		{"a success resets it", "", []step{{at: 100 * ms, ep: sched, err: refused}, {at: 500 * ms, ep: sched}, {at: 1200 * ms}}, ""},
		{"counted from the first failure after a success", "", []step{
			{at: 100 * ms, ep: sched, err: refused}, {at: 500 * ms, ep: sched}, {at: 600 * ms, ep: sched, err: refused}, {at: 1500 * ms},
		}, ""},
		{"another peer's failures do not count", "", []step{{at: 100 * ms, ep: other, err: refused}, {at: 5 * time.Second}}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.Secret = tt.secret
			c := newCore(cfg)
			c.bound(node.Info{Role: node.Worker, Host: "10.0.0.1", ControlPort: infoOf(me).ControlPort, DataPort: infoOf(me).DataPort})
			var r ready
			for _, s := range tt.steps {
				if s.ep != "" {
					c.handshake(s.ep, s.err, t0.Add(s.at))
					continue
				}
				r = c.tick(t0.Add(s.at), 0)
			}
			switch {
			case tt.startErr == "" && r.startErr != nil:
				t.Errorf("start failed: %v", r.startErr)
			case tt.startErr != "" && (r.startErr == nil || !strings.Contains(r.startErr.Error(), tt.startErr)):
				t.Errorf("start error %v; want one with %q", r.startErr, tt.startErr)
			}
		})
	}
}

// A scheduler that goes silent fails the node, naming it, one timeout
// after its last answer, whatever the node waits in: nothing, a barrier,
// the final barrier; and the node then forsakes it (drops what is queued
// for it at close rather than lingering). After the scheduler's
// Terminate the job is over: silence is no failure. The heartbeat ticks
// come every interval (100 ms) until the case's end.
func TestCoreSchedulerSilence(t *testing.T) {
	ack := sched(control.Message{Command: control.HeartbeatAck})
	const wantFail = "scheduler at tcp://10.0.0.9:9000 unreachable"
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	tests := []struct {
		name    string
		evs     []ev // at ms(50)+k*ms(100): between ticks
		end     time.Duration
		fail    string // in the failure at the end; "" none
		forsake bool
	}{
		{"running", []ev{{at: ms(450), msg: ack}}, ms(1600), wantFail, true},
		{"answered in time", []ev{{at: ms(450), msg: ack}}, ms(1400), "", false},
		{"worker barrier", []ev{{at: ms(450), msg: ack}, {at: ms(550), barrier: node.WorkerGroup}}, ms(1600), wantFail, true},
		{"barrier of every node", []ev{{at: ms(450), msg: ack}, {at: ms(550), barrier: node.AllGroup}}, ms(1600), wantFail, true},
		{"final barrier", []ev{{at: ms(450), msg: ack}, {at: ms(550), barrier: node.AllGroup, final: true}}, ms(1600), wantFail, true},
		{"final barrier, a peer lost meanwhile", []ev{{at: ms(450), msg: ack},
			{at: ms(550), barrier: node.AllGroup, final: true}, {at: ms(650), lost: node.ServerID(1)}}, ms(1600), wantFail, true},
		{"terminated", []ev{{at: ms(450), msg: ack}, {at: ms(550), barrier: node.AllGroup, final: true},
			{at: ms(650), msg: sched(control.Message{Command: control.Terminate})}}, ms(3000), "", false},
		{"failed for a peer", []ev{{at: ms(450), msg: ack}, {at: ms(550), fail: "server died"}}, ms(1400), "server died", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var evs []ev
			rest := tt.evs
			for at := ms(100); at <= tt.end; at += ms(100) {
				for len(rest) > 0 && rest[0].at < at {
					evs, rest = append(evs, rest[0]), rest[1:]
				}
				evs = append(evs, ev{at: at})
			}
			c := registered(t)
			feed(t, c, evs)
			got := ""
			if c.err != nil {
				got = c.err.Error()
			}
			if tt.fail == "" && got != "" || !strings.Contains(got, tt.fail) {
				t.Errorf("failure %q, want one with %q", got, tt.fail)
			}
			if c.forsakeScheduler() != tt.forsake {
				t.Errorf("forsakeScheduler() = %v, want %v", c.forsakeScheduler(), tt.forsake)
			}
		})
	}
}

// A job's first table counts a worker process of several customers once
// per customer (the pairs after the stamp and the hosts): one process of two
// customers makes DMLC_NUM_WORKER=2.
func TestCoreTableCustomers(t *testing.T) {
	pair := func(id node.ID, k uint32) []byte {
		b := binary.LittleEndian.AppendUint32(nil, uint32(id))
		return binary.LittleEndian.AppendUint32(b, k)
	}
	tests := []struct {
		name    string
		workers int    // in the table
		extra   []byte // after the stamp
		err     string // "" taken
	}{
		{"two processes", 2, nil, ""},
		{"one process of two customers", 1, pair(me, 2), ""},
		{"one process, its customers untold", 1, nil, "1 workers"},
		{"too many customers", 2, pair(me, 2), "3 workers"},
		{"customers of a server", 1, pair(node.ServerID(0), 2), "worker 8 of 2 customers"},
		{"customers of nobody", 1, pair(node.WorkerID(5), 2), "customers"},
		{"a customer count of one", 2, pair(me, 1), "customers"},
		{"a torn pair", 1, pair(me, 2)[:5], "pairs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCore(testConfig())
			c.bound(node.Info{Role: node.Worker, Host: "10.0.0.1", ControlPort: infoOf(me).ControlPort, DataPort: infoOf(me).DataPort})
			m := nodeTable(me, 2, tt.workers, false, 0, classic.Layout{})
			// As the scheduler sends it: the hosts named (none), then the pairs.
			m.Body = append(localagg.AppendHosts(m.Body, make([]string, len(m.Nodes))), tt.extra...)
			r := c.step(m, t0)
			got := ""
			if r.startErr != nil {
				got = r.startErr.Error()
			}
			if tt.err == "" && got != "" || !strings.Contains(got, tt.err) {
				t.Errorf("start error %q, want one with %q", got, tt.err)
			}
			if r.table != (tt.err == "") {
				t.Errorf("table taken %v", r.table)
			}
		})
	}
}

// The scheduler's customers' messages come over its connection only, and
// go to this node's customers (ready.apps); a forged one is refused.
func TestCoreApps(t *testing.T) {
	c := registered(t)
	m := sched(control.Message{Command: control.App, Target: me, Seq: 2, Body: []byte("x")})
	if r := c.step(m, t0); len(r.apps) != 1 || r.apps[0] != m {
		t.Errorf("app message from the scheduler: apps %v", r.apps)
	}
	forged := &control.Message{Command: control.App, Sender: node.SchedulerID, Origin: "elsewhere", Target: me, Body: []byte("x")}
	if r := c.step(forged, t0); len(r.apps) != 0 || len(r.rejects) != 1 {
		t.Errorf("forged app message: apps %v, rejects %v", r.apps, r.rejects)
	}
}
