package lb

import (
	"github.com/fptps/fpt/node"

	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
)

func sampleCases() map[string]Sample {
	return map[string]Sample{
		"zero":   {},
		"worker": {Node: 9, Iteration: 12, UpRate: 1.25e8, DownRate: 1.1e8, SentBytes: 1 << 30, ReceivedBytes: 1<<30 + 7, ModelBytes: 100 << 20},
		// After a lost worker's retry, the version it applied.
		"retried": {Node: 11, Iteration: 40, UpRate: 1e8, DownRate: 1e8, ModelBytes: 1 << 20, Version: 7},
		"server":  {Node: 8, Iteration: 1<<64 - 1, UpRate: 3e9, DownRate: 0, SentBytes: 5, ReceivedBytes: 6},
		// The codec carries bad rates as they are; the Balancer judges.
		"hostile": {Node: 1<<32 - 1, UpRate: math.NaN(), DownRate: math.Inf(-1), ModelBytes: 1<<64 - 1, Version: 1<<32 - 1},
	}
}

func directiveCases() map[string]Directive {
	d := Decision{Version: 3, Iteration: 12, Aggregators: []node.ID{8, 10, 9, 11}, Shares: []float64{0.125, 0.375, 0.25, 0.25}}
	probe := Even(4, 20, []node.ID{8, 10, 9, 11})
	many := make([]node.ID, MaxAggregators)
	for i := range many {
		many[i] = node.ID(8 + i)
	}
	big := Even(1<<32-1, 1<<64-1, many)
	retry := Even(5, 9, []node.ID{8, 12})
	lostWorker := Even(6, 9, []node.ID{8, 10})
	lostWorker.Workers = []node.ID{9, 13}
	oneWorker := Decision{Version: 7, Iteration: 30, Aggregators: []node.ID{8, 11}, Shares: []float64{0.75, 0.25}, Workers: []node.ID{11}}
	manyWorkers := Even(8, 1, []node.ID{8})
	manyWorkers.Workers = make([]node.ID, MaxAggregators)
	for i := range manyWorkers.Workers {
		manyWorkers.Workers[i] = node.WorkerID(i)
	}
	return map[string]Directive{
		"empty":       {},
		"no change":   {Horizon: 14, Shaping: true},
		"decision":    {Horizon: 14, Decision: &d, Shaping: true, Reason: "balanced: predicted 12.0 ms vs 20.0 ms even"},
		"probe":       {Horizon: 19, Decision: &probe, Probe: true, Reason: "probe: warm-up done"},
		"one":         {Horizon: 1, Decision: &Decision{Version: 1, Iteration: 2, Aggregators: []node.ID{8}, Shares: []float64{1}}},
		"zero share":  {Decision: &Decision{Version: 1, Aggregators: []node.ID{8, 10}, Shares: []float64{1, 0}}},
		"utf-8":       {Horizon: 3, Reason: "débit ↑ 10 Mbit/s"},
		"long reason": {Reason: strings.Repeat("x", MaxReason)},
		"many":        {Horizon: 1<<64 - 1, Decision: &big, Shaping: true},
		// FPT_ON_SERVER_LOSS=retry: a re-cut at the oldest incomplete
		// iteration, and the progress every worker's held pushes wait on.
		"retry":    {Horizon: 14, Decision: &retry, Shaping: true, Retry: true, Done: 9, Reason: "server1(10) lost"},
		"done":     {Horizon: 14, Shaping: true, Done: 12},
		"max done": {Horizon: 1<<64 - 1, Done: 1<<64 - 1},
		// FPT_ON_WORKER_LOSS=continue: the retry names the workers left.
		"lost worker":  {Horizon: 14, Decision: &lostWorker, Shaping: true, Retry: true, Done: 9, Reason: "worker1(11) lost"},
		"one worker":   {Horizon: 31, Decision: &oneWorker, Shaping: true},
		"many workers": {Horizon: 3, Decision: &manyWorkers, Shaping: true, Retry: true, Done: 1},
	}
}

