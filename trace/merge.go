package trace

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
)

// Input is one trace file to merge: its name (for errors) and contents.
type Input struct {
	Name string
	Data []byte
}

// MergeStats says what Merge wrote.
type MergeStats struct {
	Events, Nodes int
	// Warnings are files merged without fpt's clock metadata: their
	// timestamps were taken as they are.
	Warnings []string
}

// event is what merge reads of each event; the rest is copied as it is.
type event struct {
	Name string   `json:"name"`
	Ph   string   `json:"ph"`
	Pid  *int64   `json:"pid"`
	Ts   *float64 `json:"ts"`
	Args struct {
		Clock string `json:"fpt_clock"`
	} `json:"args"`
}

// Merge writes the union of the inputs' events to out as one Chrome trace
// (JSON array format): the metadata first, then every other event in time
// order. fpt's trace files all stamp their events with Unix (wall-clock)
// microseconds, so they are on a common clock as they are, provided the
// nodes' clocks agree (one machine, or hosts kept in step by NTP or PTP);
// merge shifts nothing. A file cut short (a node that died before closing
// it) is read up to its last whole event. Two files of one node (the same
// pid) are refused: the node was traced twice, or files of two runs are
// mixed.
func Merge(out io.Writer, inputs []Input) (MergeStats, error) {
	var st MergeStats
	type timed struct {
		ts  float64
		raw json.RawMessage
	}
	var meta []json.RawMessage
	var spans []timed
	owner := make(map[int64]string) // pid → the file it came from
	for _, in := range inputs {
		raws, err := parseEvents(in.Data)
		if err != nil {
			return st, fmt.Errorf("trace merge: %s: %w", in.Name, err)
		}
		clock := ""
		pids := make(map[int64]bool)
		for i, raw := range raws {
			var e event
			if err := json.Unmarshal(raw, &e); err != nil {
				return st, fmt.Errorf("trace merge: %s: event %d: %w", in.Name, i, err)
			}
			if e.Pid != nil {
				pids[*e.Pid] = true
			}
			if e.Ph == "M" {
				if e.Name == "process_name" && e.Args.Clock != "" {
					clock = e.Args.Clock
				}
				meta = append(meta, raw)
				continue
			}
			ts := 0.0
			if e.Ts != nil {
				ts = *e.Ts
			}
			spans = append(spans, timed{ts, raw})
		}
		switch clock {
		case Clock:
		case "":
			st.Warnings = append(st.Warnings, fmt.Sprintf("%s has no fpt clock metadata: its timestamps are taken as they are", in.Name))
		default:
			return st, fmt.Errorf("trace merge: %s: clock %q; merge knows only %q", in.Name, clock, Clock)
		}
		for pid := range pids {
			if prev, ok := owner[pid]; ok {
				return st, fmt.Errorf("trace merge: pid %d is in both %s and %s (one node traced twice, or files of two runs?)", pid, prev, in.Name)
			}
			owner[pid] = in.Name
		}
	}
	slices.SortStableFunc(spans, func(a, b timed) int { return cmp.Compare(a.ts, b.ts) })
	bw := bufio.NewWriter(out)
	bw.WriteString("[\n")
	sep := ""
	for _, m := range meta {
		bw.WriteString(sep)
		bw.Write(m)
		sep = ",\n"
	}
	for _, s := range spans {
		bw.WriteString(sep)
		bw.Write(s.raw)
		sep = ",\n"
	}
	bw.WriteString("\n]\n")
	st.Events, st.Nodes = len(meta)+len(spans), len(owner)
	return st, bw.Flush()
}

