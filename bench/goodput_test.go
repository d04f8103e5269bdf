package bench

import (
	"io"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/van"
)

func TestShapes(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		want    []shape
		wantErr string
	}{
		// The default moves every tensor byte over TCP: no 1x1 with the LB on.
		{nil, []shape{{1, 1, false}, {2, 2, false}, {2, 2, true}}, ""},
		{[]string{"--json", "--van", "epoll"}, []shape{{1, 1, false}, {2, 2, false}, {2, 2, true}}, ""},
		{[]string{"--workers", "3"}, []shape{{3, 1, false}}, ""},
		{[]string{"--servers", "2", "--lb", "on"}, []shape{{1, 2, true}}, ""},
		{[]string{"--lb", "off"}, []shape{{1, 1, false}}, ""},
		{[]string{"--peers", "1,2,4,8"}, []shape{{1, 1, false}, {2, 2, false}, {4, 4, false}, {8, 8, false}}, ""},
		{[]string{"--peers", " 2, 4 "}, []shape{{2, 2, false}, {4, 4, false}}, ""},
		{[]string{"--lb", "maybe"}, nil, "--lb"},
		{[]string{"--peers", "1,0"}, nil, `"0"`},
		{[]string{"--peers", "x"}, nil, `"x"`},
		{[]string{"--peers", ","}, nil, "no counts"},
	} {
		f := newFlags(io.Discard)
		if err := f.fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		got, err := f.shapes()
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: error %v, want one with %q", tc.args, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%q: shapes %v, %v; want %v", tc.args, got, err, tc.want)
		}
	}
}

func TestTCPBytes(t *testing.T) {
	s0, s1, w1 := node.ServerID(0), node.ServerID(1), node.WorkerID(1)
	before := []van.PeerStats{
		{Peer: s0, SentBytes: 100, ReceivedBytes: 50},
		{Peer: w1, SentBytes: 10, ReceivedBytes: 7},
	}
	after := []van.PeerStats{
		{Peer: s0, SentBytes: 1100, ReceivedBytes: 1050},
		{Peer: s1, SentBytes: 500, ReceivedBytes: 400}, // connected meanwhile
		{Peer: w1, SentBytes: 210, ReceivedBytes: 9007},
	}
	// Sent to everyone (1000 + 500 + 200), received from servers only
	// (1000 + 400): what a worker received from a worker, that worker
	// counts as sent.
	if got, want := tcpBytes(before, after), uint64(1000+500+200+1000+400); got != want {
		t.Errorf("tcpBytes = %d, want %d", got, want)
	}
	if got := tcpBytes(after, after); got != 0 {
		t.Errorf("tcpBytes with nothing moved = %d", got)
	}
	if got := tcpBytes(nil, nil); got != 0 {
		t.Errorf("tcpBytes(nil, nil) = %d", got)
	}
}

func TestSumReports(t *testing.T) {
	r, err := sumReports([]workerReport{
		{Rank: 1, Seconds: 9, TCPBytes: 300},
		{Rank: 0, Seconds: 1.5, TCPBytes: 200},
	})
	if err != nil || r.timed != 1500*time.Millisecond || r.tcpBytes != 500 {
		t.Errorf("sumReports = %+v, %v; want rank 0's 1.5s and 500 bytes", r, err)
	}
	for _, bad := range [][]workerReport{nil, {{Rank: 1, Seconds: 2}}, {{Rank: 0}}} {
		if _, err := sumReports(bad); err == nil {
			t.Errorf("sumReports(%+v): no error", bad)
		}
	}
}

func TestStatsArithmetic(t *testing.T) {
	for _, tc := range []struct {
		name      string
		got, want float64
	}{
		{"4 CPU s over 2 GB", cpuPerGB(4*time.Second, 2e9), 2},
		{"250 ms over 500 MB", cpuPerGB(250*time.Millisecond, 5e8), 0.5},
		{"nothing moved", cpuPerGB(time.Second, 0), 0},
		{"1 GB in 1 s", gbps(1e9, time.Second), 8},
		{"125 MB in 500 ms", gbps(125e6, 500*time.Millisecond), 2},
		{"median odd", median([]float64{3, 1, 2}), 2},
		{"median even", median([]float64{4, 1, 3, 2}), 2.5},
		{"median none", median(nil), 0},
		{"round3", round3(2.0254), 2.025},
		{"ms", ms(1500 * time.Microsecond), 1.5},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, tc.got, tc.want)
		}
	}
	xs := []float64{3, 1, 2}
	median(xs)
	if !slices.Equal(xs, []float64{3, 1, 2}) {
		t.Errorf("median sorted its input: %v", xs)
	}
}

