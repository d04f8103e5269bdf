package scheduler

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/classic"
	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/control"
	"github.com/fptps/fpt/control/memplane"
	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/node"
)

// TestServeNodeLoss: under FPT_ON_SERVER_LOSS=retry a lost server leaves
// the job (every other member hears NodeLeft, then the LB's retry
// decision) and the job goes on to its final barrier without it; so does
// a worker under FPT_ON_WORKER_LOSS=continue once every worker has the
// init round's values (the LB's Done is past 0), the retry listing the
// workers left. By default, or when the lost node is a worker the job
// cannot go on without (policy fail, Done 0, the last one) or the last
// server, the failure is relayed and the scheduler ends with an error
// naming it.
func TestServeNodeLoss(t *testing.T) {
	cases := []struct {
		name             string
		retry, lb        bool
		servers, workers int
		lost             node.ID
		leaves           bool // the job goes on without it
		final            bool // the others wait for it at the final barrier
		beforeStart      bool // lost before the start barrier passed
		workerLoss       config.WorkerLoss
		// reported: every worker reports iteration 0 before the loss, so
		// the LB's Done is 1.
		reported bool
	}{
		{"retry, LB off: the server leaves", true, false, 2, 2, node.ServerID(1), true, false, false, config.WorkerLossFail, false},
		{"retry, LB on: the server leaves", true, true, 3, 1, node.ServerID(0), true, false, false, config.WorkerLossFail, false},
		{"retry: the final barrier passes without it", true, false, 2, 2, node.ServerID(0), true, true, false, config.WorkerLossFail, false},
		{"fail (default): relayed", false, false, 2, 2, node.ServerID(1), false, false, false, config.WorkerLossFail, false},
		{"fail (default), LB on: relayed", false, true, 2, 2, node.ServerID(1), false, false, false, config.WorkerLossFail, false},
		{"fail (default), at the final barrier: relayed", false, false, 2, 2, node.ServerID(1), false, true, false, config.WorkerLossFail, false},
		{"retry, a worker: relayed", true, false, 2, 2, node.WorkerID(1), false, false, false, config.WorkerLossFail, false},
		{"retry, the last server: relayed", true, false, 1, 2, node.ServerID(0), false, false, false, config.WorkerLossFail, false},
		{"retry, before the start: relayed", true, false, 2, 2, node.ServerID(1), false, false, true, config.WorkerLossFail, false},
		{"continue: the worker leaves", false, false, 2, 3, node.WorkerID(1), true, false, false, config.WorkerLossContinue, true},
		{"continue, LB on: the final barrier passes without the worker", false, true, 2, 2, node.WorkerID(0), true, true, false, config.WorkerLossContinue, true},
		{"continue, before any report: relayed", false, false, 2, 2, node.WorkerID(1), false, false, false, config.WorkerLossContinue, false},
		{"continue, the last worker: relayed", false, false, 2, 1, node.WorkerID(0), false, false, false, config.WorkerLossContinue, true},
		{"fail (default), a worker after a report: relayed", true, false, 2, 2, node.WorkerID(1), false, false, false, config.WorkerLossFail, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Config{NumServers: tc.servers, NumWorkers: tc.workers, HeartbeatInterval: time.Hour,
				HeartbeatTimeout: 2 * time.Hour, StartTimeout: waitTime, LB: tc.lb, RetryServerLoss: tc.retry, WorkerLoss: tc.workerLoss}
			srv := serve(t, cfg)
			sched := srv.sched
			members := tables(t, srv.register(t, roles(tc.servers, tc.workers)...), cfg.Grants())
			// A check that fails may leave the scheduler waiting for the
			// members' Terminate echoes (for the heartbeat timeout, not
			// its context): echo, so that the cleanup does not hang.
			t.Cleanup(func() {
				if t.Failed() {
					for id, p := range members {
						_ = p.Send(sched, &control.Message{Command: control.Terminate, Sender: id})
					}
				}
			})
			if !tc.beforeStart {
				passStart(t, sched, members)
			}
			var done uint64 // the LB's Done: where a retry takes effect
			if tc.reported {
				reportFirst(t, sched, members)
				done = 1
			}
			// The members the job goes on with.
			var servers, workers []node.ID
			for id := range members {
				if r, _ := id.Role(); id != tc.lost && r == node.Server {
					servers = append(servers, id)
				} else if id != tc.lost {
					workers = append(workers, id)
				}
			}
			slices.Sort(servers)
			slices.Sort(workers)
			var reporter node.ID // some other member notices the loss
			for id := range members {
				if id != tc.lost && reporter == 0 {
					reporter = id
				}
			}
			// Everyone but the lost node waits at a barrier: only the loss
			// can release it.
			var flags uint8
			barrierSeq := uint64(startBarrier + 1)
			if tc.beforeStart {
				barrierSeq = 0
			}
			if tc.final {
				flags = control.FlagFinal
			}
			for id, p := range members {
				if id != tc.lost {
					_ = p.Send(sched, &control.Message{Command: control.Barrier, Flags: flags, Sender: id, Group: node.AllGroup, Seq: barrierSeq})
				}
			}
			lost := &control.Message{Command: control.NodeFailed, Sender: reporter, Target: tc.lost, Text: "connection reset"}
			if err := members[reporter].Send(sched, lost); err != nil {
				t.Fatal(err)
			}
			for id, p := range members {
				if id == tc.lost {
					continue
				}
				m := next(t, p)
				if !tc.leaves {
					if m.Command != control.NodeFailed || m.Target != tc.lost {
						t.Fatalf("%s got %v naming %s, want NodeFailed naming %s", id, m.Command, m.Target, tc.lost)
					}
					continue
				}
				if m.Command != control.NodeLeft || m.Target != tc.lost || m.Text != "connection reset" {
					t.Fatalf("%s got %v naming %s (%q), want NodeLeft naming %s", id, m.Command, m.Target, m.Text, tc.lost)
				}
				m = next(t, p)
				if r, _ := tc.lost.Role(); r == node.Server {
					// The classic key ranges are cut over the servers left.
					l, err := classic.ParseLayout(m.Body)
					if m.Command != control.Layout || err != nil || l.Version != 1 || !slices.Equal(l.Servers, servers) {
						t.Fatalf("%s got %v %v (%v), want classic layout v1%v", id, m.Command, l, err, servers)
					}
					m = next(t, p)
				}
				if m.Command != control.Decision {
					t.Fatalf("%s got %v after NodeLeft, want the retry decision", id, m.Command)
				}
				d, err := lb.UnmarshalDirective(m.Body)
				if err != nil || !d.Retry || d.Decision == nil || d.Decision.Version != 1 || d.Decision.Iteration != done {
					t.Fatalf("%s got %v, %v: want a retry decision, version 1, from iteration %d", id, d, err, done)
				}
				if got := slices.Sorted(slices.Values(d.Decision.Aggregators)); !slices.Equal(got, servers) {
					t.Fatalf("%s got %v: aggregators %v, want the servers left, %v", id, d, got, servers)
				}
				// A server's loss changes no worker: nil, inherited.
				var wantWorkers []node.ID
				if r, _ := tc.lost.Role(); r == node.Worker {
					wantWorkers = workers
				}
				if !slices.Equal(d.Decision.Workers, wantWorkers) {
					t.Fatalf("%s got %v: workers %v, want %v", id, d, d.Decision.Workers, wantWorkers)
				}
				m = next(t, p)
				if tc.final {
					if m.Command != control.Terminate {
						t.Fatalf("%s got %v, want Terminate: the final barrier waited only for the lost server", id, m.Command)
					}
					_ = p.Send(sched, &control.Message{Command: control.Terminate, Sender: id})
					continue
				}
				if m.Command != control.BarrierDone || m.Group != node.AllGroup || m.Seq != startBarrier+1 {
					t.Fatalf("%s got %v (group %d, seq %d), want the barrier released", id, m.Command, m.Group, m.Seq)
				}
			}
			if !tc.leaves {
				if err := srv.ended(t); err == nil || !strings.Contains(err.Error(), tc.lost.String()) {
					t.Fatalf("Serve: %v, want an error naming %s", err, tc.lost)
				}
				return
			}
			if !tc.final {
				// A late report of the same loss is not a failure.
				if err := members[reporter].Send(sched, lost); err != nil {
					t.Fatal(err)
				}
				// The members left reach the final barrier without the
				// lost node, and are terminated.
				for id, p := range members {
					if id != tc.lost {
						_ = p.Send(sched, &control.Message{Command: control.Barrier, Flags: control.FlagFinal, Sender: id, Group: node.AllGroup, Seq: startBarrier + 2})
					}
				}
				for id, p := range members {
					if id == tc.lost {
						continue
					}
					if m := next(t, p); m.Command != control.Terminate {
						t.Fatalf("%s got %v, want Terminate", id, m.Command)
					}
					_ = p.Send(sched, &control.Message{Command: control.Terminate, Sender: id})
				}
			}
			if err := srv.ended(t); err != nil {
				t.Fatalf("Serve: %v", err)
			}
			select {
			case m := <-members[tc.lost].Incoming():
				t.Errorf("the lost node got %v", m.Command)
			default:
			}
		})
	}
}

