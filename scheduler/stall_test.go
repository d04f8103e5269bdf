package scheduler

import (
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/control"
	"github.com/fptps/fpt/node"
)

// rep is a worker's report to the stall watch: it has pushed its first
// pushed iterations, at seconds into a test (see at).
type rep struct {
	at     float64
	id     node.ID
	pushed uint64
}

// at is s seconds into a stall watch test.
func at(s float64) time.Time { return time.Unix(1000, 0).Add(time.Duration(s * float64(time.Second))) }

func TestStallWatch(t *testing.T) {
	w0, w1, w2 := node.WorkerID(0), node.WorkerID(1), node.WorkerID(2)
	cases := []struct {
		name    string
		timeout time.Duration
		reports []rep
		checkAt float64
		want    node.ID // 0: no stall
		iter    uint64
		left    []node.ID // workers that left the job (remove) before the check
	}{
		{"nobody pushed", 2 * time.Second, nil, 100, 0, 0, nil},
		{"all level", 2 * time.Second, []rep{{1, w0, 3}, {1, w1, 3}, {1, w2, 3}}, 100, 0, 0, nil},
		{"one behind, within the timeout", 2 * time.Second, []rep{{1, w0, 8}, {1, w1, 8}, {1, w2, 7}, {2, w0, 9}, {2, w1, 9}}, 2.9, 0, 0, nil},
		{"one behind, past the timeout", 2 * time.Second, []rep{{1, w0, 8}, {1, w1, 8}, {1, w2, 7}, {2, w0, 9}, {2, w1, 9}}, 4.5, w2, 7, nil},
		// w2 pushed 8 at 1 s, before the others: it fell behind only when w0 pushed 9 at 2 s.
		{"clock starts when it falls behind", 2 * time.Second, []rep{{1, w2, 8}, {1, w0, 8}, {1, w1, 8}, {2, w0, 9}, {2, w1, 9}}, 3.9, 0, 0, nil},
		{"fell behind, then waited too long", 2 * time.Second, []rep{{1, w2, 8}, {1, w0, 8}, {1, w1, 8}, {2, w0, 9}, {2, w1, 9}}, 4.1, w2, 8, nil},
		// Slow but moving: always one behind, each iteration 1.5 s.
		{"slow worker moving", 2 * time.Second, []rep{
			{0, w0, 1}, {0, w1, 1}, {1.5, w2, 1}, {1.5, w0, 2}, {1.5, w1, 2}, {3, w2, 2}, {3, w0, 3}, {3, w1, 3}, {4.5, w2, 3}, {4.5, w0, 4}, {4.5, w1, 4},
		}, 6, 0, 0, nil},
		{"late heartbeat going backwards", 2 * time.Second, []rep{{1, w0, 5}, {1, w1, 5}, {1, w2, 5}, {9, w2, 4}}, 100, 0, 0, nil},
		{"off", 0, []rep{{1, w0, 8}, {1, w1, 8}, {1, w2, 7}}, 1000, 0, 0, nil},
		{"not a worker", 2 * time.Second, []rep{{1, node.ServerID(0), 8}}, 100, 0, 0, nil},
		{"two stalled: the lowest id", 2 * time.Second, []rep{{1, w0, 8}}, 100, w1, 0, nil},
		// FPT_ON_WORKER_LOSS=continue: a worker that left is waited for
		// by nobody, and the front may move back.
		{"the stalled worker left", 2 * time.Second, []rep{{1, w0, 8}, {1, w1, 8}, {1, w2, 7}}, 100, 0, 0, []node.ID{w2}},
		{"the front worker left", 2 * time.Second, []rep{{1, w0, 9}, {1, w1, 8}, {1, w2, 8}}, 100, 0, 0, []node.ID{w0}},
		{"the front left, one still behind the new front", 2 * time.Second, []rep{{1, w0, 9}, {1, w1, 8}, {1, w2, 7}}, 100, w2, 7, []node.ID{w0}},
		{"a level worker left", 2 * time.Second, []rep{{1, w0, 8}, {1, w1, 8}, {1, w2, 7}}, 100, w2, 7, []node.ID{w1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := newStallWatch(c.timeout, []node.ID{w0, w1, w2}, at(0))
			for _, r := range c.reports {
				w.report(r.id, r.pushed, at(r.at))
			}
			for _, id := range c.left {
				w.remove(id)
			}
			s, ok := w.check(at(c.checkAt))
			if c.want == 0 {
				if ok {
					t.Fatalf("stall reported: %+v", s)
				}
				return
			}
			if !ok || s.worker != c.want || s.iter != c.iter {
				t.Fatalf("got %+v (ok %v), want worker %s at iteration %d", s, ok, c.want, c.iter)
			}
		})
	}
}

