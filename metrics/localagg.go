package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fptps/fpt/localagg"
)

// The workers' local groups (FPT_LOCAL_AGGREGATION): the scheduler's
// gauge of each host's workers, a worker's counts of what it summed on
// its host.

func newLocalGroups() *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "fpt_local_group_workers",
		Help: "Workers of each host's local group, by the host they name (FPT_HOST_ID, else their address); 1: alone on the host.",
	}, []string{"host"})
}

func newLocalCounters() (contributions, hostSums prometheus.Counter) {
	return prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fpt_local_contributions_total",
			Help: "Partitions a local group's leader summed into host sums (its own and its members', FPT_LOCAL_AGGREGATION=on): all but one per host sum are pushes kept off the network.",
		}), prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fpt_local_host_sums_total",
			Help: "Host sums a local group's leader pushed: one per partition and iteration for the whole group.",
		})
}

// LocalGroups records the workers' local groups, replacing any recorded.
func (m *Scheduler) LocalGroups(groups []localagg.Group) {
	if m == nil {
		return
	}
	m.groups.Reset()
	for _, g := range groups {
		m.groups.WithLabelValues(g.Host).Set(float64(len(g.Workers)))
	}
}

// LocalSummed records what a leader summed on its host: contributions
// added into host sums, and host sums pushed.
func (m *Node) LocalSummed(contributions, hostSums int) {
	if m == nil {
		return
	}
	m.localContribs.Add(float64(contributions))
	m.localHostSums.Add(float64(hostSums))
}
