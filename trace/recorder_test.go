package trace

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"

	"github.com/fptps/fpt/frame"
)

// sink is an io.WriteCloser that keeps what it was given; Write blocks
// while gate is held, and fails with err when set.
type sink struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	gate   sync.Mutex
	err    error
	closed bool
}

func (s *sink) Write(p []byte) (int, error) {
	s.gate.Lock()
	defer s.gate.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return 0, s.err
	}
	return s.buf.Write(p)
}

func (s *sink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}

// clock is a fake clock, each reading a microsecond after the last.
func clock(start int64) func() int64 {
	var mu sync.Mutex
	return func() int64 {
		mu.Lock()
		defer mu.Unlock()
		start++
		return start
	}
}

type testEvent struct {
	Name string         `json:"name"`
	Ph   string         `json:"ph"`
	Ts   int64          `json:"ts"`
	Dur  int64          `json:"dur"`
	Pid  int            `json:"pid"`
	Tid  int            `json:"tid"`
	Args map[string]any `json:"args"`
}

func decode(t *testing.T, b []byte) []testEvent {
	t.Helper()
	var evs []testEvent
	if err := json.Unmarshal(b, &evs); err != nil {
		t.Fatalf("not a JSON array of events: %v\n%s", err, b)
	}
	return evs
}

func push(key uint64, part uint32, iter uint64, to uint32, version uint32) *frame.Header {
	return &frame.Header{Type: frame.Push, Sender: 9, Recipient: to, Key: key, Partition: part,
		Iteration: iter, Length: 4096, Aux: version}
}

func TestRecorderEncodesSpans(t *testing.T) {
	r := New(Window{1, 2}, 16)
	r.now = clock(999) // Start reads 1000
	out := &sink{}
	r.Start(out, Meta{Role: "worker", Rank: 0, ID: 9, Host: "127.0.0.1"})

	h := push(3, 1, 1, 8, 0)
	r.Begin(Push, h) // t=1001
	r.Begin(Push, h) // a second Begin does not move the start (t=1002)
	r.End(Push, h)   // t=1003
	res := *h
	res.Type, res.Sender, res.Recipient, res.Aux = frame.Result, 8, 9, 2
	r.Begin(Pull, &res)                   // 1004
	r.End(Pull, &res)                     // 1005
	r.End(Aggregate, push(3, 0, 2, 9, 2)) // no Begin: a zero-length span at 1006
	r.End(Push, push(3, 1, 3, 8, 0))      // outside the window: not recorded
	kv := *h
	kv.Type = frame.KVPush
	r.End(Push, &kv) // a classic frame: not traced
	r.End(Pull, h)   // a Push frame is no pull
	r.Begin(Push, &res)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if !out.closed {
		t.Error("Close did not close the file")
	}
	evs := decode(t, out.buf.Bytes())
	var spans []testEvent
	tracks := map[int]string{}
	var marks []string
	for _, e := range evs {
		switch {
		case e.Ph == "X":
			spans = append(spans, e)
		case e.Name == "thread_name":
			tracks[e.Tid] = e.Args["name"].(string)
		case e.Ph == "i":
			marks = append(marks, e.Name)
		case e.Name == "process_name":
			if e.Args["name"] != "worker 0 (id 9)" || e.Args["fpt_clock"] != Clock || e.Args["iterations"] != "1-2" || e.Pid != 9 {
				t.Errorf("process metadata %+v", e)
			}
		}
	}
	if len(spans) != 3 {
		t.Fatalf("%d spans, want 3: %+v", len(spans), spans)
	}
	want := []struct {
		name      string
		ts, dur   int64
		track     string
		agg, iter float64
		version   float64
	}{
		{"push", 1001, 2, "key 3 part 1 push", 8, 1, 0},
		{"pull", 1004, 1, "key 3 part 1 pull", 8, 1, 2},
		{"aggregate", 1006, 0, "key 3 part 0 aggregate", 9, 2, 2},
	}
	for i, w := range want {
		s := spans[i]
		if s.Name != w.name || s.Ts != w.ts || s.Dur != w.dur || tracks[s.Tid] != w.track || s.Pid != 9 ||
			s.Args["aggregator"] != w.agg || s.Args["iteration"] != w.iter || s.Args["lb_version"] != w.version ||
			s.Args["key"] != 3.0 || s.Args["bytes"] != 4096.0 {
			t.Errorf("span %d = %+v on track %q; want %+v", i, s, tracks[s.Tid], w)
		}
	}
	if spans[2].Args["last_worker"] != 9.0 {
		t.Errorf("aggregate span's last worker %v, want 9", spans[2].Args["last_worker"])
	}
	if strings.Join(marks, ",") != "LB decision v0,LB decision v2" {
		t.Errorf("decision marks %q", marks)
	}
}

