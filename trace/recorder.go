// Package trace records a node's communication timeline: every push,
// aggregation and pull of every tensor partition, as spans in Chrome's
// trace-event format (JSON, loadable in Perfetto and chrome://tracing), for
// a window of iterations (FPT_TRACE_FILE, FPT_TRACE_ITERS). A Recorder is
// given to the node's worker and aggregator; a nil one records nothing. Its
// hot path appends a fixed-size span to a preallocated batch under a lock;
// a goroutine takes whole batches, encodes and writes them. Merge combines the files of a cluster's nodes into
// one timeline ("fpt trace merge").
package trace

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fptps/fpt/frame"
)

// DefaultCapacity is how many spans a recorder batches for its writer
// (64 bytes each; the recorder holds two batches). A full batch drops
// spans, counted in the file, rather than slow the data plane down.
const DefaultCapacity = 1 << 14

// batchDelay is how long the writer lets a batch fill once woken: one
// wake-up per batch, not per span, and none while nothing is recorded.
const batchDelay = 20 * time.Millisecond

// writeBuffer is the writer's buffer: with the queue, what a recorder holds.
const writeBuffer = 64 << 10

// maxOpen bounds the spans begun and not yet ended (partitions in flight).
const maxOpen = 1 << 16

// Meta describes the node a trace file is of.
type Meta struct {
	Role string // "worker" or "server"
	Rank int
	ID   uint32 // the node's id: the file's pid, unique in a cluster
	Host string
}

// openKey names a span begun and not yet ended.
type openKey struct {
	phase Phase
	key   uint64
	part  uint32
	iter  uint64
}

// Recorder records the spans of a node's partitions for a window of
// iterations and streams them to a file on a goroutine of its own. Its
// methods may be called on a nil *Recorder, which records nothing: that
// is tracing off, one branch per hook.
type Recorder struct {
	window Window
	now    func() int64 // Unix microseconds

	mu      sync.Mutex
	open    map[openKey]int64 // start of spans begun
	batch   []Span            // recorded, not yet taken by the writer
	spare   []Span            // the writer's batch, given back empty
	closed  bool
	started bool
	dropped uint64

	wake chan struct{} // the writer's: a batch began, or Close

	done chan struct{} // closed when the writer returned
	err  error         // the writer's, read after done
}

// New returns a recorder of the iterations in window that queues up to
// capacity spans. It writes nothing until Start.
func New(window Window, capacity int) *Recorder {
	return &Recorder{
		window: window,
		now:    func() int64 { return time.Now().UnixMicro() },
		open:   make(map[openKey]int64),
		batch:  make([]Span, 0, max(capacity, 1)),
		spare:  make([]Span, 0, max(capacity, 1)),
		wake:   make(chan struct{}, 1),
		done:   make(chan struct{}),
	}
}

// Path expands FPT_TRACE_FILE for one node: "{role}" becomes worker or
// server, "{rank}" the node's rank, so that the nodes of one launch (which
// share their environment) write files of their own.
func Path(pattern, role string, rank int) string {
	return strings.NewReplacer("{role}", role, "{rank}", strconv.Itoa(rank)).Replace(pattern)
}

// Create starts writing to the file at path (created or truncated), as the
// trace of the node m describes.
func (r *Recorder) Create(path string, m Meta) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("FPT_TRACE_FILE: %w", err)
	}
	r.Start(f, m)
	return nil
}

// Start makes the recorder write to w, which it closes on Close: first the
// file's metadata, then the spans recorded so far, then each as it comes.
func (r *Recorder) Start(w io.WriteCloser, m Meta) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started || r.closed {
		w.Close() // not ours to keep: nothing will be written to it
		return
	}
	r.started = true
	go r.write(w, m, r.now())
}

// Begin notes the start of phase p of the partition h carries; the first
// Begin of a span wins (an aggregation begins with its first contribution).
func (r *Recorder) Begin(p Phase, h *frame.Header) {
	if r == nil || h.Type != p.frameType() || !r.window.Contains(h.Iteration) {
		return
	}
	now := r.now()
	k := openKey{p, h.Key, h.Partition, h.Iteration}
	r.mu.Lock()
	if _, ok := r.open[k]; !ok {
		if len(r.open) < maxOpen {
			r.open[k] = now
		} else {
			r.dropped++
		}
	}
	r.mu.Unlock()
}

// End records phase p of the partition h carries, from its Begin (or from
// now, if it had none) until now.
func (r *Recorder) End(p Phase, h *frame.Header) {
	if r == nil || h.Type != p.frameType() || !r.window.Contains(h.Iteration) {
		return
	}
	now := r.now()
	k := openKey{p, h.Key, h.Partition, h.Iteration}
	r.mu.Lock()
	start, ok := r.open[k]
	if ok {
		delete(r.open, k)
	} else {
		start = now
	}
	r.enqueue(spanOf(p, h, start, now))
	r.mu.Unlock()
}

// Now is the recorder's clock (Unix microseconds), for a span a caller
// measures itself and gives to Request; 0 on a nil recorder.
func (r *Recorder) Now() int64 {
	if r == nil {
		return 0
	}
	return r.now()
}

// Request records per-request phase p (Call, Settle, Wait) of an FPTPush
// or FPTPull (pull) of iteration iter whose first key is key, from start
// (Now) until now.
func (r *Recorder) Request(p Phase, key, iter, bytes uint64, pull bool, start int64) {
	if r == nil || !p.perRequest() || !r.window.Contains(iter) {
		return
	}
	r.Record(Span{Phase: p, Key: key, Iteration: iter, Bytes: bytes, PullOp: pull, Start: start, End: r.now()})
}