func TestGoodputTable(t *testing.T) {
	rows := [][]string{
		goodputResult{Van: "epoll", Workers: 1, Servers: 1, LB: "off", TensorBytes: 64 << 20, Iters: 50,
			GoodputGbps: 12.345, RawTCPGbps: 20, Ratio: 0.617, ClusterGoodputGbps: 12.345, TensorTrafficBytes: 1000, TCPBytes: 1002,
			CPUPerGB: 0.81234, RawTCPCPUPerGB: 0.4, RawTCPTensorCPUPerGB: 0.6, TimedCPUPerGB: 0.45678, WorkersCPUPerGB: 0.5, ServersCPUPerGB: 0.3, SchedulerCPUPerGB: 0.01234}.row(),
		goodputResult{Van: "netconn", Workers: 2, Servers: 2, LB: "on", TensorBytes: 1 << 20, Iters: 5}.row(),
		goodputResult{Van: "epoll", Workers: 1, Servers: 1, LB: "off", TensorBytes: 1 << 20, Iters: 5, Secret: "on",
			GoodputVsOff: 0.98765, CPUPerGBVsOff: 1.0123}.row(),
	}
	var sb strings.Builder
	if err := writeTable(&sb, goodputHeader, rows); err != nil {
		t.Fatal(err)
	}
	checkTable(t, sb.String(), [][]string{
		goodputHeader,
		{"epoll", "1", "1", "off", "64 MiB", "50", "12.35", "20.00", "0.62", "12.35", "1.002", "0.812", "0.400", "0.600", "0.457", "0.500/0.300/0.012", "off", "-"},
		{"netconn", "2", "2", "on", "1 MiB", "5", "0.00", "0.00", "0.00", "0.00", "-", "0.000", "0.000", "0.000", "0.000", "0.000/0.000/0.000", "off", "-"},
		{"epoll", "1", "1", "off", "1 MiB", "5", "0.00", "0.00", "0.00", "0.00", "-", "0.000", "0.000", "0.000", "0.000", "0.000/0.000/0.000", "on", "x0.988, x1.012"},
	})
}

// checkTable fails t unless table has want's lines, each line's columns
// aligned: each starting where the header's (want[0]) does.
func checkTable(t *testing.T, table string, want [][]string) {
	t.Helper()
	lines := strings.Split(strings.TrimRight(table, "\n"), "\n")
	if len(lines) != len(want) {
		t.Fatalf("table of %d lines, want %d:\n%s", len(lines), len(want), table)
	}
	for i, w := range want {
		if got := splitColumns(lines[i], lines[0]); !slices.Equal(got, w) {
			t.Errorf("line %d: columns %q, want %q", i, got, w)
		}
	}
}

// splitColumns cuts line at the offsets where header's columns start
// (two spaces or more apart) and trims each piece.
func splitColumns(line, header string) []string {
	var starts []int
	for i := range header {
		if i == 0 || (header[i] != ' ' && strings.HasSuffix(header[:i], "  ")) {
			starts = append(starts, i)
		}
	}
	var cols []string
	for k, s := range starts {
		end := len(line)
		if k+1 < len(starts) {
			end = min(starts[k+1], len(line))
		}
		if s > len(line) {
			cols = append(cols, "")
			continue
		}
		cols = append(cols, strings.TrimSpace(line[s:end]))
	}
	return cols
}

