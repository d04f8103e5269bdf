package capi

import (
	"errors"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fptps/fpt/appmsg"
	"github.com/fptps/fpt/internal/localcluster"
	"github.com/fptps/fpt/node"
)

func TestGroupIDs(t *testing.T) {
	for _, tt := range []struct {
		group int
		want  []int
		code  Code
	}{
		{1, []int{1}, CodeOK},
		{2, []int{8, 10}, CodeOK},
		{4, []int{9, 11, 13}, CodeOK},
		{6, []int{8, 9, 10, 11, 13}, CodeOK},
		{7, []int{1, 8, 9, 10, 11, 13}, CodeOK},
		{10, []int{10}, CodeOK},
		{13, []int{13}, CodeOK},
		{0, nil, CodeArg},
		{-1, nil, CodeArg},
		{5 + 3*1, []int{8}, CodeOK},
		{12, nil, CodeArg}, // server 2 of 2
		{15, nil, CodeArg}, // worker 3 of 3
		{1 << 40, nil, CodeArg},
	} {
		got, err := groupIDs("op", tt.group, 2, 3, func(node.ID) bool { return true })
		if CodeOf(err) != tt.code || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("groupIDs(%d) = %v, %v; want %v, code %d", tt.group, got, err, tt.want, tt.code)
		}
	}
}

// The v2 calls before Start are refused with CodeState.
func TestCustomerCallsBeforeStart(t *testing.T) {
	l := newLib(env(1, 1, 1, "server"), new(atomic.Int32))
	h := func(*appmsg.Message, error) {}
	for name, call := range map[string]func() error{
		"MyID":           func() error { _, err := l.MyID(); return err },
		"GroupIDs":       func() error { _, err := l.GroupIDs(2); return err },
		"BarrierGroup":   func() error { return l.BarrierGroup(2) },
		"CustomerAdd":    func() error { return l.CustomerAdd(0, 0, h) },
		"CustomerRemove": func() error { return l.CustomerRemove(0, 0) },
		"MsgSend":        func() error { return l.MsgSend(Msg{Recipient: 8}, nil) },
	} {
		if err := call(); CodeOf(err) != CodeState || !strings.Contains(err.Error(), "fpt_start has not been called") {
			t.Errorf("%s before Start: %v, want CodeState", name, err)
		}
	}
}

// rec records one customer's calls.
type rec struct {
	mu   sync.Mutex
	msgs []appmsg.Message
	errs []error
	ch   chan struct{}
}

func newRec() *rec { return &rec{ch: make(chan struct{}, 100)} }

func (r *rec) handle(m *appmsg.Message, err error) {
	r.mu.Lock()
	if err != nil {
		r.errs = append(r.errs, err)
	} else {
		r.msgs = append(r.msgs, *m)
	}
	r.mu.Unlock()
	r.ch <- struct{}{}
}

func (r *rec) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.msgs)
}

func (r *rec) wait(t *testing.T) {
	t.Helper()
	select {
	case <-r.ch:
	case <-time.After(30 * time.Second):
		t.Fatal("no call within 30 s")
	}
}

