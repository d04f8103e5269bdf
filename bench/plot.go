package bench

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"

	"github.com/fptps/fpt/svgplot"
)

// The charts of "fpt bench --plot FILE": what the results say, drawn. The
// LB scenarios get their iteration times with the LB off and on next to
// the bound, the LB's decisions marked where they take effect; goodput
// rows their goodput next to raw TCP's; a --peers run its CPU per GB by
// peer count; other results their table.

// plotPanels draws results; header is the table's, for results drawn as
// a table.
func plotPanels(results []tableRow, header []string) []svgplot.Panel {
	var panels []svgplot.Panel
	var goodput []goodputResult
	var others [][]string
	for _, r := range results {
		switch r := r.(type) {
		case lbResult:
			panels = append(panels, r.chart())
		case failoverResult:
			panels = append(panels, r.chart())
		case elasticResult:
			panels = append(panels, r.chart())
		case goodputResult:
			goodput = append(goodput, r)
		default:
			others = append(others, r.row())
		}
	}
	if len(goodput) > 0 {
		panels = append(panels, goodputChart(goodput))
		if peers, ok := peersTable(goodput); ok {
			panels = append(panels, peersChart(goodput), peers)
		}
	}
	if len(others) > 0 {
		panels = append(panels, svgplot.Table{Title: "results", Header: header, Rows: others})
	}
	return panels
}

// chart is an LB scenario's iteration times, run by run, with the bound.
// The trainer's iteration i (from 1) is the LB's iteration i (0 is the
// init round), so decisions mark the iteration they take effect from.
func (r lbResult) chart() svgplot.LineChart {
	n := max(len(r.EvenItersMs), len(r.LBItersMs))
	c := svgplot.LineChart{
		Title:  fmt.Sprintf("%s: %d workers, %d servers at %s (slow %s)", r.Scenario, r.Workers, r.Servers, r.Rate, r.SlowRate),
		XLabel: "iteration", YLabel: "iteration time (ms)",
		Series: []svgplot.Series{
			{Name: "LB off (even split)", X: xs(len(r.EvenItersMs)), Y: r.EvenItersMs},
			{Name: "LB on", X: xs(len(r.LBItersMs)), Y: r.LBItersMs},
			{Name: "bound", X: []float64{1, float64(max(n, 1))}, Y: []float64{r.BoundIterMs, r.BoundIterMs}, Dashed: true},
		},
	}
	for _, d := range r.LBDecisionMarks {
		c.Marks = append(c.Marks, svgplot.Mark{X: float64(d.Iteration), Label: "v" + strconv.FormatUint(uint64(d.Version), 10)})
	}
	return c
}

// xs are the x values of n iterations' times: 1 to n (0 is the init
// round, untimed).
func xs(n int) []float64 {
	x := make([]float64, n)
	for i := range x {
		x[i] = float64(i + 1)
	}
	return x
}

// goodputLabel names a goodput row in a chart.
func goodputLabel(r goodputResult) string {
	l := fmt.Sprintf("%s %dx%d", r.Van, r.Workers, r.Servers)
	if r.LB == "on" {
		l += " LB"
	}
	if r.Secret == "on" {
		l += " secret"
	}
	return l
}

func goodputChart(rs []goodputResult) svgplot.BarChart {
	c := svgplot.BarChart{Title: "goodput (worker 0's pushes and pulls) vs raw TCP", YLabel: "Gbit/s",
		Names: []string{"fpt", "raw TCP, same bytes"}}
	for _, r := range rs {
		c.Groups = append(c.Groups, goodputLabel(r))
		c.Values = append(c.Values, []float64{r.GoodputGbps, r.RawTCPGbps})
	}
	return c
}

// peersTable is the CPU-per-peer table of a --peers run (W workers x W
// servers, LB off, for several W), and whether the rows are one.
func peersTable(rs []goodputResult) (svgplot.Table, bool) {
	ws := map[int]bool{}
	for _, r := range rs {
		if r.Workers != r.Servers || r.LB == "on" {
			return svgplot.Table{}, false
		}
		ws[r.Workers] = true
	}
	if len(ws) < 2 {
		return svgplot.Table{}, false
	}
	t := svgplot.Table{Title: "CPU per GB pushed and pulled, by peers", Header: []string{"van", "peers (W x W)", "CPU s/GB", "raw TCP CPU s/GB", "goodput Gbit/s"}}
	for _, r := range rs {
		t.Rows = append(t.Rows, []string{r.Van, strconv.Itoa(r.Workers), fmt.Sprintf("%.3f", r.CPUPerGB),
			fmt.Sprintf("%.3f", r.RawTCPCPUPerGB), fmt.Sprintf("%.2f", r.GoodputGbps)})
	}
	return t, true
}

