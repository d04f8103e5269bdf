package metrics_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fptps/fpt/metrics"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/van"
)

// fakeVan is a van's figures, fixed.
type fakeVan struct {
	stats  []van.PeerStats
	queued int64
}

func (f *fakeVan) Stats() []van.PeerStats { return f.stats }
func (f *fakeVan) QueuedBytes() int64     { return f.queued }

var vanMetrics = []string{
	"fpt_van_sent_bytes_total", "fpt_van_received_bytes_total",
	"fpt_van_sent_frames_total", "fpt_van_received_frames_total",
	"fpt_van_received_payload_bytes_total",
	"fpt_van_busy_seconds_total", "fpt_pool_queued_bytes",
}

// TestVanCollector: the van's per-peer figures are summed by the peer's
// role (two servers and a worker here; the scheduler's id is ignored), and
// every series exists at zero before anything moved.
func TestVanCollector(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := metrics.New(reg, node.Worker)
	if err != nil {
		t.Fatal(err)
	}
	zero, err := os.ReadFile("testdata/zero.txt")
	if err != nil {
		t.Fatal(err)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(string(zero)), vanMetrics...); err != nil {
		t.Errorf("before Watch: %v", err)
	}
	m.Watch(&fakeVan{queued: 4096, stats: []van.PeerStats{
		{Peer: node.SchedulerID, SentBytes: 1 << 40},
		{Peer: node.ServerID(0), SentBytes: 1000, ReceivedBytes: 2000, SentFrames: 3, ReceivedFrames: 4, ReceivedInPlaceBytes: 1500, ReceivedCopiedBytes: 212, SentBusy: time.Second, ReceivedBusy: 2 * time.Second},
		{Peer: node.ServerID(1), SentBytes: 10, ReceivedBytes: 20, SentFrames: 1, ReceivedFrames: 2, ReceivedCopiedBytes: 8, SentBusy: 500 * time.Millisecond},
		{Peer: node.WorkerID(1), SentBytes: 72, ReceivedBytes: 144, SentFrames: 1, ReceivedFrames: 2, ReceivedInPlaceBytes: 72, ReceivedBusy: 250 * time.Millisecond},
	}})
	want, err := os.ReadFile("testdata/watched.txt")
	if err != nil {
		t.Fatal(err)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(string(want)), vanMetrics...); err != nil {
		t.Error(err)
	}
}

func TestLatencies(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := metrics.New(reg, node.Worker)
	if err != nil {
		t.Fatal(err)
	}
	m.ObservePush(3 * time.Millisecond)
	m.ObservePush(2 * time.Second)
	m.ObservePull(time.Millisecond)
	for name, want := range map[string]int{"fpt_push_latency_seconds": 1, "fpt_pull_latency_seconds": 1} {
		if n, err := testutil.GatherAndCount(reg, name); err != nil || n != want {
			t.Errorf("%s: %d series (%v), want %d", name, n, err, want)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]uint64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if h := m.GetHistogram(); h != nil {
				counts[mf.GetName()] = h.GetSampleCount()
				if got := m.GetLabel()[0]; got.GetName() != "role" || got.GetValue() != "worker" {
					t.Errorf("%s: label %v, want role=worker", mf.GetName(), got)
				}
			}
		}
	}
	if counts["fpt_push_latency_seconds"] != 2 || counts["fpt_pull_latency_seconds"] != 1 {
		t.Errorf("sample counts %v, want push 2 and pull 1", counts)
	}
}

// TestRoles: servers have the van's metrics but no latencies; the
// scheduler has neither; a nil Node records nothing without failing.
func TestRoles(t *testing.T) {
	for _, tc := range []struct {
		role      node.Role
		van, push bool
	}{{node.Server, true, false}, {node.Scheduler, false, false}, {node.Worker, true, true}} {
		reg := prometheus.NewPedanticRegistry()
		m, err := metrics.New(reg, tc.role)
		if err != nil {
			t.Fatal(err)
		}
		m.ObservePush(time.Second)
		if n, _ := testutil.GatherAndCount(reg, "fpt_van_sent_bytes_total"); (n > 0) != tc.van {
			t.Errorf("%s: %d van series", tc.role, n)
		}
		if n, _ := testutil.GatherAndCount(reg, "fpt_push_latency_seconds"); (n > 0) != tc.push {
			t.Errorf("%s: %d push latency series", tc.role, n)
		}
	}
	var none *metrics.Node
	none.ObservePush(time.Second)
	none.ObservePull(time.Second)
	none.Watch(&fakeVan{})
	// Registering twice on one registry is an error, not a panic.
	reg := prometheus.NewRegistry()
	if _, err := metrics.New(reg, node.Worker); err != nil {
		t.Fatal(err)
	}
	if _, err := metrics.New(reg, node.Worker); err == nil {
		t.Error("second registration of the same metrics accepted")
	}
}

func TestServe(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg, node.Server)
	if err != nil {
		t.Fatal(err)
	}
	m.Watch(&fakeVan{stats: []van.PeerStats{{Peer: node.WorkerID(0), ReceivedBytes: 777}}})
	srv, err := metrics.Serve("127.0.0.1:0", reg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	want := `
# HELP fpt_van_received_bytes_total Bytes the van read from peers, frame headers included.
# TYPE fpt_van_received_bytes_total counter
fpt_van_received_bytes_total{peer_role="server",role="server"} 0
fpt_van_received_bytes_total{peer_role="worker",role="server"} 777
`
	if err := testutil.ScrapeAndCompare("http://"+srv.Addr()+"/metrics", strings.NewReader(want), "fpt_van_received_bytes_total"); err != nil {
		t.Error(err)
	}
	// The same address again: a clear error naming the setting.
	if _, err := metrics.Serve(srv.Addr(), reg, testLogger(t)); err == nil || !strings.Contains(err.Error(), "FPT_METRICS_ADDR") || !strings.Contains(err.Error(), "address already in use") {
		t.Errorf("second Serve on %s: %v", srv.Addr(), err)
	}
}
