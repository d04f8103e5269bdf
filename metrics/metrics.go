// Package metrics exports a node's figures to Prometheus: what its van
// moved (bytes, frames and busy time, by direction and by the role of the
// peer; received payload bytes by whether they were read in place), how much waits in its send pool, and how long workers' pushes and
// pulls take.
//
// Everything is registered on the registry the caller passes in; nothing
// is global. The van's figures are read from van.Transport.Stats when
// scraped, so the data path pays nothing for them. Labels are few and
// bounded: role (this node's), direction and peer_role, never a node id or
// a key.
package metrics

import (
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fptps/fpt/httpserve"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/van"
)

// Van is what the collector reads from the data plane; van.Transport has
// both methods.
type Van interface {
	Stats() []van.PeerStats
	QueuedBytes() int64
}

// Node holds one node's metrics. A nil *Node is valid and records nothing,
// so code paths need not check whether metrics are on.
type Node struct {
	push, pull prometheus.Histogram
	rejected   *prometheus.CounterVec
	// A local group leader's (FPT_LOCAL_AGGREGATION).
	localContribs, localHostSums prometheus.Counter

	mu  sync.Mutex
	van Van // nil until Watch
}

// New registers a node's metrics on reg, labelled with the node's role:
// the van's for servers and workers, the latencies for workers. The
// scheduler has neither (it has no data plane).
func New(reg prometheus.Registerer, role node.Role) (*Node, error) {
	reg = prometheus.WrapRegistererWith(prometheus.Labels{"role": role.String()}, reg)
	// From 100 µs (a small tensor on loopback) to a minute (a large one
	// over a slow link).
	latencyBuckets := prometheus.ExponentialBucketsRange(100e-6, 60, 18)
	m := &Node{
		push: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "fpt_push_latency_seconds",
			Help:    "Time from a worker's FPTPush or Push call until its values were sent.",
			Buckets: latencyBuckets,
		}),
		pull: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "fpt_pull_latency_seconds",
			Help:    "Time from a worker's FPTPull or Pull call until its buffer held the result.",
			Buckets: latencyBuckets,
		}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fpt_rejected_connections_total",
			Help: "Connections or messages refused before they could do anything: a peer without the secret, a stranger, a malformed or oversized frame.",
		}, []string{"plane", "reason"}),
	}
	m.localContribs, m.localHostSums = newLocalCounters()
	cs := []prometheus.Collector{m.rejected} // every role accepts connections
	switch role {
	case node.Worker:
		cs = append(cs, (*vanCollector)(m), m.push, m.pull, m.localContribs, m.localHostSums)
	case node.Server:
		cs = append(cs, (*vanCollector)(m))
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("metrics: register: %w", err)
		}
	}
	return m, nil
}

// Watch makes the collector read v from now on.
func (m *Node) Watch(v Van) {
	if m == nil {
		return
	}
	m.mu.Lock()
	m.van = v
	m.mu.Unlock()
}

// ObservePush records one push's latency.
func (m *Node) ObservePush(d time.Duration) {
	if m != nil {
		m.push.Observe(d.Seconds())
	}
}

// ObservePull records one pull's latency.
func (m *Node) ObservePull(d time.Duration) {
	if m != nil {
		m.pull.Observe(d.Seconds())
	}
}

var (
	descSentBytes = prometheus.NewDesc("fpt_van_sent_bytes_total",
		"Bytes the van wrote to peers, frame headers included.", []string{"peer_role"}, nil)
	descRecvBytes = prometheus.NewDesc("fpt_van_received_bytes_total",
		"Bytes the van read from peers, frame headers included.", []string{"peer_role"}, nil)
	descSentFrames = prometheus.NewDesc("fpt_van_sent_frames_total",
		"Frames the van wrote to peers.", []string{"peer_role"}, nil)
	descRecvFrames = prometheus.NewDesc("fpt_van_received_frames_total",
		"Frames the van read from peers.", []string{"peer_role"}, nil)
	descRecvPayload = prometheus.NewDesc("fpt_van_received_payload_bytes_total",
		"Payload bytes the van read from peers: path=\"in_place\" straight into the receiving code's buffer, path=\"copied\" into the van's own buffer and copied from there.",
		[]string{"peer_role", "path"}, nil)
	descBusy = prometheus.NewDesc("fpt_van_busy_seconds_total",
		"Time the van spent moving frames (idle gaps excluded): bytes over busy time is what a link carries when in use.",
		[]string{"direction", "peer_role"}, nil)
	descPool = prometheus.NewDesc("fpt_pool_queued_bytes",
		"Bytes waiting in the send pool.", nil, nil)
)

