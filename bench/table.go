package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// tableRow is a result that is also one row of its experiment's table.
type tableRow interface{ row() []string }

// resultWriter is the one way every experiment prints its results: with
// jsonOut, one JSON object per line as each result comes in (a long run
// shows what it has so far); else, at flush, one table of them all under
// header. With plot set, flush also draws them there (--plot).
type resultWriter struct {
	w       io.Writer
	jsonOut bool
	header  []string
	plot    string // an SVG file to write, or ""
	results []tableRow
}

// add prints r (--json) or keeps its row for the table.
func (rw *resultWriter) add(r tableRow) error {
	rw.results = append(rw.results, r)
	if rw.jsonOut {
		return writeJSONLine(rw.w, r)
	}
	return nil
}

// flush prints the table, if there is one to print, and draws the plot.
func (rw *resultWriter) flush() error {
	if len(rw.results) == 0 {
		return nil
	}
	if !rw.jsonOut {
		rows := make([][]string, len(rw.results))
		for i, r := range rw.results {
			rows[i] = r.row()
		}
		if err := writeTable(rw.w, rw.header, rows); err != nil {
			return err
		}
	}
	if rw.plot != "" {
		return writePlot(rw.plot, rw.results, rw.header)
	}
	return nil
}

// writeJSONLine writes v to w as one line of JSON: a result, or what a
// bench worker reports to the bench.
func writeJSONLine(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, string(b))
	return err
}

// writeTable writes rows under header as aligned columns, two spaces
// apart.
func writeTable(w io.Writer, header []string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, r := range append([][]string{header}, rows...) {
		if _, err := io.WriteString(tw, strings.Join(r, "\t")+"\n"); err != nil {
			return err
		}
	}
	return tw.Flush()
}

// sizeText is a byte count for a table: whole MiB as such, else bytes.
func sizeText(n int64) string {
	if n > 0 && n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d B", n)
}
