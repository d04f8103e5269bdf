// Package svgplot writes small charts as SVG: line charts with marked x
// positions, grouped bar charts and tables, stacked in one image. It is
// what "fpt bench --plot" draws with; a plotting library would bring far
// more than these three shapes need.
//
// The output is a pure function of the input (fixed number formatting, no
// clock, no map order), so that tests compare it byte for byte.
package svgplot

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"math"
	"strings"
)

// Width is the image's width in pixels.
const Width = 760

// palette colours series in order.
var palette = []string{"#3a7bd5", "#e08a1e", "#2e9e4f", "#8a2be2", "#c33", "#555"}

// Panel is one part of the image, drawn below the previous one.
type Panel interface {
	height() float64
	draw(w *writer, top float64)
}

// Series is one line of a LineChart.
type Series struct {
	Name   string
	X, Y   []float64 // same length; NaN Y values are gaps
	Dashed bool
}

// Mark is a vertical line at X with a label, as a decision on an
// iteration chart.
type Mark struct {
	X     float64
	Label string
}

// LineChart draws series against a shared x axis; y starts at 0.
type LineChart struct {
	Title, XLabel, YLabel string
	Series                []Series
	Marks                 []Mark
}

// BarChart draws, for each group, one bar per series name; y starts at 0.
type BarChart struct {
	Title, YLabel string
	Names         []string    // the bars of each group, in order
	Groups        []string    // the groups' labels
	Values        [][]float64 // Values[g][i]: group g's bar for Names[i]
}

// Table draws rows of text under a header.
type Table struct {
	Title  string
	Header []string
	Rows   [][]string
}