// vanCollector reads the watched van at scrape time.
type vanCollector Node

func (c *vanCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSentBytes, descRecvBytes, descSentFrames, descRecvFrames, descRecvPayload, descBusy, descPool} {
		ch <- d
	}
}

// totals is what moved between this node and the peers of one role.
type totals struct {
	sentBytes, recvBytes, sentFrames, recvFrames uint64
	recvInPlace, recvCopied                      uint64
	sentBusy, recvBusy                           time.Duration
}

func (c *vanCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	v := c.van
	c.mu.Unlock()
	// Every series exists from the start, at zero, so that rate() has a
	// first sample.
	byRole := map[node.Role]*totals{node.Server: {}, node.Worker: {}}
	var queued int64
	if v != nil {
		for _, st := range v.Stats() {
			r, ok := node.ID(st.Peer).Role()
			if !ok || byRole[r] == nil {
				continue // the scheduler has no data connection
			}
			t := byRole[r]
			t.sentBytes += st.SentBytes
			t.recvBytes += st.ReceivedBytes
			t.sentFrames += st.SentFrames
			t.recvFrames += st.ReceivedFrames
			t.recvInPlace += st.ReceivedInPlaceBytes
			t.recvCopied += st.ReceivedCopiedBytes
			t.sentBusy += st.SentBusy
			t.recvBusy += st.ReceivedBusy
		}
		queued = v.QueuedBytes()
	}
	for r, t := range byRole {
		role := r.String()
		ch <- prometheus.MustNewConstMetric(descSentBytes, prometheus.CounterValue, float64(t.sentBytes), role)
		ch <- prometheus.MustNewConstMetric(descRecvBytes, prometheus.CounterValue, float64(t.recvBytes), role)
		ch <- prometheus.MustNewConstMetric(descSentFrames, prometheus.CounterValue, float64(t.sentFrames), role)
		ch <- prometheus.MustNewConstMetric(descRecvFrames, prometheus.CounterValue, float64(t.recvFrames), role)
		ch <- prometheus.MustNewConstMetric(descRecvPayload, prometheus.CounterValue, float64(t.recvInPlace), role, "in_place")
		ch <- prometheus.MustNewConstMetric(descRecvPayload, prometheus.CounterValue, float64(t.recvCopied), role, "copied")
		ch <- prometheus.MustNewConstMetric(descBusy, prometheus.CounterValue, t.sentBusy.Seconds(), "sent", role)
		ch <- prometheus.MustNewConstMetric(descBusy, prometheus.CounterValue, t.recvBusy.Seconds(), "received", role)
	}
	ch <- prometheus.MustNewConstMetric(descPool, prometheus.GaugeValue, float64(queued))
}

// Server serves a registry over HTTP at /metrics, and the probes a
// cluster engine asks: /healthz and /readyz.
type Server struct{ *httpserve.Server }

// Serve listens on addr ("host:port"; port 0 picks one) and serves g at
// /metrics until Close. A port in use is an error here, not later. Its
// /readyz always answers ready; ServeProbed's asks.
func Serve(addr string, g prometheus.Gatherer, log *slog.Logger) (*Server, error) {
	return ServeProbed(addr, g, nil, log)
}

// ServeProbed is Serve, with the probes a cluster engine asks (Kubernetes'
// liveness and readiness): /healthz answers 200 while the process serves;
// /readyz answers 200 when ready returns nil (nil ready: always), else 503
// with its reason, so that a node is taken for ready only while it is a
// member of a running cluster.
func ServeProbed(addr string, g prometheus.Gatherer, ready func() error, log *slog.Logger) (*Server, error) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if ready != nil {
			if err := ready(); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintln(w, "not ready:", err)
				return
			}
		}
		fmt.Fprintln(w, "ready")
	})
	s, err := httpserve.Serve("FPT_METRICS_ADDR", addr, mux, log)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	log.Info("serving metrics", "addr", s.Addr())
	return &Server{s}, nil
}

// Rejected counts a connection or message refused on plane ("control" or
// "data") for reason, a short fixed word (e.g. "auth", "stranger",
// "oversize", "malformed", "stalled"): never a peer's address or id,
// which would make the label set unbounded.
func (n *Node) Rejected(plane, reason string) {
	if n == nil {
		return
	}
	n.rejected.WithLabelValues(plane, reason).Inc()
}
