package metrics_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/metrics"
	"github.com/fptps/fpt/node"
)

func TestScheduler(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := metrics.NewScheduler(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.Members([]node.Info{{ID: node.SchedulerID, Role: node.Scheduler}, {ID: node.ServerID(0), Role: node.Server}, {ID: node.WorkerID(0), Role: node.Worker}, {ID: node.WorkerID(1), Role: node.Worker}})
	all := []node.ID{node.ServerID(0), node.WorkerID(0), node.WorkerID(1)}
	m.Decision(lb.Even(1, 4, all), true)
	// The next decision leaves server 0 out: its series must go.
	m.Decision(lb.Decision{Version: 2, Iteration: 8, Aggregators: all[1:], Shares: []float64{0.75, 0.25}}, false)
	m.Guards(1)
	m.Guards(1) // the same count again: no new fall-back
	m.Guards(3)
	m.Capacities(map[node.ID]float64{node.ServerID(0): 1e6}, map[node.ID]float64{node.ServerID(0): 2e6})
	m.Iteration(7, 1500*time.Millisecond)
	// After three membership changes the table has two servers.
	m.Membership([]node.Info{{ID: node.SchedulerID, Role: node.Scheduler}, {ID: node.ServerID(1), Role: node.Server}, {ID: node.ServerID(2), Role: node.Server}, {ID: node.WorkerID(0), Role: node.Worker}, {ID: node.WorkerID(1), Role: node.Worker}}, 3)
	want := `
# HELP fpt_lb_decision_version Version of the latest LB decision issued (0: the initial even split over the servers).
# TYPE fpt_lb_decision_version gauge
fpt_lb_decision_version 2
# HELP fpt_lb_share Fraction of every tensor the node aggregates under the latest LB decision (absent: none).
# TYPE fpt_lb_share gauge
fpt_lb_share{node="worker 0"} 0.75
fpt_lb_share{node="worker 1"} 0.25
# HELP fpt_lb_probes_total Probes the LB started (every node aggregating, shaping off, capacities measured).
# TYPE fpt_lb_probes_total counter
fpt_lb_probes_total 1
# HELP fpt_lb_guards_total Times the LB went back to the even split over the servers because a balanced split measured slower than it.
# TYPE fpt_lb_guards_total counter
fpt_lb_guards_total 3
# HELP fpt_lb_capacity_bits_per_second Highest rate the LB measured on the node's send or receive side in its current window.
# TYPE fpt_lb_capacity_bits_per_second gauge
fpt_lb_capacity_bits_per_second{direction="receive",node="server 0"} 1.6e+07
fpt_lb_capacity_bits_per_second{direction="send",node="server 0"} 8e+06
# HELP fpt_iteration The latest iteration every worker has finished (the LB's count; iteration 0 is the init round).
# TYPE fpt_iteration gauge
fpt_iteration 7
# HELP fpt_members Nodes in the cluster, by role, once every one registered; then as servers and workers join or leave a running job.
# TYPE fpt_members gauge
fpt_members{role="scheduler"} 1
fpt_members{role="server"} 2
fpt_members{role="worker"} 2
# HELP fpt_membership_version Membership changes since the cluster started (0: the nodes it started with).
# TYPE fpt_membership_version gauge
fpt_membership_version 3
`
	names := []string{"fpt_lb_decision_version", "fpt_lb_share", "fpt_lb_probes_total", "fpt_lb_guards_total", "fpt_lb_capacity_bits_per_second", "fpt_iteration", "fpt_members", "fpt_membership_version"}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	if n, err := testutil.GatherAndCount(reg, "fpt_iteration_seconds"); err != nil || n != 1 {
		t.Errorf("fpt_iteration_seconds: %d series, %v", n, err)
	}
	// A nil *Scheduler (no FPT_METRICS_ADDR) records nothing, and does not panic.
	var none *metrics.Scheduler
	none.Members(nil)
	none.Membership(nil, 1)
	none.Decision(lb.Even(1, 0, all), true)
	none.Guards(1)
	none.Capacities(nil, nil)
	none.Iteration(1, time.Second)
}