// parseEvents reads a Chrome trace in either format: a JSON array of
// events (whose closing bracket may be missing, as the format allows) or
// an object with traceEvents.
func parseEvents(data []byte) ([]json.RawMessage, error) {
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return nil, errors.New("empty: not a trace")
	}
	if data[0] == '{' {
		var obj struct {
			TraceEvents []json.RawMessage `json:"traceEvents"`
		}
		if err := json.Unmarshal(data, &obj); err != nil {
			return nil, fmt.Errorf("not a Chrome trace: %w", err)
		}
		return obj.TraceEvents, nil
	}
	var raws []json.RawMessage
	err := json.Unmarshal(data, &raws)
	if err != nil && data[0] == '[' {
		// Cut short: keep the whole events before the cut.
		fixed := bytes.TrimRight(data, ", \t\r\n")
		if i := bytes.LastIndexByte(fixed, '}'); i > 0 && json.Unmarshal(append(fixed[:i+1:i+1], ']'), &raws) == nil {
			return raws, nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("not a Chrome trace (a JSON array of events): %w", err)
	}
	return raws, nil
}

const mergeUsage = `usage: fpt trace merge OUT.json IN.json [IN.json ...]
       fpt trace breakdown [-worker ID] [-json] IN.json [IN.json ...]

merge combines the trace files that FPT_TRACE_FILE made on the workers and
servers into one timeline (load it in https://ui.perfetto.dev or
chrome://tracing). The files' timestamps are Unix microseconds: they line
up as they are when the nodes' clocks agree (one machine; NTP or PTP).

breakdown reads the same files (or a merged one) and prints where one
worker's steps spent their time: the critical path from its first
FPTPush call to its last Wait (from the program's own "step" spans when a
file has them, as examples/pytorch/exchange.py --breakdown writes),
median and 90th percentile per segment (docs/latency.md).
`

// Main is "fpt trace": args are what follows it. It returns the exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help") {
		fmt.Fprint(stdout, mergeUsage)
		return 0
	}
	if len(args) > 0 && args[0] == "breakdown" {
		return breakdownMain(args[1:], stdout, stderr)
	}
	if len(args) < 3 || args[0] != "merge" {
		fmt.Fprint(stderr, mergeUsage)
		return 2
	}
	out, names := args[1], args[2:]
	if slices.Contains(names, out) {
		fmt.Fprintf(stderr, "fpt trace merge: the output %s is also an input\n", out)
		return 2
	}
	inputs := make([]Input, 0, len(names))
	for _, n := range names {
		data, err := os.ReadFile(n)
		if err != nil {
			fmt.Fprintf(stderr, "fpt trace merge: %v\n", err)
			return 1
		}
		inputs = append(inputs, Input{n, data})
	}
	f, err := os.Create(out)
	if err != nil {
		fmt.Fprintf(stderr, "fpt trace merge: %v\n", err)
		return 1
	}
	st, err := Merge(f, inputs)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	for _, w := range st.Warnings {
		fmt.Fprintf(stderr, "fpt trace merge: warning: %s\n", w)
	}
	if err != nil {
		fmt.Fprintf(stderr, "%v\n", err)
		os.Remove(out)
		return 1
	}
	fmt.Fprintf(stdout, "fpt trace merge: %d events of %d nodes from %d files into %s\n", st.Events, st.Nodes, len(inputs), out)
	return 0
}

// breakdownMain is "fpt trace breakdown".
func breakdownMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("fpt trace breakdown", flag.ContinueOnError)
	fs.SetOutput(stderr)
	worker := fs.Uint("worker", 0, "the worker's node id (default: the one the step spans are of, else the lowest)")
	asJSON := fs.Bool("json", false, "print the breakdown, every step included, as JSON")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() == 0 || *worker > math.MaxUint32 {
		fmt.Fprint(stderr, mergeUsage)
		return 2
	}
	var inputs []Input
	for _, n := range fs.Args() {
		data, err := os.ReadFile(n)
		if err != nil {
			fmt.Fprintf(stderr, "fpt trace breakdown: %v\n", err)
			return 1
		}
		inputs = append(inputs, Input{n, data})
	}
	b, err := Analyze(inputs, uint32(*worker))
	if err != nil {
		fmt.Fprintf(stderr, "%v\n", err)
		return 1
	}
	if *asJSON {
		if err := json.NewEncoder(stdout).Encode(b); err != nil {
			fmt.Fprintf(stderr, "fpt trace breakdown: %v\n", err)
			return 1
		}
		return 0
	}
	b.Print(stdout)
	return 0
}