// passStart has every member pass the two start barriers: a server lost
// before them ends the job even under retry.
func passStart(t *testing.T, sched string, members map[node.ID]*memplane.Plane) {
	t.Helper()
	for seq := range uint64(startBarrier + 1) {
		for id, p := range members {
			_ = p.Send(sched, &control.Message{Command: control.Barrier, Sender: id, Group: node.AllGroup, Seq: seq})
		}
		for id, p := range members {
			if m := next(t, p); m.Command != control.BarrierDone || m.Seq != seq {
				t.Fatalf("%s got %v (seq %d), want start barrier %d released", id, m.Command, m.Seq, seq)
			}
		}
	}
}

// reportFirst has every worker report iteration 0 to the LB, as a worker
// does once it has the init round's values, and takes the directive each
// then gets (Done 1; the servers get none: nothing changes for them).
func reportFirst(t *testing.T, sched string, members map[node.ID]*memplane.Plane) {
	t.Helper()
	for id, p := range members {
		if r, _ := id.Role(); r != node.Worker {
			continue
		}
		body, err := lb.Sample{Node: id, Iteration: 0}.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		_ = p.Send(sched, &control.Message{Command: control.Report, Sender: id, Body: body})
	}
	for id, p := range members {
		if r, _ := id.Role(); r != node.Worker {
			continue
		}
		m := next(t, p)
		if m.Command != control.Decision {
			t.Fatalf("%s got %v after the reports, want the directive", id, m.Command)
		}
		if d, err := lb.UnmarshalDirective(m.Body); err != nil || d.Done != 1 {
			t.Fatalf("%s got %v, %v after the reports: want Done 1", id, d, err)
		}
	}
}
