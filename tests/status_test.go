package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/internal/metricstest"
	"github.com/fptps/fpt/status"
)

// The scheduler's status page and metrics, watched during a real LB run:
// a scheduler, 2 servers and 2 workers training statusIters iterations with a
// simulated compute pause, so that the run lasts long enough to be seen
// moving, and through a probe and the decision after it.

// statusIters is long enough (about 20 s) for the page to be loaded three
// times while the job runs, even on a loaded machine.
const statusIters = 80

var (
	statusURLRe      = regexp.MustCompile(`msg="status page" .*?url=(\S+)`)
	schedMetricsRe   = regexp.MustCompile(`msg="serving metrics" .*?addr=(\S+)`)
	decisionSharesRe = regexp.MustCompile(`(server|worker)(\d+)\(\d+\) ([0-9.]+)%`)
)

// statusRun starts the observed cluster, training iters iterations, and
// returns it with the status page's URL and the scheduler's metrics
// address.
func statusRun(t *testing.T, iters int) (c *cluster, url, metricsAddr string) {
	c = startCluster(t, spec{servers: 2, workers: 2,
		// FPT_LB_AHEAD=0: the page shows a probe and decisions however
		// short the iterations (lb.Config.MinIteration).
		env:     []string{"FPT_LB=on", "FPT_LB_AHEAD=0", "FPT_PARTITION_BYTES=65536", "FPT_STATUS_ADDR=127.0.0.1:0", "FPT_METRICS_ADDR=127.0.0.1:0"},
		appArgs: append([]string{"-iters", strconv.Itoa(iters), "-compute", "250ms", "-quiet"}, lbStressModel...)})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, err := waitOutput(ctx, c.proc("scheduler"), statusURLRe)
	if err != nil {
		c.dump()
		t.Fatal(err)
	}
	a, err := waitOutput(ctx, c.proc("scheduler"), schedMetricsRe)
	if err != nil {
		c.dump()
		t.Fatal(err)
	}
	return c, m[1], a[1]
}

// fetchStatus GETs the page's status.json.
func fetchStatus(url string) (status.Snapshot, error) {
	var s status.Snapshot
	resp, err := http.Get(url + "status.json")
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	return s, json.NewDecoder(resp.Body).Decode(&s)
}