func TestNilRecorderRecordsNothing(t *testing.T) {
	var r *Recorder
	h := push(1, 0, 0, 8, 0)
	r.Begin(Push, h)
	r.End(Push, h)
	r.Record(Span{})
	if r.Dropped() != 0 || r.Close() != nil {
		t.Fatal("a nil recorder did something")
	}
}

// TestRecorderBoundedMemory blocks the writer: spans beyond the queue are
// dropped and counted (in the file too), never buffered without bound,
// and nothing blocks the caller.
func TestRecorderBoundedMemory(t *testing.T) {
	const capacity, n = 64, 2000
	r := New(All, capacity)
	out := &sink{}
	out.gate.Lock() // the file does not take anything for now
	r.Start(out, Meta{Role: "server", ID: 8})
	for i := range n {
		r.End(Aggregate, push(uint64(i), 0, 1, 8, 0))
	}
	// The writer holds the batch it took (blocked writing it), the
	// recorder the next one; the rest went.
	if dropped, most := r.Dropped(), uint64(2*capacity); dropped < n-most {
		t.Errorf("%d of %d spans dropped: more than %d were kept", dropped, n, most)
	}
	r.mu.Lock()
	if len(r.batch) > capacity || cap(r.batch) != capacity {
		t.Errorf("batch %d/%d, bound %d", len(r.batch), cap(r.batch), capacity)
	}
	r.mu.Unlock()
	out.gate.Unlock()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	evs := decode(t, out.buf.Bytes())
	spans, label := 0, ""
	for _, e := range evs {
		if e.Ph == "X" {
			spans++
		}
		if e.Name == "process_labels" {
			label, _ = e.Args["labels"].(string)
		}
	}
	if uint64(spans)+r.Dropped() != n {
		t.Errorf("%d spans written + %d dropped != %d recorded", spans, r.Dropped(), n)
	}
	if !strings.Contains(label, "spans dropped") {
		t.Errorf("the file does not say spans were dropped (labels %q)", label)
	}

	// Spans begun and never ended are bounded too.
	r = New(All, capacity)
	for i := range maxOpen + 10 {
		r.Begin(Push, push(uint64(i), 0, 1, 8, 0))
	}
	if len(r.open) != maxOpen || r.Dropped() != 10 {
		t.Errorf("%d open, %d dropped; want %d and 10", len(r.open), r.Dropped(), maxOpen)
	}
	r.Close()
	r.End(Push, push(1, 0, 1, 8, 0)) // after Close: ignored, no panic
}

func TestRecorderReportsWriteErrors(t *testing.T) {
	r := New(All, 8)
	r.Start(&sink{err: errors.New("disk full")}, Meta{Role: "worker", ID: 9})
	r.End(Push, push(1, 0, 1, 8, 0))
	err := r.Close()
	if err == nil || !strings.Contains(err.Error(), "FPT_TRACE_FILE") || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("Close = %v, want the write error naming FPT_TRACE_FILE", err)
	}
	if err2 := r.Close(); err2 == nil {
		t.Error("a second Close forgot the error")
	}
}

func TestPath(t *testing.T) {
	if got := Path("/tmp/t-{role}{rank}.json", "worker", 3); got != "/tmp/t-worker3.json" {
		t.Errorf("Path = %q", got)
	}
	if got := Path("/tmp/t.json", "server", 1); got != "/tmp/t.json" {
		t.Errorf("Path = %q", got)
	}
}

// BenchmarkSpan is the cost of one traced partition phase (Begin and End)
// on the caller's goroutine, tracing on, the writer encoding to a discarded
// file; Off and OutsideWindow are the cost when nothing is recorded.
func BenchmarkSpan(b *testing.B) {
	run := func(b *testing.B, r *Recorder) {
		h := push(1, 0, 5, 8, 0)
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			// A model of 64 partitions, iteration after iteration.
			h.Partition, h.Iteration = uint32(i%64), uint64(i/64)
			r.Begin(Push, h)
			r.End(Push, h)
		}
		b.StopTimer()
		if d := r.Dropped(); d > 0 {
			b.ReportMetric(float64(d)/float64(b.N), "dropped/op")
		}
		r.Close()
	}
	b.Run("On", func(b *testing.B) {
		r := New(All, DefaultCapacity)
		r.Start(nopCloser{io.Discard}, Meta{Role: "worker", ID: 9})
		run(b, r)
	})
	b.Run("OutsideWindow", func(b *testing.B) { run(b, New(Window{1 << 62, 1 << 62}, DefaultCapacity)) })
	b.Run("Off", func(b *testing.B) { run(b, nil) })
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }
