package svgplot

import (
	"bytes"
	"encoding/xml"
	"flag"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/golden.svg")

func example() []Panel {
	return []Panel{
		LineChart{
			Title: "slow-server: iteration time", XLabel: "iteration", YLabel: "ms",
			Series: []Series{
				{Name: "LB off", X: []float64{1, 2, 3, 4, 5}, Y: []float64{410, 400, 405, 398, 402}},
				{Name: "LB on", X: []float64{1, 2, 3, 4, 5}, Y: []float64{400, math.NaN(), 250, 240, 238}},
				{Name: "bound", X: []float64{1, 5}, Y: []float64{200, 200}, Dashed: true},
			},
			Marks: []Mark{{X: 3, Label: "v1"}, {X: 9, Label: "out of range"}},
		},
		BarChart{
			Title: "goodput", YLabel: "Gbit/s", Names: []string{"fpt", "raw TCP"},
			Groups: []string{"epoll 1x1", "netconn 1x1"},
			Values: [][]float64{{9.5, 12}, {7.25, 12.5}},
		},
		Table{Title: "CPU per GB", Header: []string{"peers", "CPU s/GB"}, Rows: [][]string{{"1", "0.41"}, {"2", "0.52 <&>"}}},
	}
}

func TestGolden(t *testing.T) {
	var b bytes.Buffer
	if err := Write(&b, example()...); err != nil {
		t.Fatal(err)
	}
	const golden = "testdata/golden.svg"
	if *update {
		if err := os.WriteFile(golden, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b.Bytes(), want) {
		t.Errorf("output differs from %s (go test ./svgplot -update rewrites it; look at both):\n%s", golden, b.String())
	}
	// Well-formed XML, text escaped.
	d := xml.NewDecoder(bytes.NewReader(b.Bytes()))
	for {
		if _, err := d.Token(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("not well-formed: %v", err)
		}
	}
	s := b.String()
	for _, sub := range []string{"v1", "LB off", "raw TCP", "0.52 &lt;&amp;&gt;"} {
		if !strings.Contains(s, sub) {
			t.Errorf("no %q in the image", sub)
		}
	}
	if strings.Contains(s, "out of range") {
		t.Error("a mark outside the x range was drawn")
	}
	if strings.Contains(s, "NaN") || strings.Contains(s, "Inf") {
		t.Error("a NaN or Inf coordinate")
	}
}

func TestTicks(t *testing.T) {
	for _, tc := range []struct {
		hi   float64
		want []float64
	}{
		{10, []float64{0, 2, 4, 6, 8, 10}},
		{0.37, []float64{0, 0.1, 0.2, 0.30000000000000004, 0.4}},
		{420, []float64{0, 100, 200, 300, 400, 500}},
		{0, []float64{0, 0.2, 0.4, 0.6000000000000001, 0.8, 1}},
		{math.NaN(), []float64{0, 0.2, 0.4, 0.6000000000000001, 0.8, 1}},
	} {
		if got, _ := ticks(tc.hi); !slices.Equal(got, tc.want) {
			t.Errorf("ticks(%g) = %v, want %v", tc.hi, got, tc.want)
		}
	}
	for _, tc := range []struct {
		v, step float64
		want    string
	}{{0.30000000000000004, 0.1, "0.3"}, {500, 100, "500"}, {0.25, 0.05, "0.25"}} {
		if got := label(tc.v, tc.step); got != tc.want {
			t.Errorf("label(%v, %v) = %q, want %q", tc.v, tc.step, got, tc.want)
		}
	}
}

// Empty and degenerate input still makes a well-formed image.
func TestEmpty(t *testing.T) {
	var b bytes.Buffer
	err := Write(&b, LineChart{Title: "nothing"}, BarChart{}, Table{},
		LineChart{Series: []Series{{Name: "one", X: []float64{3}, Y: []float64{math.Inf(1)}}}})
	if err != nil {
		t.Fatal(err)
	}
	if s := b.String(); strings.Contains(s, "NaN") || strings.Contains(s, "Inf") || !strings.HasSuffix(s, "</svg>\n") {
		t.Errorf("degenerate input:\n%s", s)
	}
}
