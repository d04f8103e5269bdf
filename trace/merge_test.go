package trace

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

const (
	meta9  = `{"name":"process_name","ph":"M","pid":9,"tid":0,"args":{"name":"worker 0 (id 9)","fpt_clock":"unix_us"}}`
	meta8  = `{"name":"process_name","ph":"M","pid":8,"tid":0,"args":{"name":"server 0 (id 8)","fpt_clock":"unix_us"}}`
	push9  = `{"name":"push","ph":"X","ts":100,"dur":5,"pid":9,"tid":1}`
	pull9  = `{"name":"pull","ph":"X","ts":300,"dur":5,"pid":9,"tid":2}`
	agg8   = `{"name":"aggregate","ph":"X","ts":200,"dur":50,"pid":8,"tid":1}`
	other1 = `{"name":"x","ph":"X","ts":150,"dur":1,"pid":1,"tid":1}`
)

func TestMerge(t *testing.T) {
	worker := "[\n" + meta9 + ",\n" + push9 + ",\n" + pull9 + "\n]\n"
	server := "[\n" + meta8 + ",\n" + agg8 + "\n]\n"
	tests := []struct {
		name     string
		inputs   []Input
		names    []string // span names in merged order
		warnings int
		err      string
	}{
		{name: "union in time order", inputs: []Input{{"w.json", []byte(worker)}, {"s.json", []byte(server)}},
			names: []string{"push", "aggregate", "pull"}},
		{name: "a file cut short", inputs: []Input{{"w.json", []byte("[\n" + meta9 + ",\n" + push9 + ",\n" + pull9[:20])}, {"s.json", []byte(server)}},
			names: []string{"push", "aggregate"}},
		{name: "a file cut after a comma", inputs: []Input{{"w.json", []byte("[\n" + meta9 + ",\n" + push9 + ",\n")}},
			names: []string{"push"}},
		{name: "object format, no fpt metadata", inputs: []Input{{"w.json", []byte(worker)}, {"o.json", []byte(`{"traceEvents":[` + other1 + `]}`)}},
			names: []string{"push", "x", "pull"}, warnings: 1},
		{name: "one node twice", inputs: []Input{{"a.json", []byte(worker)}, {"b.json", []byte(worker)}},
			err: "pid 9 is in both a.json and b.json"},
		{name: "not a trace", inputs: []Input{{"w.json", []byte(worker)}, {"bad.json", []byte("hello")}},
			err: "bad.json: not a Chrome trace"},
		{name: "empty", inputs: []Input{{"e.json", nil}}, err: "e.json: empty"},
		{name: "another clock", inputs: []Input{{"c.json", []byte(`[` + strings.Replace(meta9, "unix_us", "boot_ns", 1) + `]`)}},
			err: `c.json: clock "boot_ns"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			st, err := Merge(&out, tt.inputs)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("Merge = %v, want an error with %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var evs []testEvent
			if err := json.Unmarshal(out.Bytes(), &evs); err != nil {
				t.Fatalf("merged output is not a JSON array: %v\n%s", err, out.String())
			}
			var names []string
			for i, e := range evs {
				if e.Ph == "M" {
					if len(names) > 0 {
						t.Errorf("metadata event %d after the spans", i)
					}
					continue
				}
				names = append(names, e.Name)
			}
			if strings.Join(names, ",") != strings.Join(tt.names, ",") || st.Events != len(evs) || len(st.Warnings) != tt.warnings {
				t.Errorf("merged %v (%d events, warnings %q); want %v, %d warnings", names, st.Events, st.Warnings, tt.names, tt.warnings)
			}
		})
	}
}

func TestMainUsage(t *testing.T) {
	for _, args := range [][]string{nil, {"merge"}, {"merge", "out.json"}, {"split", "a", "b"}} {
		var stdout, stderr bytes.Buffer
		if code := Main(args, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), "usage: fpt trace merge") {
			t.Errorf("Main(%q) = %d, stderr %q", args, code, stderr.String())
		}
	}
	var stdout, stderr bytes.Buffer
	if code := Main([]string{"merge", "x.json", "x.json"}, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), "also an input") {
		t.Errorf("output = input: %d, %q", code, stderr.String())
	}
	dir := t.TempDir()
	if code := Main([]string{"merge", dir + "/out.json", dir + "/missing.json"}, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "missing.json") {
		t.Errorf("missing input: %d, %q", code, stderr.String())
	}
}