func mustMarshal(t testing.TB, m interface{ MarshalBinary() ([]byte, error) }) []byte {
	t.Helper()
	b, err := m.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSampleRoundTrip(t *testing.T) {
	for name, s := range sampleCases() {
		b := mustMarshal(t, s)
		if len(b) != sampleLen {
			t.Fatalf("%s: %d bytes", name, len(b))
		}
		got, err := UnmarshalSample(b)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		// Compare the encodings: NaN != NaN, but its bits survive.
		if again := mustMarshal(t, got); !bytes.Equal(again, b) {
			t.Fatalf("%s: %+v came back as %+v", name, s, got)
		}
		if name != "hostile" && got != s {
			t.Fatalf("%s: %+v came back as %+v", name, s, got)
		}
	}
}

func TestUnmarshalSampleRejects(t *testing.T) {
	good := mustMarshal(t, sampleCases()["worker"])
	wrongFormat := bytes.Clone(good)
	wrongFormat[0] = directiveV1
	cases := map[string][]byte{
		"nil":          nil,
		"short":        good[:sampleLen-1],
		"trailing":     append(bytes.Clone(good), 0),
		"wrong format": wrongFormat,
		"a directive":  mustMarshal(t, directiveCases()["no change"]),
		// Version 1 had no Version: a worker that cannot say which retry
		// it applied must not count.
		"version 1":           cat([]byte{0xA1}, good[1:53]),
		"version 1, 57 bytes": cat([]byte{0xA1}, good[1:]),
	}
	for name, b := range cases {
		if _, err := UnmarshalSample(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestDirectiveRoundTrip(t *testing.T) {
	for name, d := range directiveCases() {
		b := mustMarshal(t, d)
		got, err := UnmarshalDirective(b)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !reflect.DeepEqual(got, d) {
			t.Fatalf("%s: %v came back as %v", name, d, got)
		}
		if d.Decision != nil && &got.Decision.Aggregators[0] == &d.Decision.Aggregators[0] {
			t.Fatalf("%s: decoded decision shares memory", name)
		}
	}
}

func TestMarshalDirectiveRejects(t *testing.T) {
	cases := map[string]Directive{
		"NaN share":          {Decision: &Decision{Aggregators: []node.ID{8, 10}, Shares: []float64{math.NaN(), 1}}},
		"sum not 1":          {Decision: &Decision{Aggregators: []node.ID{8, 10}, Shares: []float64{0.5, 0.4}}},
		"missing share":      {Decision: &Decision{Aggregators: []node.ID{8, 10}, Shares: []float64{1}}},
		"no aggregators":     {Decision: &Decision{}},
		"probe, no decision": {Probe: true},
		"retry, no decision": {Retry: true, Done: 3},
		"reason too long":    {Reason: strings.Repeat("x", MaxReason+1)},
		"too many":           {Decision: func() *Decision { d := Even(1, 0, make([]node.ID, MaxAggregators+1)); return &d }()},
	}
	for name, d := range cases {
		if b, err := d.MarshalBinary(); err == nil {
			t.Errorf("%s: encoded as %x", name, b)
		}
	}
}

func TestUnmarshalDirectiveRejects(t *testing.T) {
	le := binary.LittleEndian
	good := mustMarshal(t, directiveCases()["decision"])
	edit := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	// Offsets in good: 10 Version, 14 Iteration, 22 count, 26 first
	// aggregator, 30 its share.
	cases := []rejectCase{
		{"nil", nil, false},
		{"wrong format", edit(func(b []byte) []byte { b[0] = sampleV2; return b }), false},
		{"unknown flag", edit(func(b []byte) []byte { b[1] |= 0x80; return b }), false},
		{"trailing", append(bytes.Clone(good), 0), false},
		{"count beyond the bytes", edit(func(b []byte) []byte { le.PutUint32(b[22:], 9); return b }), false},
		{"count beyond the limit", edit(func(b []byte) []byte { le.PutUint32(b[22:], MaxAggregators+1); return b }), false},
		{"huge count", edit(func(b []byte) []byte { le.PutUint32(b[22:], 1<<32-1); return b }), false},
		{"NaN share", edit(func(b []byte) []byte { le.PutUint64(b[30:], math.Float64bits(math.NaN())); return b }), true},
		{"Inf share", edit(func(b []byte) []byte { le.PutUint64(b[30:], math.Float64bits(math.Inf(1))); return b }), true},
		{"negative share", edit(func(b []byte) []byte { le.PutUint64(b[30:], math.Float64bits(-0.125)); return b }), true},
		{"duplicate aggregator", edit(func(b []byte) []byte { le.PutUint32(b[26:], 10); return b }), true},
		{"no aggregators", cat([]byte{directiveV1, flagDecision}, make([]byte, 8+4+8+4), []byte{0, 0}), true},
		{"probe without decision", cat([]byte{directiveV1, flagProbe}, make([]byte, 8), []byte{0, 0}), false},
		{"retry without decision", cat([]byte{directiveV1, flagRetry | flagDone}, make([]byte, 8), le.AppendUint64(nil, 3), []byte{0, 0}), false},
		// Zero is sent as no flag: a second encoding of it is refused.
		{"done flag, zero done", cat([]byte{directiveV1, flagDone}, make([]byte, 8), make([]byte, 8), []byte{0, 0}), false},
		{"done cut short", cat([]byte{directiveV1, flagDone}, make([]byte, 8), []byte{3, 0, 0}), false},
		{"done missing", cat([]byte{directiveV1, flagDone | flagShaping}, make([]byte, 8)), false},
		// The done flag moves the decision by 8 bytes: a decoder that
		// skipped it would read Done as the decision header.
		{"done flag, done absent", edit(func(b []byte) []byte { b[1] |= flagDone; return b }), true},
		{"reason beyond the bytes", cat([]byte{directiveV1, 0}, make([]byte, 8), []byte{5, 0}, []byte("abc")), false},
		{"reason beyond the limit", cat([]byte{directiveV1, 0}, make([]byte, 8), le.AppendUint16(nil, MaxReason+1), make([]byte, MaxReason+1)), false},
	}
	checkRejects(t, cases)
	// Every truncation of every valid directive is rejected.
	for name, d := range directiveCases() {
		if strings.HasPrefix(name, "many") {
			continue // 786 and 262 KB: their prefixes would take a while
		}
		b := mustMarshal(t, d)
		for n := range len(b) {
			if _, err := UnmarshalDirective(b[:n]); err == nil {
				t.Fatalf("%s: prefix of %d/%d bytes accepted", name, n, len(b))
			}
		}
	}
}

// rejectCase is an encoding UnmarshalDirective must refuse.
type rejectCase struct {
	name    string
	b       []byte
	invalid bool // the error wraps ErrInvalid too
}

func checkRejects(t *testing.T, cases []rejectCase) {
	t.Helper()
	for _, c := range cases {
		d, err := UnmarshalDirective(c.b)
		if !errors.Is(err, ErrMalformed) || c.invalid != errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v (ErrInvalid %v)", c.name, err, errors.Is(err, ErrInvalid))
		}
		if !reflect.DeepEqual(d, Directive{}) {
			t.Errorf("%s: returned %v with the error", c.name, d)
		}
	}
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func TestDirectiveString(t *testing.T) {
	cases := []struct {
		d    Directive
		want string
	}{
		{
			Directive{Horizon: 14, Shaping: true, Decision: &Decision{Version: 3, Iteration: 12, Aggregators: []node.ID{8, 10, 9, 11}, Shares: []float64{0.125, 0.375, 0.25, 0.25}}, Reason: "balanced: predicted 12.0 ms"},
			"v3 from iteration 12: server0(8) 12.5%, server1(10) 37.5%, worker0(9) 25.0%, worker1(11) 25.0% (balanced: predicted 12.0 ms)",
		},
		{
			Directive{Horizon: 19, Probe: true, Decision: &Decision{Version: 4, Iteration: 19, Aggregators: []node.ID{8, 9}, Shares: []float64{0.5, 0.5}}, Reason: "probe: warm-up done"},
			"v4 from iteration 19: server0(8) 50.0%, worker0(9) 50.0%; probe; shaping off (probe: warm-up done)",
		},
		{
			Directive{Horizon: 14, Shaping: true, Retry: true, Done: 9, Decision: &Decision{Version: 5, Iteration: 9, Aggregators: []node.ID{8, 12}, Shares: []float64{0.5, 0.5}}, Reason: "server1(10) lost"},
			"v5 from iteration 9: server0(8) 50.0%, server2(12) 50.0%; retry (server1(10) lost)",
		},
		{
			Directive{Horizon: 14, Shaping: true, Retry: true, Done: 9, Decision: &Decision{Version: 6, Iteration: 9, Aggregators: []node.ID{8, 10}, Shares: []float64{0.5, 0.5}, Workers: []node.ID{9, 13}}, Reason: "worker1(11) lost"},
			"v6 from iteration 9: server0(8) 50.0%, server1(10) 50.0%; workers worker0(9), worker2(13); retry (worker1(11) lost)",
		},
		{Directive{Horizon: 14, Shaping: true}, "horizon 14, no change"},
		{Directive{Horizon: 15}, "horizon 15, no change; shaping off"},
		{Directive{Horizon: 16, Shaping: true, Reason: "waiting"}, "horizon 16, no change (waiting)"},
		// Malformed decisions still print.
		{Directive{Shaping: true, Decision: &Decision{Version: 1, Aggregators: []node.ID{3, 8}, Shares: []float64{1}}}, "v1 from iteration 0: node(3) 100.0%, server0(8) NaN%"},
	}
	for _, c := range cases {
		if got := c.d.String(); got != c.want {
			t.Errorf("got  %s\nwant %s", got, c.want)
		}
	}
}

func FuzzUnmarshalSample(f *testing.F) {
	for _, s := range sampleCases() {
		f.Add(mustMarshal(f, s))
	}
	f.Add([]byte{})
	f.Add([]byte{sampleV2})
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := UnmarshalSample(b)
		if err != nil {
			if s != (Sample{}) || !errors.Is(err, ErrMalformed) {
				t.Fatalf("bad error result: %+v, %v", s, err)
			}
			return
		}
		if again := mustMarshal(t, s); !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs:\n in %x\nout %x", b, again)
		}
	})
}

func FuzzUnmarshalDirective(f *testing.F) {
	for name, d := range directiveCases() {
		if !strings.HasPrefix(name, "many") && name != "long reason" {
			f.Add(mustMarshal(f, d))
		}
	}
	f.Add([]byte{})
	f.Add([]byte{directiveV1})
	f.Add(cat([]byte{directiveV1, flagDecision}, make([]byte, 8+4+8), []byte{0xff, 0xff, 0xff, 0xff}))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := UnmarshalDirective(b)
		if err != nil {
			if !reflect.DeepEqual(d, Directive{}) || !errors.Is(err, ErrMalformed) {
				t.Fatalf("bad error result: %v, %v", d, err)
			}
			return
		}
		if d.Decision != nil {
			if err := d.Decision.Validate(); err != nil {
				t.Fatalf("accepted an invalid decision: %v", err)
			}
		}
		again, err := d.MarshalBinary()
		if err != nil {
			t.Fatalf("decoded directive does not re-encode: %v", err)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs:\n in %x\nout %x", b, again)
		}
		_ = d.String()
	})
}

// Servers get the first directive, every decision and every change of
// shaping; a raised horizon alone goes to the workers only.
func TestDirectiveForServers(t *testing.T) {
	dec := &Decision{Version: 2, Iteration: 9, Aggregators: []node.ID{node.ServerID(0)}, Shares: []float64{1}}
	for _, tc := range []struct {
		name                    string
		d                       Directive
		sentBefore, lastShaping bool
		want                    bool
	}{
		{"the first directive", Directive{Horizon: 2, Shaping: true}, false, false, true},
		{"a horizon alone", Directive{Horizon: 3, Shaping: true}, true, true, false},
		{"a decision", Directive{Horizon: 4, Decision: dec, Shaping: true}, true, true, true},
		{"shaping off for a probe", Directive{Horizon: 5, Decision: dec, Probe: true}, true, true, true},
		{"a horizon during the probe", Directive{Horizon: 6}, true, false, false},
		{"shaping back on", Directive{Horizon: 7, Shaping: true}, true, false, true},
	} {
		if got := tc.d.ForServers(tc.sentBefore, tc.lastShaping); got != tc.want {
			t.Errorf("%s: ForServers = %v, want %v", tc.name, got, tc.want)
		}
	}
}