// Write writes the panels, top to bottom, as one SVG image.
func Write(out io.Writer, panels ...Panel) error {
	h := 10.0
	for _, p := range panels {
		h += p.height()
	}
	w := &writer{b: bufio.NewWriter(out)}
	w.f(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%s" viewBox="0 0 %d %s" font-family="sans-serif" font-size="12">`+"\n",
		Width, num(h), Width, num(h))
	w.f(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	top := 10.0
	for _, p := range panels {
		p.draw(w, top)
		top += p.height()
	}
	w.f("</svg>\n")
	return w.b.Flush()
}

// writer accumulates the SVG; errors surface at Flush.
type writer struct{ b *bufio.Writer }

func (w *writer) f(format string, args ...any) { fmt.Fprintf(w.b, format, args...) }

func (w *writer) text(x, y float64, anchor, s string, extra string) {
	w.f(`<text x="%s" y="%s" text-anchor="%s"%s>%s</text>`+"\n", num(x), num(y), anchor, extra, html.EscapeString(s))
}

// num formats a coordinate: at most one decimal, no trailing zeros.
func num(v float64) string {
	s := fmt.Sprintf("%.1f", v)
	s = strings.TrimSuffix(s, ".0")
	if s == "-0" {
		return "0"
	}
	return s
}

// label formats an axis value with as few digits as its step needs.
func label(v, step float64) string {
	d := 0
	for d < 6 && math.Abs(step*math.Pow(10, float64(d))-math.Round(step*math.Pow(10, float64(d)))) > 1e-9 {
		d++
	}
	return fmt.Sprintf("%.*f", d, v)
}

// ticks returns round tick values covering [0, hi]: steps of 1, 2 or 5
// times a power of ten, about five of them.
func ticks(hi float64) (vals []float64, step float64) {
	if !(hi > 0) || math.IsInf(hi, 0) {
		hi = 1
	}
	raw := hi / 5
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	step = 10 * p
	for _, m := range []float64{1, 2, 5} {
		if m*p >= raw {
			step = m * p
			break
		}
	}
	for v := 0.0; v < hi+step*0.999; v += step {
		vals = append(vals, v)
	}
	return vals, step
}

// Plot area geometry shared by the charts.
const (
	chartHeight = 300.0
	padLeft     = 64.0
	padRight    = 20.0
	padTop      = 28.0 // title
	padBottom   = 70.0 // x labels, axis title, legend
)

// frame draws the title, the y grid with labels and the y axis title, and
// returns the y scale and the plot area's bounds.
func frame(w *writer, top float64, title, yLabel string, yMax float64) (y func(float64) float64, x0, x1, y0, y1 float64) {
	x0, x1 = padLeft, Width-padRight
	y0, y1 = top+chartHeight-padBottom, top+padTop
	w.text(Width/2, top+16, "middle", title, ` font-size="14" font-weight="bold"`)
	vals, step := ticks(yMax)
	hi := vals[len(vals)-1]
	y = func(v float64) float64 { return y0 - (y0-y1)*v/hi }
	for _, v := range vals {
		w.f(`<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#ddd"/>`+"\n", num(x0), num(y(v)), num(x1), num(y(v)))
		w.text(x0-6, y(v)+4, "end", label(v, step), "")
	}
	w.text(16, (y0+y1)/2, "middle", yLabel, fmt.Sprintf(` transform="rotate(-90 16 %s)"`, num((y0+y1)/2)))
	w.f(`<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#333"/>`+"\n", num(x0), num(y0), num(x1), num(y0))
	return y, x0, x1, y0, y1
}

// legend draws the names with their colours below the plot.
func legend(w *writer, top float64, names []string, dashed func(i int) bool) {
	x := padLeft
	y := top + chartHeight - 12
	for i, n := range names {
		c := palette[i%len(palette)]
		dash := ""
		if dashed(i) {
			dash = ` stroke-dasharray="6 4"`
		}
		w.f(`<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="2"%s/>`+"\n", num(x), num(y-4), num(x+24), num(y-4), c, dash)
		w.text(x+30, y, "start", n, "")
		x += 40 + 7*float64(len(n))
	}
}

func (c LineChart) height() float64 { return chartHeight }

func (c LineChart) draw(w *writer, top float64) {
	xmin, xmax, ymax := math.Inf(1), math.Inf(-1), 0.0
	for _, s := range c.Series {
		for i, x := range s.X {
			xmin, xmax = math.Min(xmin, x), math.Max(xmax, x)
			if i < len(s.Y) && !math.IsNaN(s.Y[i]) && !math.IsInf(s.Y[i], 0) {
				ymax = math.Max(ymax, s.Y[i])
			}
		}
	}
	if math.IsInf(xmin, 0) {
		xmin, xmax = 0, 1
	}
	if xmax == xmin {
		xmax = xmin + 1
	}
	y, x0, x1, y0, y1 := frame(w, top, c.Title, c.YLabel, ymax*1.05)
	x := func(v float64) float64 { return x0 + (x1-x0)*(v-xmin)/(xmax-xmin) }
	// Round x ticks within the data: multiples of the step.
	_, step := ticks(xmax - xmin)
	for k := math.Ceil(xmin/step - 1e-9); k*step <= xmax+step*1e-9; k++ {
		v := k * step
		w.f(`<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#333"/>`+"\n", num(x(v)), num(y0), num(x(v)), num(y0+4))
		w.text(x(v), y0+16, "middle", label(v, step), "")
	}
	w.text((x0+x1)/2, y0+32, "middle", c.XLabel, "")
	for _, m := range c.Marks {
		if m.X < xmin || m.X > xmax {
			continue
		}
		w.f(`<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#999" stroke-dasharray="3 3"/>`+"\n", num(x(m.X)), num(y0), num(x(m.X)), num(y1))
		w.text(x(m.X)+3, y1+10, "start", m.Label, ` font-size="10" fill="#666"`)
	}
	for i, s := range c.Series {
		var d strings.Builder
		pen := "M"
		for j, xv := range s.X {
			if j >= len(s.Y) || math.IsNaN(s.Y[j]) || math.IsInf(s.Y[j], 0) {
				pen = "M"
				continue
			}
			fmt.Fprintf(&d, "%s%s %s ", pen, num(x(xv)), num(y(s.Y[j])))
			pen = "L"
		}
		dash := ""
		if s.Dashed {
			dash = ` stroke-dasharray="6 4"`
		}
		w.f(`<path d="%s" fill="none" stroke="%s" stroke-width="2"%s/>`+"\n", strings.TrimSpace(d.String()), palette[i%len(palette)], dash)
	}
	names := make([]string, len(c.Series))
	for i, s := range c.Series {
		names[i] = s.Name
	}
	legend(w, top, names, func(i int) bool { return c.Series[i].Dashed })
}

func (c BarChart) height() float64 { return chartHeight }

func (c BarChart) draw(w *writer, top float64) {
	ymax := 0.0
	for _, g := range c.Values {
		for _, v := range g {
			if !math.IsNaN(v) && !math.IsInf(v, 0) {
				ymax = math.Max(ymax, v)
			}
		}
	}
	y, x0, x1, y0, _ := frame(w, top, c.Title, c.YLabel, ymax*1.05)
	n := max(len(c.Groups), 1)
	gw := (x1 - x0) / float64(n)
	bw := gw * 0.8 / float64(max(len(c.Names), 1))
	for g, name := range c.Groups {
		gx := x0 + gw*float64(g) + gw*0.1
		for i := range c.Names {
			if g >= len(c.Values) || i >= len(c.Values[g]) {
				continue
			}
			v := c.Values[g][i]
			if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
				continue
			}
			w.f(`<rect x="%s" y="%s" width="%s" height="%s" fill="%s"/>`+"\n", num(gx+bw*float64(i)), num(y(v)), num(bw*0.95), num(y0-y(v)), palette[i%len(palette)])
		}
		w.text(x0+gw*(float64(g)+0.5), y0+16, "middle", name, ` font-size="11"`)
	}
	legend(w, top, c.Names, func(int) bool { return false })
}

// Table geometry.
const (
	rowHeight  = 18.0
	tableTitle = 28.0
)

func (t Table) height() float64 { return tableTitle + rowHeight*float64(len(t.Rows)+1) + 12 }

func (t Table) draw(w *writer, top float64) {
	w.text(Width/2, top+16, "middle", t.Title, ` font-size="14" font-weight="bold"`)
	cols := len(t.Header)
	for _, r := range t.Rows {
		cols = max(cols, len(r))
	}
	if cols == 0 {
		return
	}
	// Columns as wide as their widest cell, at about 7 px a character.
	rows := append([][]string{t.Header}, t.Rows...)
	colX := make([]float64, cols+1)
	colX[0] = padRight
	for j := range cols {
		widest := 0
		for _, r := range rows {
			if j < len(r) {
				widest = max(widest, len([]rune(r[j])))
			}
		}
		colX[j+1] = colX[j] + 7*float64(widest) + 14
	}
	for i, r := range rows {
		y := top + tableTitle + rowHeight*float64(i) + 12
		extra := ""
		if i == 0 {
			extra = ` font-weight="bold"`
		}
		for j, cell := range r {
			w.text(colX[j], y, "start", cell, extra)
		}
	}
}
