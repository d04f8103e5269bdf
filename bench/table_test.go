package bench

import (
	"encoding/json"
	"strings"
	"testing"
)

// Without --json the results come out as one table at flush; with it, one
// JSON object per result as each comes in, and no table.
func TestResultWriter(t *testing.T) {
	results := []tableRow{
		priorityResult{Scenario: scenarioPriority, Rate: "50mbit", TensorBytes: 2 << 20, Rounds: 3,
			HighDoneMs: 120.04, LowDoneMs: 250.5, NoPriorityDoneMs: 249, NoPriorityLowMs: 180.25, HighFirstInRounds: 3},
		priorityResult{Scenario: scenarioPriority, Rate: "50mbit", TensorBytes: 100000, Rounds: 1},
	}
	var table strings.Builder
	rw := resultWriter{w: &table, header: priorityHeader}
	for _, r := range results {
		if err := rw.add(r); err != nil {
			t.Fatal(err)
		}
	}
	if table.Len() != 0 {
		t.Errorf("table written before flush: %q", table.String())
	}
	if err := rw.flush(); err != nil {
		t.Fatal(err)
	}
	checkTable(t, table.String(), [][]string{
		priorityHeader,
		{"priority", "50mbit", "2 MiB", "3", "120.0", "250.5", "249.0", "180.2", "3/3"},
		{"priority", "50mbit", "100000 B", "1", "0.0", "0.0", "0.0", "0.0", "0/1"},
	})

	var js strings.Builder
	rw = resultWriter{w: &js, jsonOut: true, header: priorityHeader}
	for i, r := range results {
		if err := rw.add(r); err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(js.String(), "\n"); n != i+1 {
			t.Errorf("after result %d: %d lines, want %d", i+1, n, i+1)
		}
	}
	if err := rw.flush(); err != nil {
		t.Fatal(err)
	}
	for i, line := range strings.Split(strings.TrimRight(js.String(), "\n"), "\n") {
		var got priorityResult
		if err := json.Unmarshal([]byte(line), &got); err != nil {
			t.Fatalf("line %d %q: %v", i, line, err)
		}
		if got != results[i] {
			t.Errorf("line %d: %+v, want %+v", i, got, results[i])
		}
	}
}

func TestShapingTable(t *testing.T) {
	r := shapingResult{Scenario: scenarioShaping, Rate: "200mbit", Weights: [2]float64{3, 1}, ByteRatio: 2.9312,
		WantRatio: 3, Bytes: [2]uint64{30_123_456, 10_250_000}, WindowSecs: 1.8049, Unshaped: 1.0004}
	var sb strings.Builder
	if err := writeTable(&sb, shapingHeader, [][]string{r.row()}); err != nil {
		t.Fatal(err)
	}
	checkTable(t, sb.String(), [][]string{shapingHeader,
		{"shaping", "200mbit", "3:1", "2.931", "3.000", "1.000", "1.80", "30.1", "10.2"}})
}

func TestSizeText(t *testing.T) {
	for n, want := range map[int64]string{64 << 20: "64 MiB", 1 << 20: "1 MiB", 100000: "100000 B", 0: "0 B"} {
		if got := sizeText(n); got != want {
			t.Errorf("sizeText(%d) = %q, want %q", n, got, want)
		}
	}
}
