package trace

import (
	"encoding/json"
	"strconv"

	"github.com/fptps/fpt/frame"
)

// Phase is what a span measures of one partition of one iteration.
type Phase uint8

const (
	// Push is a worker sending its contribution: from FPTPush handing the
	// partition to the van until the frame was written to the socket (or,
	// when the worker aggregates the partition itself, added in memory).
	Push Phase = iota
	// Aggregate is an aggregator (a server, or a worker the LB chose)
	// summing a partition: from its first contribution in hand until the
	// W-th completed the sum, just before the sum is sent to every worker.
	Aggregate
	// Pull is a worker receiving the sum: from the Result frame's header
	// arriving until its bytes landed in the FPTPull's buffer (or staging).
	Pull
	// Call is a worker's FPTPush or FPTPull call (a request, not a
	// partition): from entering the worker until it returned to the caller,
	// its frames queued.
	Call
	// Settle is a request completing: from the worker finding it done (its
	// last frame written, or its last sum landed) until its waiters were
	// released, after its callback returned.
	Settle
	// Wait is a Wait on a request: from the call until it returned.
	Wait
	numPhases
)

var phaseNames = [numPhases]string{"push", "aggregate", "pull", "call", "settle", "wait"}

// perRequest reports whether p is measured on a request (Call, Settle,
// Wait) rather than on one partition's frame.
func (p Phase) perRequest() bool { return p >= Call && p < numPhases }

func (p Phase) String() string {
	if p < numPhases {
		return phaseNames[p]
	}
	return "phase" + strconv.Itoa(int(p))
}

// frameType is the frame a phase is measured on: classic Push/Pull frames
// (KV*) are not traced.
func (p Phase) frameType() frame.Type {
	if p == Pull {
		return frame.Result
	}
	return frame.Push
}

// Span is one phase of one partition, as the recorder keeps it: fixed size,
// so that recording copies it into a preallocated queue and allocates
// nothing.
type Span struct {
	Phase     Phase
	Key       uint64
	Partition uint32
	Iteration uint64
	Bytes     uint64
	// Peer is the other end: for Push the aggregator, for Pull the
	// aggregator that sent the sum, for Aggregate the worker whose
	// contribution completed it (the last to arrive).
	Peer uint32
	// Version is the LB decision the partition was cut by (0: the even
	// split over the servers).
	Version    uint32
	Start, End int64 // Unix time, microseconds
	// PullOp is, for a per-request phase, whether the request is an
	// FPTPull (false: an FPTPush).
	PullOp bool
}

// spanOf is the span of a frame's partition.
func spanOf(p Phase, h *frame.Header, start, end int64) Span {
	s := Span{Phase: p, Key: h.Key, Partition: h.Partition, Iteration: h.Iteration,
		Bytes: h.Length, Version: h.Aux, Start: start, End: end}
	if p == Push {
		s.Peer = h.Recipient
	} else {
		s.Peer = h.Sender
	}
	return s
}

// track is one row of the timeline: a phase of one partition of one tensor
// (its spans of successive iterations follow one another, so they never
// overlap on the row).
type track struct {
	phase     Phase
	key       uint64
	partition uint32
	pull      bool // a per-request phase's FPTPull
}

// appendSpan encodes s as a Chrome trace "X" (complete) event of process
// pid on thread tid.
func appendSpan(b []byte, pid, tid int, s *Span) []byte {
	b = append(b, `{"name":"`...)
	b = append(b, s.Phase.String()...)
	b = append(b, `","cat":"fpt","ph":"X","ts":`...)
	b = strconv.AppendInt(b, s.Start, 10)
	b = append(b, `,"dur":`...)
	b = strconv.AppendInt(b, max(s.End-s.Start, 0), 10)
	b = appendIDs(b, pid, tid)
	b = append(b, `,"args":{"key":`...)
	b = strconv.AppendUint(b, s.Key, 10)
	b = append(b, `,"partition":`...)
	b = strconv.AppendUint(b, uint64(s.Partition), 10)
	b = append(b, `,"iteration":`...)
	b = strconv.AppendUint(b, s.Iteration, 10)
	b = append(b, `,"bytes":`...)
	b = strconv.AppendUint(b, s.Bytes, 10)
	if s.Phase.perRequest() {
		b = append(b, `,"op":"`...)
		b = append(b, opName(s.PullOp)...)
		return append(b, `"}}`...)
	}
	if s.Phase == Aggregate {
		b = append(b, `,"aggregator":`...)
		b = strconv.AppendInt(b, int64(pid), 10)
		b = append(b, `,"last_worker":`...)
	} else {
		b = append(b, `,"aggregator":`...)
	}
	b = strconv.AppendUint(b, uint64(s.Peer), 10)
	b = append(b, `,"lb_version":`...)
	b = strconv.AppendUint(b, uint64(s.Version), 10)
	return append(b, "}}"...)
}

// appendDecision encodes an instant event marking the first span cut by LB
// decision version v on this node.
func appendDecision(b []byte, pid int, ts int64, v uint32) []byte {
	b = append(b, `{"name":"LB decision v`...)
	b = strconv.AppendUint(b, uint64(v), 10)
	b = append(b, `","cat":"fpt","ph":"i","s":"p","ts":`...)
	b = strconv.AppendInt(b, ts, 10)
	b = appendIDs(b, pid, 0)
	b = append(b, `,"args":{"lb_version":`...)
	b = strconv.AppendUint(b, uint64(v), 10)
	return append(b, "}}"...)
}

// appendThreadName names a track (Chrome's "thread_name" metadata) and
// fixes its place among the node's rows.
func appendThreadName(b []byte, pid, tid int, t track) []byte {
	name := strconv.AppendUint([]byte("key "), t.key, 10)
	if t.phase.perRequest() {
		name = append(append(append(name, ' '), opName(t.pull)...), ' ')
	} else {
		name = append(strconv.AppendUint(append(name, " part "...), uint64(t.partition), 10), ' ')
	}
	name = append(name, t.phase.String()...)
	b = appendMeta(b, "thread_name", pid, tid, "name", string(name))
	b = append(b, ",\n"...)
	b = append(b, `{"name":"thread_sort_index","ph":"M"`...)
	b = appendIDs(b, pid, tid)
	b = append(b, `,"args":{"sort_index":`...)
	b = strconv.AppendInt(b, int64(tid), 10)
	return append(b, "}}"...)
}

// opName names a request's operation.
func opName(pull bool) string {
	if pull {
		return "pull"
	}
	return "push"
}

// appendMeta encodes a metadata event with one string argument.
func appendMeta(b []byte, what string, pid, tid int, arg, value string) []byte {
	b = append(b, `{"name":"`...)
	b = append(b, what...)
	b = append(b, `","ph":"M"`...)
	b = appendIDs(b, pid, tid)
	b = append(b, `,"args":{"`...)
	b = append(b, arg...)
	b = append(b, `":`...)
	q, _ := json.Marshal(value) // a string always encodes
	b = append(b, q...)
	return append(b, "}}"...)
}

func appendIDs(b []byte, pid, tid int) []byte {
	b = append(b, `,"pid":`...)
	b = strconv.AppendInt(b, int64(pid), 10)
	b = append(b, `,"tid":`...)
	return strconv.AppendInt(b, int64(tid), 10)
}