// peersChart is the CPU per GB against the peer count, one line per van.
func peersChart(rs []goodputResult) svgplot.LineChart {
	c := svgplot.LineChart{Title: "CPU per GB by peers", XLabel: "peers (W workers x W servers)", YLabel: "CPU s/GB"}
	var vans []string
	for _, r := range rs {
		if !slices.Contains(vans, r.Van) {
			vans = append(vans, r.Van)
		}
	}
	for _, v := range vans {
		s := svgplot.Series{Name: v + " van"}
		raw := svgplot.Series{Name: "raw TCP (" + v + " rows)", Dashed: true}
		for _, r := range rs {
			if r.Van == v {
				s.X, raw.X = append(s.X, float64(r.Workers)), append(raw.X, float64(r.Workers))
				s.Y, raw.Y = append(s.Y, r.CPUPerGB), append(raw.Y, r.RawTCPCPUPerGB)
			}
		}
		c.Series = append(c.Series, s, raw)
	}
	return c
}

// writePlot writes the results' charts to the file path.
func writePlot(path string, results []tableRow, header []string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--plot: %w", err)
	}
	err = svgplot.Write(f, plotPanels(results, header)...)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("--plot %s: %w", path, err)
	}
	return nil
}

// readResults reads the lines "fpt bench --json" printed back into
// results, telling the experiments apart by their fields.
func readResults(r io.Reader) ([]tableRow, error) {
	var out []tableRow
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 16<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Bytes()
		if len(line) == 0 {
			continue
		}
		var probe struct {
			Van      *string `json:"van"`
			Scenario string  `json:"scenario"`
		}
		if err := json.Unmarshal(line, &probe); err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		var res tableRow
		var err error
		switch {
		case probe.Van != nil:
			res, err = decodeAs[goodputResult](line)
		case isLBScenario(probe.Scenario):
			res, err = decodeAs[lbResult](line)
		case probe.Scenario == scenarioShaping:
			res, err = decodeAs[shapingResult](line)
		case probe.Scenario == scenarioFailover:
			res, err = decodeAs[failoverResult](line)
		case isElasticScenario(probe.Scenario):
			res, err = decodeAs[elasticResult](line)
		case probe.Scenario == scenarioPriority:
			res, err = decodeAs[priorityResult](line)
		default:
			err = errors.New("not a result of fpt bench --json")
		}
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		out = append(out, res)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, errors.New("no results")
	}
	return out, nil
}

func decodeAs[T tableRow](line []byte) (tableRow, error) {
	var v T
	err := json.Unmarshal(line, &v)
	return v, err
}

// headerOf is the table header for results read back: the first one's
// experiment's.
func headerOf(rs []tableRow) []string {
	switch r := rs[0].(type) {
	case goodputResult:
		return goodputHeader
	case lbResult:
		return lbResultHeader
	case shapingResult:
		return shapingHeader
	case failoverResult:
		return failoverHeader
	case elasticResult:
		return elasticHeaderOf(r.Scenario)
	}
	return priorityHeader
}

// plotMain runs "fpt bench --from FILE": it prints the results a --json
// run wrote to FILE ("-": stdin) as a table, or as JSON again with --json,
// and draws them with --plot, without running anything.
func plotMain(f *flags) int {
	in := os.Stdin
	if f.from != "-" {
		file, err := os.Open(f.from)
		if err != nil {
			return usageError("--from: %v", err)
		}
		defer file.Close()
		in = file
	}
	rs, err := readResults(in)
	if err != nil {
		return failed("--from "+f.from, err)
	}
	out := resultWriter{w: os.Stdout, jsonOut: f.goodput.jsonOut, header: headerOf(rs), plot: f.plot}
	for _, r := range rs {
		if err := out.add(r); err != nil {
			return failed("table", err)
		}
	}
	if err := out.flush(); err != nil {
		return failed("table", err)
	}
	return 0
}
