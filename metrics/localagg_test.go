package metrics_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fptps/fpt/localagg"
	"github.com/fptps/fpt/metrics"
	"github.com/fptps/fpt/node"
)

// TestLocalGroups: the scheduler's gauge has one series per host, with its
// workers; groups recorded again replace the old ones.
func TestLocalGroups(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := metrics.NewScheduler(reg)
	if err != nil {
		t.Fatal(err)
	}
	w := node.WorkerID
	m.LocalGroups([]localagg.Group{{Host: "old", Workers: []node.ID{w(5)}}})
	m.LocalGroups([]localagg.Group{{Host: "a", Workers: []node.ID{w(0), w(2), w(3)}}, {Host: "b", Workers: []node.ID{w(1)}}})
	want := `
# HELP fpt_local_group_workers Workers of each host's local group, by the host they name (FPT_HOST_ID, else their address); 1: alone on the host.
# TYPE fpt_local_group_workers gauge
fpt_local_group_workers{host="a"} 3
fpt_local_group_workers{host="b"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "fpt_local_group_workers"); err != nil {
		t.Error(err)
	}
	var none *metrics.Scheduler
	none.LocalGroups(nil)
}

// TestLocalSummed: a leader's counts, on workers only, labelled with the
// role; a nil Node records nothing.
func TestLocalSummed(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := metrics.New(reg, node.Worker)
	if err != nil {
		t.Fatal(err)
	}
	m.LocalSummed(1, 0)
	m.LocalSummed(3, 1) // the group's last member: the sum goes
	want := `
# HELP fpt_local_contributions_total Partitions a local group's leader summed into host sums (its own and its members', FPT_LOCAL_AGGREGATION=on): all but one per host sum are pushes kept off the network.
# TYPE fpt_local_contributions_total counter
fpt_local_contributions_total{role="worker"} 4
# HELP fpt_local_host_sums_total Host sums a local group's leader pushed: one per partition and iteration for the whole group.
# TYPE fpt_local_host_sums_total counter
fpt_local_host_sums_total{role="worker"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "fpt_local_contributions_total", "fpt_local_host_sums_total"); err != nil {
		t.Error(err)
	}
	srv := prometheus.NewRegistry()
	if _, err := metrics.New(srv, node.Server); err != nil {
		t.Fatal(err)
	}
	if n, _ := testutil.GatherAndCount(srv, "fpt_local_contributions_total"); n != 0 {
		t.Errorf("a server has %d local-aggregation series", n)
	}
	var none *metrics.Node
	none.LocalSummed(1, 1)
}