// A KVServer-shaped exchange through the library: workers' customers send
// requests to every server, the servers' handlers answer from the handler;
// ids, groups and group barriers as ps-lite's Postoffice gives them; the
// scheduler's calls behave as fpt.h says. Then a node fails: every
// customer hears of it once, and sends fail with CodeCluster.
func TestLibCustomers(t *testing.T) {
	c := startLibs(t, 2, 2)
	if id, err := c.sched.MyID(); err != nil || id != 1 {
		t.Fatalf("scheduler MyID = %d, %v", id, err)
	}
	if ids, err := c.sched.GroupIDs(6); err != nil || !reflect.DeepEqual(ids, []int{8, 9, 10, 11}) {
		t.Fatalf("scheduler GroupIDs(6) = %v, %v", ids, err)
	}
	if err := c.sched.BarrierGroup(7); err != nil {
		t.Fatalf("scheduler BarrierGroup: %v", err)
	}
	// The scheduler's customer, as a server's, answers every request
	// (over the control plane: the scheduler has no data plane).
	echo := func(l *Lib, r *rec) MsgHandler {
		return func(m *appmsg.Message, err error) {
			r.handle(m, err)
			if err != nil || m.Meta.Flags&appmsg.Request == 0 {
				return
			}
			resp := Msg{App: m.Meta.App, Customer: m.Meta.Customer, Timestamp: m.Meta.Timestamp, Head: m.Meta.Head,
				Recipient: int32(m.Meta.Sender), Flags: m.Meta.Flags &^ appmsg.Request, DType: int32(m.Meta.DType)}
			if err := l.MsgSend(resp, m.Segments); err != nil {
				t.Errorf("response: %v", err)
			}
		}
	}
	schedRec := newRec()
	if err := c.sched.CustomerAdd(0, 0, echo(c.sched, schedRec)); err != nil {
		t.Fatalf("scheduler CustomerAdd: %v", err)
	}
	if err := c.sched.CustomerAdd(0, 0, func(*appmsg.Message, error) {}); CodeOf(err) != CodeArg {
		t.Fatalf("scheduler CustomerAdd twice: %v", err)
	}
	if err := c.sched.MsgSend(Msg{Recipient: 2}, nil); CodeOf(err) != CodeArg {
		t.Fatalf("scheduler MsgSend to a group: %v", err)
	}
	if err := c.servers[0].CustomerAdd(0, 0, nil); CodeOf(err) != CodeArg {
		t.Fatalf("nil handler: %v", err)
	}

	// Servers answer every request from their handler, echoing it.
	var srvRecs []*rec
	for _, s := range c.servers {
		r := newRec()
		srvRecs = append(srvRecs, r)
		err := s.CustomerAdd(0, 0, func(m *appmsg.Message, err error) {
			r.handle(m, err)
			if err != nil {
				return
			}
			resp := Msg{App: m.Meta.App, Customer: m.Meta.Customer, Timestamp: m.Meta.Timestamp, Head: m.Meta.Head,
				Recipient: int32(m.Meta.Sender), Flags: m.Meta.Flags &^ appmsg.Request, DType: int32(m.Meta.DType)}
			if err := s.MsgSend(resp, m.Segments); err != nil {
				t.Errorf("response: %v", err)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// The servers join the workers' group barrier below.
	errs := make(chan error, len(c.servers))
	for _, s := range c.servers {
		go func() { errs <- s.BarrierGroup(int(node.ServerGroup | node.WorkerGroup)) }()
	}
	wRecs := make([]*rec, len(c.workers))
	err := c.each(func(rank int, l *Lib) error {
		id, err := l.MyID()
		if err != nil || id != int(node.WorkerID(rank)) {
			return errors.Join(err, errors.New("wrong MyID "+strconv.Itoa(id)))
		}
		r := newRec()
		wRecs[rank] = r
		if err := l.CustomerAdd(0, 5, r.handle); err != nil {
			return err
		}
		servers, err := l.GroupIDs(int(node.ServerGroup))
		if err != nil {
			return err
		}
		for _, s := range append(servers, int(node.SchedulerID)) {
			body := []byte("from worker " + strconv.Itoa(rank))
			if err := l.MsgSend(Msg{App: 0, Customer: 5, Timestamp: int32(rank), Head: 3, Recipient: int32(s), Flags: appmsg.Request | appmsg.Push, DType: 1}, [][]byte{body, nil}); err != nil {
				return err
			}
		}
		for range len(servers) + 1 {
			r.wait(t)
		}
		// ps-lite's Barrier over servers and workers.
		return l.BarrierGroup(int(node.ServerGroup | node.WorkerGroup | node.SchedulerGroup))
	})
	for range c.servers {
		if err := <-errs; err != nil {
			t.Fatalf("server BarrierGroup: %v", err)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	for rank, r := range wRecs {
		r.mu.Lock()
		for _, m := range r.msgs {
			if string(m.Segments[0]) != "from worker "+strconv.Itoa(rank) || m.Meta.Timestamp != int32(rank) ||
				m.Meta.Customer != 5 || m.Meta.Flags != appmsg.Push || len(m.Segments) != 2 || len(m.Segments[1]) != 0 {
				t.Errorf("worker %d got %+v %q", rank, m.Meta, m.Segments)
			}
		}
		r.mu.Unlock()
	}
	if n := schedRec.count(); n != len(c.workers) {
		t.Errorf("the scheduler's customer handled %d requests, want %d", n, len(c.workers))
	}
	if err := c.sched.CustomerRemove(0, 0); err != nil {
		t.Fatalf("scheduler CustomerRemove: %v", err)
	}
	if err := c.sched.CustomerRemove(0, 0); CodeOf(err) != CodeArg {
		t.Fatalf("scheduler CustomerRemove twice: %v", err)
	}
	if err := c.servers[1].MsgSend(Msg{Recipient: 3}, nil); CodeOf(err) != CodeArg {
		t.Errorf("send to a group: %v", err)
	}
	if err := c.servers[1].MsgSend(Msg{Recipient: 9, DType: 300}, nil); CodeOf(err) != CodeArg {
		t.Errorf("dtype 300: %v", err)
	}

	// A failure reaches every customer once.
	c.workers[1].w.Node().Fail(errors.New("test: worker 1 gives up"))
	for i, r := range append(srvRecs, wRecs...) {
		for {
			r.wait(t)
			r.mu.Lock()
			failed := len(r.errs) > 0
			r.mu.Unlock()
			if failed {
				break
			}
		}
		r.mu.Lock()
		if len(r.errs) != 1 || CodeOf(r.errs[0]) != CodeCluster || !strings.Contains(r.errs[0].Error(), "gives up") {
			t.Errorf("customer %d: failures %v", i, r.errs)
		}
		r.mu.Unlock()
	}
	if err := c.workers[0].MsgSend(Msg{Recipient: 8}, nil); CodeOf(err) != CodeCluster {
		t.Errorf("send after the failure: %v, want CodeCluster", err)
	}
	if err := c.workers[0].CustomerAdd(1, 1, func(*appmsg.Message, error) {}); CodeOf(err) != CodeCluster {
		t.Errorf("add after the failure: %v, want CodeCluster", err)
	}
	done := make(chan []error, 1)
	go func() { done <- c.finalize() }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("Finalize hung after a failure")
	}
	if err := c.workers[0].CustomerRemove(0, 5); CodeOf(err) != CodeState {
		t.Errorf("remove after Finalize: %v, want CodeState", err)
	}
}

// fpt.h's #defines for groups and messages carry the Go side's values.
func TestHeaderDefines(t *testing.T) {
	src, err := os.ReadFile("../include/fpt.h")
	if err != nil {
		t.Fatal(err)
	}
	header := map[string]int{}
	for _, m := range regexp.MustCompile(`(?m)^#define (FPT_[A-Z0-9_]+) (\d+)u?\b`).FindAllStringSubmatch(string(src), -1) {
		v, _ := strconv.Atoi(m[2])
		header[m[1]] = v
	}
	want := map[string]int{
		"FPT_API_VERSION":      4,
		"FPT_GROUP_SCHEDULER":  int(node.SchedulerGroup),
		"FPT_GROUP_SERVERS":    int(node.ServerGroup),
		"FPT_GROUP_WORKERS":    int(node.WorkerGroup),
		"FPT_MSG_REQUEST":      int(appmsg.Request),
		"FPT_MSG_PUSH":         int(appmsg.Push),
		"FPT_MSG_PULL":         int(appmsg.Pull),
		"FPT_MSG_SIMPLE":       int(appmsg.Simple),
		"FPT_MSG_FAILED":       int(appmsg.Failed),
		"FPT_MSG_MAX_SEGMENTS": MaxSegments,
	}
	if !reflect.DeepEqual(header, want) {
		t.Errorf("fpt.h defines %v, the Go side %v", header, want)
	}
}

// A worker process of two customers under DMLC_NUM_WORKER=2 is one node:
// the worker group is its one id on every node, the scheduler included,
// and the id a second process would have is no node; its customers still
// count as two workers.
func TestGroupIDsWorkerCustomers(t *testing.T) {
	port, err := localcluster.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	var shutdowns atomic.Int32
	sched := newLib(env(port, 1, 2, "scheduler"), &shutdowns)
	if err := sched.Start(); err != nil {
		t.Fatal(err)
	}
	srv, w := newLib(env(port, 1, 2, "server"), &shutdowns), newLib(env(port, 1, 2, "worker"), &shutdowns)
	errs := make(chan error, 3)
	go func() { errs <- srv.Start() }()
	go func() { errs <- w.StartCustomer(0) }()
	// Customer 1 joins the start customer 0 began (as a second thread's
	// Start does).
	for {
		w.mu.Lock()
		st := w.state
		w.mu.Unlock()
		if st != idle {
			break
		}
		time.Sleep(time.Millisecond)
	}
	go func() { errs <- w.StartCustomer(1) }()
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range []*Lib{sched, srv, w} {
		role, _ := l.Role()
		for _, tc := range []struct {
			group int
			want  []int
		}{
			{int(node.WorkerGroup), []int{9}},
			{int(node.AllGroup), []int{1, 8, 9}},
			{9, []int{9}},
		} {
			if got, err := l.GroupIDs(tc.group); err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("%s: GroupIDs(%d) = %v, %v; want %v", role, tc.group, got, err, tc.want)
			}
		}
		if _, err := l.GroupIDs(int(node.WorkerID(1))); CodeOf(err) != CodeArg {
			t.Errorf("%s: GroupIDs(%d) = %v, want CodeArg: no second worker process", role, node.WorkerID(1), err)
		}
	}
	if n, err := w.NumWorkers(); err != nil || n != 2 {
		t.Errorf("NumWorkers = %d, %v; want 2 (each customer a worker)", n, err)
	}
	fin := make(chan error, 3)
	for _, l := range []*Lib{sched, srv, w} {
		go func() { fin <- l.Finalize() }()
	}
	for range 3 {
		if err := <-fin; err != nil {
			t.Error(err)
		}
	}
}
