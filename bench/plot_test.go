package bench

import (
	"bytes"
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fptps/fpt/svgplot"
)

var (
	plotLB = lbResult{Scenario: scenarioSlowServer, Rate: "400mbit", SlowRate: "100mbit", Servers: 2, Workers: 2,
		EvenItersMs: []float64{410, 400, 405}, LBItersMs: []float64{400, 250, 240}, BoundIterMs: 200,
		LBDecisions: 2, LBDecisionMarks: []lbDecisionMark{{1, 2}, {2, 3}}}
	plotPeers = []goodputResult{
		{Van: "epoll", Workers: 1, Servers: 1, LB: "off", GoodputGbps: 9, RawTCPGbps: 12, CPUPerGB: 0.4, RawTCPCPUPerGB: 0.2},
		{Van: "epoll", Workers: 2, Servers: 2, LB: "off", GoodputGbps: 8, RawTCPGbps: 12, CPUPerGB: 0.5, RawTCPCPUPerGB: 0.2},
	}
	plotShaping = shapingResult{Scenario: scenarioShaping, Rate: "200mbit", Weights: [2]float64{3, 1}, ByteRatio: 2.9}
)

// What each experiment's results become: LB scenarios a chart of
// iteration times with the bound and the decisions; goodput bars; a
// --peers run also its CPU-per-peer chart and table; others a table.
func TestPlotPanels(t *testing.T) {
	panels := plotPanels([]tableRow{plotLB, plotPeers[0], plotPeers[1], plotShaping}, shapingHeader)
	if len(panels) != 5 {
		t.Fatalf("%d panels, want LB chart, goodput bars, peers chart and table, results table: %#v", len(panels), panels)
	}
	lc, ok := panels[0].(svgplot.LineChart)
	if !ok || len(lc.Series) != 3 || len(lc.Marks) != 2 || lc.Marks[1] != (svgplot.Mark{X: 3, Label: "v2"}) {
		t.Errorf("LB chart %+v: want off, on and bound, marks v1 at 2 and v2 at 3", panels[0])
	}
	if lc.Series[1].X[0] != 1 || lc.Series[2].Y[0] != 200 {
		t.Errorf("LB chart: iterations from 1 and the bound at 200 ms: %+v", lc.Series)
	}
	if bc, ok := panels[1].(svgplot.BarChart); !ok || len(bc.Groups) != 2 || bc.Values[1][0] != 8 || bc.Values[1][1] != 12 {
		t.Errorf("goodput bars %+v", panels[1])
	}
	if tb, ok := panels[3].(svgplot.Table); !ok || len(tb.Rows) != 2 || tb.Rows[1][2] != "0.500" {
		t.Errorf("peers table %+v", panels[3])
	}
	if tb, ok := panels[4].(svgplot.Table); !ok || len(tb.Rows) != 1 || tb.Rows[0][0] != scenarioShaping {
		t.Errorf("results table %+v", panels[4])
	}
	// One goodput configuration is no peers table.
	if n := len(plotPanels([]tableRow{plotPeers[0]}, goodputHeader)); n != 1 {
		t.Errorf("one goodput row: %d panels, want its bars only", n)
	}
}

// --json lines read back into the same results; anything else is a clear
// error.
func TestReadResults(t *testing.T) {
	var b bytes.Buffer
	for _, r := range []tableRow{plotLB, plotPeers[0], plotShaping, priorityResult{Scenario: scenarioPriority, Rounds: 3}} {
		if err := writeJSONLine(&b, r); err != nil {
			t.Fatal(err)
		}
	}
	rs, err := readResults(strings.NewReader(b.String() + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 4 {
		t.Fatalf("%d results, want 4", len(rs))
	}
	if lr, ok := rs[0].(lbResult); !ok || len(lr.LBDecisionMarks) != 2 || lr.LBItersMs[2] != 240 {
		t.Errorf("LB result read back as %+v", rs[0])
	}
	if _, ok := rs[1].(goodputResult); !ok {
		t.Errorf("goodput result read back as %T", rs[1])
	}
	if _, ok := rs[3].(priorityResult); !ok {
		t.Errorf("priority result read back as %T", rs[3])
	}
	for name, in := range map[string]string{
		"not JSON":         "hello\n",
		"unknown scenario": `{"scenario":"nope"}` + "\n",
		"empty":            "",
		"bad field":        `{"van":"epoll","workers":"two"}` + "\n",
	} {
		if _, err := readResults(strings.NewReader(in)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// With --plot, flush prints the table and writes a well-formed SVG.
func TestResultWriterPlot(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.svg")
	var table strings.Builder
	rw := resultWriter{w: &table, header: lbResultHeader, plot: path}
	if err := rw.add(plotLB); err != nil {
		t.Fatal(err)
	}
	if err := rw.flush(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "slow-server") {
		t.Errorf("no table: %q", table.String())
	}
	svg, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	d := xml.NewDecoder(bytes.NewReader(svg))
	for {
		if _, err := d.Token(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("%s is not well-formed: %v", path, err)
		}
	}
	for _, s := range []string{"LB off (even split)", "bound", ">v2<"} {
		if !bytes.Contains(svg, []byte(s)) {
			t.Errorf("the plot has no %q", s)
		}
	}
	rw = resultWriter{w: io.Discard, header: lbResultHeader, plot: filepath.Join(t.TempDir(), "no", "such", "dir.svg")}
	_ = rw.add(plotLB)
	if err := rw.flush(); err == nil || !strings.Contains(err.Error(), "--plot") {
		t.Errorf("an unwritable --plot file: %v", err)
	}
}
