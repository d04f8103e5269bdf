package bench

import (
	"io"
	"strings"
	"text/tabwriter"
)

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