// Record records a span measured elsewhere, if its iteration is in the
// window.
func (r *Recorder) Record(s Span) {
	if r == nil || !r.window.Contains(s.Iteration) {
		return
	}
	r.mu.Lock()
	r.enqueue(s)
	r.mu.Unlock()
}

// enqueue adds s to the batch, or counts it dropped when the batch is
// full; r.mu is held. The first span of a batch wakes the writer.
func (r *Recorder) enqueue(s Span) {
	switch {
	case r.closed:
	case len(r.batch) == cap(r.batch):
		r.dropped++
	default:
		r.batch = append(r.batch, s)
		if len(r.batch) == 1 {
			r.signal()
		}
	}
}

// signal wakes the writer, unless a wake-up is pending already.
func (r *Recorder) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Dropped is how many spans were lost so far because the writer fell
// behind or too many were open.
func (r *Recorder) Dropped() uint64 {
	if r == nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.dropped
}

// Close stops recording, writes what is queued, ends the file and closes
// it. It returns the first write error; it is idempotent.
func (r *Recorder) Close() error {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	r.closed = true
	started := r.started
	r.mu.Unlock()
	r.signal()
	if !started {
		return nil
	}
	<-r.done
	return r.err
}

// write is the writer goroutine: it takes the recorded batch, swapping in
// an empty one, and encodes it through a buffered writer, so that memory
// stays bounded whatever the run's length.
func (r *Recorder) write(w io.WriteCloser, m Meta, opened int64) {
	defer close(r.done)
	bw := bufio.NewWriterSize(w, writeBuffer)
	e := newEncoder(int(m.ID))
	buf := e.header(make([]byte, 0, 4096), m, r.window, opened)
	for closed := false; !closed; {
		<-r.wake
		time.Sleep(batchDelay)
		r.mu.Lock()
		batch := r.batch
		r.batch, r.spare = r.spare, nil
		closed = r.closed
		dropped := r.dropped
		r.mu.Unlock()
		for i := range batch {
			buf = e.span(buf, &batch[i])
			if len(buf) >= 2048 {
				r.keep(write(bw, buf))
				buf = buf[:0]
			}
		}
		r.mu.Lock()
		r.spare = batch[:0]
		r.mu.Unlock()
		if closed {
			buf = e.footer(buf, dropped)
		}
	}
	r.keep(write(bw, buf))
	r.keep(bw.Flush())
	r.keep(w.Close())
}

func write(w io.Writer, b []byte) error {
	_, err := w.Write(b)
	return err
}

// keep remembers the writer's first error (only the writer calls it).
func (r *Recorder) keep(err error) {
	if err != nil && r.err == nil {
		r.err = fmt.Errorf("trace: writing FPT_TRACE_FILE: %w", err)
	}
}

// encoder turns spans into the lines of a trace file (Chrome's JSON array
// format: one event a line, each but the first after a comma). It names
// each track when it first appears and marks each LB decision the first
// time a span was cut by it.
type encoder struct {
	pid     int
	tids    map[track]int
	version int64 // highest decision version seen; -1: none
}

func newEncoder(pid int) *encoder {
	return &encoder{pid: pid, tids: make(map[track]int), version: -1}
}

// Clock is the name of the clock the timestamps of a trace file are on;
// merge requires it of every fpt file.
const Clock = "unix_us"

// header opens the file with the process's name and the file's metadata
// (in the process_name event's arguments, where viewers ignore them).
func (e *encoder) header(b []byte, m Meta, w Window, now int64) []byte {
	args, _ := json.Marshal(map[string]any{ // plain values: never fails
		"name":       fmt.Sprintf("%s %d (id %d)", m.Role, m.Rank, m.ID),
		"fpt_clock":  Clock,
		"role":       m.Role,
		"rank":       m.Rank,
		"node_id":    m.ID,
		"host":       m.Host,
		"os_pid":     os.Getpid(),
		"iterations": w.String(),
		"opened_us":  now,
	})
	b = append(b, "[\n"...)
	b = append(b, `{"name":"process_name","ph":"M"`...)
	b = appendIDs(b, e.pid, 0)
	b = append(b, `,"args":`...)
	b = append(b, args...)
	b = append(b, "},\n"...)
	b = append(b, `{"name":"process_sort_index","ph":"M"`...)
	b = appendIDs(b, e.pid, 0)
	b = append(b, `,"args":{"sort_index":`...)
	b = strconv.AppendInt(b, int64(e.pid), 10)
	return append(b, "}}"...)
}

// span appends s, after the track's name and the decision's mark when
// they are new.
func (e *encoder) span(b []byte, s *Span) []byte {
	t := track{s.Phase, s.Key, s.Partition, s.PullOp}
	tid, ok := e.tids[t]
	if !ok {
		tid = len(e.tids) + 1
		e.tids[t] = tid
		b = appendThreadName(append(b, ",\n"...), e.pid, tid, t)
	}
	if int64(s.Version) > e.version {
		e.version = int64(s.Version)
		b = appendDecision(append(b, ",\n"...), e.pid, s.Start, s.Version)
	}
	return appendSpan(append(b, ",\n"...), e.pid, tid, s)
}

// footer closes the array; spans lost are told on the process's label.
func (e *encoder) footer(b []byte, dropped uint64) []byte {
	if dropped > 0 {
		b = append(b, ",\n"...)
		b = appendMeta(b, "process_labels", e.pid, 0, "labels", fmt.Sprintf("%d spans dropped", dropped))
	}
	return append(b, "\n]\n"...)
}