// TestStallWatchJoin: a worker that joined at iteration from counts as
// having pushed the iterations before it: its smaller counts change
// nothing, it stalls once the others have pushed from and it has not,
// and workers that have not reached from yet are behind it from the join.
func TestStallWatchJoin(t *testing.T) {
	w0, w1, joiner := node.WorkerID(0), node.WorkerID(1), node.WorkerID(3)
	cases := []struct {
		name    string
		before  []rep   // reports before the join
		from    uint64  // the joiner's first iteration, joined at 1 s
		after   []rep   // reports after it
		checkAt float64 // timeout 2 s
		want    node.ID // 0: no stall
		iter    uint64
	}{
		{"level, its smaller counts ignored", []rep{{1, w0, 8}, {1, w1, 8}}, 8, []rep{{2, joiner, 3}}, 100, 0, 0},
		{"it pushes its first iteration", []rep{{1, w0, 8}, {1, w1, 8}}, 8, []rep{{2, w0, 9}, {2, w1, 9}, {2.5, joiner, 9}}, 4.4, 0, 0},
		{"left behind at its first iteration", []rep{{1, w0, 8}, {1, w1, 8}}, 8, []rep{{2, w0, 9}, {2, w1, 9}}, 4.1, joiner, 8},
		{"the others behind it from the join", []rep{{0, w0, 7}, {0, w1, 7}}, 8, nil, 3.1, w0, 7},
		{"the others behind it, within the timeout", []rep{{0, w0, 7}, {0, w1, 7}}, 8, nil, 2.9, 0, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := newStallWatch(2*time.Second, []node.ID{w0, w1}, at(0))
			for _, r := range c.before {
				w.report(r.id, r.pushed, at(r.at))
			}
			w.add(joiner, c.from, at(1))
			w.add(joiner, 0, at(1.5)) // a second add changes nothing
			for _, r := range c.after {
				w.report(r.id, r.pushed, at(r.at))
			}
			s, ok := w.check(at(c.checkAt))
			if ok != (c.want != 0) || ok && (s.worker != c.want || s.iter != c.iter) {
				t.Fatalf("got %+v (ok %v), want worker %s at iteration %d", s, ok, c.want, c.iter)
			}
		})
	}
}

func TestStallReason(t *testing.T) {
	s := stall{worker: node.WorkerID(1), iter: 7, waited: 10 * time.Minute}
	got := s.reason()
	want := "worker 1 (id 11) has pushed nothing for iteration 7 for 10m0s while the other workers wait (FPT_STALL_TIMEOUT)"
	if got != want || !strings.Contains(got, "FPT_STALL_TIMEOUT") {
		t.Fatalf("reason %q, want %q", got, want)
	}
}

func TestStartFailureNamesTheNode(t *testing.T) {
	cases := []struct {
		name string
		m    control.Message
		want string
	}{
		{"by address before its id", control.Message{Command: control.NodeFailed,
			Nodes: []node.Info{{Role: node.Server, Host: "10.0.0.2", ControlPort: 9000, DataPort: 9001}}, Text: "failed while starting: port taken"},
			"scheduler: server@10.0.0.2:9000 failed while starting: port taken"},
		{"by id without an address", control.Message{Command: control.NodeFailed, Sender: node.WorkerID(0), Text: "failed while starting: bad table"},
			"scheduler: worker0(9) failed while starting: bad table"},
	}
	for _, c := range cases {
		if got := startFailure(&c.m).Error(); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

func TestCulprit(t *testing.T) {
	table := []node.Info{
		{ID: node.SchedulerID, Role: node.Scheduler, Host: "10.0.0.1", ControlPort: 9000},
		{ID: node.ServerID(0), Role: node.Server, Host: "10.0.0.2", ControlPort: 9000},
		{ID: node.WorkerID(0), Role: node.Worker, Host: "10.0.0.2", ControlPort: 9100},
	}
	cases := []struct {
		name string
		m    control.Message
		want node.ID
	}{
		{"target named", control.Message{Target: node.ServerID(0)}, node.ServerID(0)},
		{"target wins over an address", control.Message{Target: node.ServerID(0), Nodes: []node.Info{{Host: "10.0.0.2", ControlPort: 9100}}}, node.ServerID(0)},
		{"by address", control.Message{Nodes: []node.Info{{Host: "10.0.0.2", ControlPort: 9100}}}, node.WorkerID(0)},
		{"unknown address", control.Message{Nodes: []node.Info{{Host: "10.0.0.9", ControlPort: 9100}}}, 0},
	}
	for _, c := range cases {
		if got := culprit(&c.m, table); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}
