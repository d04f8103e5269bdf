package metrics

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/status"
)

// Scheduler holds the scheduler's metrics: the cluster's members, the
// load balancer's decisions and measurements, and the iterations. The
// node label is a role and rank, as "server 0" (status.NodeName): bounded
// by the cluster's size, and the same across runs, unlike an address. A
// nil *Scheduler records nothing.
type Scheduler struct {
	version    prometheus.Gauge
	share      *prometheus.GaugeVec
	capacity   *prometheus.GaugeVec
	iteration  prometheus.Gauge
	iterations prometheus.Histogram
	probes     prometheus.Counter
	guards     prometheus.Counter
	guardsSeen uint64 // the Balancer's count guards was last brought to
	members    *prometheus.GaugeVec
	membership prometheus.Gauge
	groups     *prometheus.GaugeVec
}

// NewScheduler registers the scheduler's metrics on reg.
func NewScheduler(reg prometheus.Registerer) (*Scheduler, error) {
	m := &Scheduler{
		version: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fpt_lb_decision_version",
			Help: "Version of the latest LB decision issued (0: the initial even split over the servers).",
		}),
		share: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "fpt_lb_share",
			Help: "Fraction of every tensor the node aggregates under the latest LB decision (absent: none).",
		}, []string{"node"}),
		capacity: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "fpt_lb_capacity_bits_per_second",
			Help: "Highest rate the LB measured on the node's send or receive side in its current window.",
		}, []string{"node", "direction"}),
		iteration: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fpt_iteration",
			Help: "The latest iteration every worker has finished (the LB's count; iteration 0 is the init round).",
		}),
		iterations: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "fpt_iteration_seconds",
			Help: "Time between one iteration's end and the next's, as the scheduler sees the workers' reports.",
			// 1 ms (a tiny model on loopback) to 10 min.
			Buckets: prometheus.ExponentialBucketsRange(1e-3, 600, 20),
		}),
		probes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fpt_lb_probes_total",
			Help: "Probes the LB started (every node aggregating, shaping off, capacities measured).",
		}),
		guards: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fpt_lb_guards_total",
			Help: "Times the LB went back to the even split over the servers because a balanced split measured slower than it.",
		}),
		members: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "fpt_members",
			Help: "Nodes in the cluster, by role, once every one registered; then as servers and workers join or leave a running job.",
		}, []string{"role"}),
		membership: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fpt_membership_version",
			Help: "Membership changes since the cluster started (0: the nodes it started with).",
		}),
		groups: newLocalGroups(),
	}
	for _, c := range []prometheus.Collector{m.version, m.share, m.capacity, m.iteration, m.iterations, m.probes, m.guards, m.members, m.membership, m.groups} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("metrics: register: %w", err)
		}
	}
	return m, nil
}

// Members records the node table.
func (m *Scheduler) Members(table []node.Info) {
	if m == nil {
		return
	}
	counts := map[node.Role]int{node.Scheduler: 0, node.Server: 0, node.Worker: 0}
	for _, info := range table {
		counts[info.Role]++
	}
	for r, n := range counts {
		m.members.WithLabelValues(r.String()).Set(float64(n))
	}
}

// Membership records the node table after membership change number
// version.
func (m *Scheduler) Membership(table []node.Info, version int) {
	if m == nil {
		return
	}
	m.Members(table)
	m.membership.Set(float64(version))
}

// Decision records a new decision; probe says it starts a probe.
func (m *Scheduler) Decision(d lb.Decision, probe bool) {
	if m == nil {
		return
	}
	m.version.Set(float64(d.Version))
	m.share.Reset() // nodes the decision leaves out aggregate nothing
	for i, a := range d.Aggregators {
		if i < len(d.Shares) {
			m.share.WithLabelValues(status.NodeName(a)).Set(d.Shares[i])
		}
	}
	if probe {
		m.probes.Inc()
	}
}

// Guards records the LB's count of its guard's fall-backs to the even
// split (lb.Balancer.Guards).
func (m *Scheduler) Guards(total uint64) {
	if m == nil || total <= m.guardsSeen {
		return
	}
	m.guards.Add(float64(total - m.guardsSeen))
	m.guardsSeen = total
}

// Capacities records the LB's measured rates, in bytes per second.
func (m *Scheduler) Capacities(up, down map[node.ID]float64) {
	if m == nil {
		return
	}
	for dir, rates := range map[string]map[node.ID]float64{"send": up, "receive": down} {
		for id, r := range rates {
			m.capacity.WithLabelValues(status.NodeName(id), dir).Set(8 * r)
		}
	}
}

// Iteration records that iteration i finished, d after the one before.
func (m *Scheduler) Iteration(i uint64, d time.Duration) {
	if m == nil {
		return
	}
	m.iteration.Set(float64(i))
	m.iterations.Observe(d.Seconds())
}