// awaitStatus polls status.json until ok holds.
func awaitStatus(t *testing.T, c *cluster, url, what string, ok func(status.Snapshot) bool) status.Snapshot {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		s, err := fetchStatus(url)
		if err == nil && ok(s) {
			return s
		}
		if time.Now().After(deadline) {
			c.dump()
			t.Fatalf("status.json never showed %s (last: %+v, %v)", what, s, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// chromium finds the browser (scripts/setup.sh installs Debian's).
func chromium(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no chromium on PATH: run scripts/setup.sh (apt-get install chromium)")
	return ""
}

// render loads url in headless Chromium, lets the page poll for a few
// (virtual) seconds, and returns the DOM it rendered; with screenshot set
// it also saves a PNG there.
func render(t *testing.T, url, screenshot string) string {
	t.Helper()
	args := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run",
		"--user-data-dir=" + t.TempDir(), "--virtual-time-budget=3000", "--window-size=1200,1300"}
	if screenshot != "" {
		args = append(args, "--screenshot="+screenshot)
	} else {
		args = append(args, "--dump-dom")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, chromium(t), append(args, url)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium: %v\n%s", err, stderr.String())
	}
	return string(out)
}

// page is what the status page says it rendered: #status's data-*
// attributes.
type page map[string]string

var dataAttrRe = regexp.MustCompile(`data-([a-z-]+)="([^"]*)"`)

func parsePage(t *testing.T, dom string) page {
	t.Helper()
	i := strings.Index(dom, `<main id="status"`)
	if i < 0 {
		t.Fatalf("no #status in the rendered page:\n%s", tail(dom))
	}
	tag := dom[i : i+strings.Index(dom[i:], ">")]
	p := page{}
	for _, m := range dataAttrRe.FindAllStringSubmatch(tag, -1) {
		p[m[1]] = m[2]
	}
	return p
}

func (p page) int(t *testing.T, name string) int {
	t.Helper()
	n, err := strconv.Atoi(p[name])
	if err != nil {
		t.Fatalf("data-%s=%q: %v", name, p[name], err)
	}
	return n
}

func TestStatusPage(t *testing.T) {
	c, url, _ := statusRun(t, statusIters)
	awaitStatus(t, c, url, "3 finished iterations", func(s status.Snapshot) bool { return len(s.Iterations) >= 3 })
	dom := render(t, url, "")
	first := parsePage(t, dom)
	t.Logf("first render: %v", first)
	if e := first["error"]; e != "" {
		t.Fatalf("the page could not fetch its status: %s", e)
	}
	if first.int(t, "updates") < 2 {
		t.Errorf("the page rendered %s updates in 3 s, want it to poll every second", first["updates"])
	}
	if first.int(t, "members") != 5 {
		t.Errorf("the page shows %s members, want 5", first["members"])
	}
	for _, n := range []string{"scheduler", "server 0", "server 1", "worker 0", "worker 1"} {
		if !strings.Contains(dom, `<tr data-node="`+n+`" data-alive="true">`) {
			t.Errorf("the member table has no live row for %s", n)
		}
	}
	// A point per finished iteration: the chart's points run from
	// iteration 0 to the last one shown.
	if pts, last := first.int(t, "points"), first.int(t, "last-iteration"); pts < 3 || pts != last+1 {
		t.Errorf("the chart has %d points up to iteration %d, want one per iteration from 0", pts, last)
	}

	// After the probe, the decision it leads to.
	awaitStatus(t, c, url, "a decision after a probe", func(s status.Snapshot) bool {
		return s.Probes >= 1 && s.Decision != nil && !s.Decision.Probe && len(s.Decisions) >= 2
	})
	// Kept with go test -artifacts (-outputdir DIR), for people to look at.
	shot := filepath.Join(t.ArtifactDir(), "status.png")
	render(t, url, shot)
	if st, err := os.Stat(shot); err != nil || st.Size() == 0 {
		t.Errorf("no screenshot at %s: %v", shot, err)
	} else {
		t.Logf("screenshot: %s", shot)
	}
	dom = render(t, url, "")
	second := parsePage(t, dom)
	t.Logf("second render: %v", second)
	if second["error"] != "" || second["phase"] != "running" {
		t.Fatalf("the second render came after the job: phase %q, error %q; make statusIters longer", second["phase"], second["error"])
	}
	if second.int(t, "points") <= first.int(t, "points") {
		t.Errorf("the chart did not move: %s points, then %s", first["points"], second["points"])
	}
	if pts, last := second.int(t, "points"), second.int(t, "last-iteration"); pts != last+1 {
		t.Errorf("the chart has %d points up to iteration %d, want one per iteration from 0", pts, last)
	}
	if second.int(t, "decisions") < 2 || second.int(t, "marks") < 2 {
		t.Errorf("the chart marks %s decisions (%s drawn), want the probe and the one after it", second["decisions"], second["marks"])
	}
	sum, err := strconv.ParseFloat(second["share-sum"], 64)
	if err != nil || math.Abs(sum-100) > 0.01 {
		t.Errorf("the share bars sum to %s %%, want 100 (%s)", second["share-sum"], second["shares"])
	}
	if bars := strings.Count(dom, `class="bar `); bars < 2 {
		t.Errorf("%d share bars, want one per aggregator", bars)
	}
	c.waitAll(3 * time.Minute)
	checkLBRun(t, c, 2, statusIters, 2)
}

// A scrape of the scheduler during an LB run: the decision version rises,
// and the shares are those of the decision the scheduler logged.
func TestSchedulerMetrics(t *testing.T) {
	c, url, addr := statusRun(t, 30)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	scrape := func() metricstest.Families {
		t.Helper()
		f, err := metricstest.Scrape(ctx, addr)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	awaitStatus(t, c, url, "a finished iteration", func(s status.Snapshot) bool { return len(s.Iterations) >= 1 })
	early := scrape()
	v0, _ := early.Value("fpt_lb_decision_version", nil)
	for role, want := range map[string]float64{"scheduler": 1, "server": 2, "worker": 2} {
		if n, ok := early.Value("fpt_members", map[string]string{"role": role}); !ok || n != want {
			t.Errorf("fpt_members{role=%q} = %v (%v), want %v", role, n, ok, want)
		}
	}
	awaitStatus(t, c, url, "a decision after a probe", func(s status.Snapshot) bool {
		return s.Probes >= 1 && s.Decision != nil && !s.Decision.Probe
	})
	late := scrape()
	v1, _ := late.Value("fpt_lb_decision_version", nil)
	if v1 <= v0 {
		t.Errorf("fpt_lb_decision_version went from %v to %v, want it to rise", v0, v1)
	}
	if p, _ := late.Value("fpt_lb_probes_total", nil); p < 1 {
		t.Errorf("fpt_lb_probes_total = %v after a probe", p)
	}
	if n, _ := late.Value("fpt_iteration_seconds", nil); n < 3 {
		t.Errorf("fpt_iteration_seconds has %v observations, want one per iteration", n)
	}
	for _, who := range []string{"server 0", "server 1", "worker 0", "worker 1"} {
		for _, dir := range []string{"send", "receive"} {
			if b, ok := late.Value("fpt_lb_capacity_bits_per_second", map[string]string{"node": who, "direction": dir}); !ok || b <= 0 {
				t.Errorf("fpt_lb_capacity_bits_per_second{node=%q,direction=%q} = %v (%v), want a measured rate", who, dir, b, ok)
			}
		}
	}
	// The decision line of the version scraped, on the scheduler's stdout.
	line, err := waitOutput(ctx, c.proc("scheduler"), regexp.MustCompile(fmt.Sprintf(`lb decision v%d from iteration \d+:.*`, int(v1))))
	if err != nil {
		t.Fatal(err)
	}
	split, _, _ := strings.Cut(line[0], " (") // the shares come before the reason
	logged := decisionSharesRe.FindAllStringSubmatch(split, -1)
	if len(logged) == 0 {
		t.Fatalf("no shares in %q", line[0])
	}
	if shown := len(late["fpt_lb_share"].GetMetric()); shown != len(logged) {
		t.Errorf("fpt_lb_share has %d nodes, the logged decision %d: %s", shown, len(logged), split)
	}
	for _, m := range logged {
		want, _ := strconv.ParseFloat(m[3], 64)
		got, ok := late.Value("fpt_lb_share", map[string]string{"node": m[1] + " " + m[2]})
		if !ok || math.Abs(100*got-want) > 0.05+1e-9 {
			t.Errorf("fpt_lb_share{node=\"%s %s\"} = %v, the logged decision says %v%%", m[1], m[2], got, want)
		}
	}
	c.waitAll(3 * time.Minute)
}