// The secret's cost is the mean of the secret-on runs over the mean of the
// secret-off runs, whatever their order; a zero baseline gives no ratio.
func TestCompareSecret(t *testing.T) {
	rows := []goodputResult{
		{Secret: "off", GoodputGbps: 10, CPUPerGB: 1},
		{Secret: "on", GoodputGbps: 9, CPUPerGB: 1.1},
		{Secret: "on", GoodputGbps: 9.5, CPUPerGB: 1.2},
		{Secret: "off", GoodputGbps: 10.5, CPUPerGB: 1.1},
	}
	compareSecret(rows)
	for i, r := range rows {
		switch {
		case r.Secret == "off" && (r.GoodputVsOff != 0 || r.CPUPerGBVsOff != 0):
			t.Errorf("row %d (secret off) got ratios %v, %v", i, r.GoodputVsOff, r.CPUPerGBVsOff)
		case r.Secret == "on" && (math.Abs(r.GoodputVsOff-18.5/20.5) > 1e-12 || math.Abs(r.CPUPerGBVsOff-2.3/2.1) > 1e-12):
			t.Errorf("row %d: goodput x%v, CPU x%v; want x%v, x%v", i, r.GoodputVsOff, r.CPUPerGBVsOff, 18.5/20.5, 2.3/2.1)
		}
	}
	zero := []goodputResult{{Secret: "off"}, {Secret: "on", GoodputGbps: 9}}
	compareSecret(zero)
	if zero[1].GoodputVsOff != 0 || zero[1].CPUPerGBVsOff != 0 {
		t.Errorf("a zero baseline gave ratios %v, %v", zero[1].GoodputVsOff, zero[1].CPUPerGBVsOff)
	}
}

// The bench's clusters get a fresh secret each (long enough for config),
// or none at all, overriding whatever the caller's environment says.
func TestClusterSecretEnv(t *testing.T) {
	off, err := clusterSecretEnv(false)
	if err != nil || !slices.Equal(off, []string{"FPT_CLUSTER_SECRET=", "FPT_CLUSTER_SECRET_FILE="}) {
		t.Fatalf("off: %q, %v", off, err)
	}
	a, err := clusterSecretEnv(true)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := clusterSecretEnv(true)
	v, ok := strings.CutPrefix(a[0], "FPT_CLUSTER_SECRET=")
	if !ok || len(v) < config.MinSecretBytes || a[0] == b[0] {
		t.Errorf("on: %q then %q: want a fresh secret of at least %d bytes", a, b, config.MinSecretBytes)
	}
}

// TestPump: raw TCP's pumps go round their buffer in calls of at most
// pumpCall bytes, ending at the buffer's end, until volume bytes moved,
// however few each call takes.
func TestPump(t *testing.T) {
	tests := []struct {
		name          string
		buf           int
		volume        int64
		take          int // the most bytes one call moves
		wantCalls     int
		wantLastRound int // bytes written in the last pass over buf
	}{
		{"round a small buffer", 10, 25, 100, 3, 5},
		{"short calls", 10, 25, 4, 8, 5},
		{"calls bounded", 3 * pumpCall, pumpCall + 1, 3 * pumpCall, 2, pumpCall + 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			buf := make([]byte, tt.buf)
			calls, moved := 0, byte(0)
			op := func(b []byte) (int, error) {
				calls++
				if len(b) == 0 || len(b) > pumpCall {
					t.Fatalf("call %d of %d bytes", calls, len(b))
				}
				n := min(len(b), tt.take)
				for i := range n {
					moved++
					b[i] = moved
				}
				return n, nil
			}
			if err := pump(tt.volume, buf, op); err != nil {
				t.Fatal(err)
			}
			if calls != tt.wantCalls {
				t.Errorf("%d calls, want %d", calls, tt.wantCalls)
			}
			// The last pass wrote bytes (volume-wantLastRound, volume] in
			// order from the buffer's start.
			for i := range tt.wantLastRound {
				if want := byte(tt.volume - int64(tt.wantLastRound) + int64(i) + 1); buf[i] != want {
					t.Fatalf("buf[%d] = %d, want %d: not written round the buffer", i, buf[i], want)
				}
			}
		})
	}
	for _, c := range []struct{ tensor, want int64 }{{4, pumpCall}, {64 << 20, 64 << 20}, {1 << 40, maxTensorBuffer}} {
		if got := tensorBuffer(c.tensor); int64(got) != c.want {
			t.Errorf("tensorBuffer(%d) = %d, want %d", c.tensor, got, c.want)
		}
	}
}
