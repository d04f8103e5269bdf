package lb

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/fptps/fpt/node"
)

// Sample is one node's report to the LB scheduler, sent once per iteration.
type Sample struct {
	Node node.ID
	// Iteration is the iteration the node just finished: a worker sends
	// i when it starts pushing i+1 (iteration 0 is the init round); a
	// server sends i when it sees iteration i+1 begin.
	Iteration uint64
	// UpRate and DownRate, in bytes/s, are the highest rates the node's
	// send and receive sides sustained over a short window during the
	// period; 0 means not measured.
	UpRate, DownRate float64
	// SentBytes and ReceivedBytes are the bytes moved during the period.
	SentBytes, ReceivedBytes uint64
	// ModelBytes is M, the bytes one iteration pushes, from workers; 0
	// from servers.
	ModelBytes uint64
	// Version is the latest retry decision the worker applied (0: none).
	// After a lost worker the sums of the iterations the retry re-cuts
	// change, and a report of such an iteration made before the retry
	// must not count as having the new sums.
	Version uint32
}

// Directive is what the LB scheduler sends every worker after each
// iteration, and every server when it changes something for them (see
// ForServers).
type Directive struct {
	// Horizon is the last iteration workers may push (inclusive).
	Horizon uint64
	// Decision is a new decision, or nil. Its Iteration is after every
	// Horizon granted before this directive, so every node can switch at
	// that boundary.
	Decision *Decision
	// Shaping turns pool and receive shaping on (false while probing, so
	// that the nodes' capacities can be measured).
	Shaping bool
	// Probe says that Decision is a probe. It needs a Decision.
	Probe bool
	// Retry says that Decision re-cuts iterations already granted: a
	// server was lost, and every iteration from Decision.Iteration on is
	// pushed again without it (FPT_ON_SERVER_LOSS=retry), or a worker was,
	// and those iterations are pushed again by the workers left,
	// Decision.Workers (FPT_ON_WORKER_LOSS=continue). It needs a Decision.
	Retry bool
	// Done is one past the last iteration whose sum every worker has
	// (0: none yet). With FPT_ON_SERVER_LOSS=retry a worker keeps each
	// push's buffer until Done passes its iteration: until then a retry
	// may need it again.
	Done uint64
	// Reason says why, for people reading logs.
	Reason string
}

// ForServers reports whether servers need d, given whether they were sent
// a directive before and the Shaping of the last one. Servers push
// nothing, so a raised horizon alone means nothing to them; they follow
// decisions and shaping. Skipping the rest halves the directives of a
// 2×2 job's iterations, which cost CPU in every process when iterations
// take a millisecond.
func (d Directive) ForServers(sentBefore, lastShaping bool) bool {
	return !sentBefore || d.Decision != nil || d.Shaping != lastShaping
}

// Wire format. Little-endian, fixed layout, so the encoding is canonical
// (decode∘encode is the identity, which the fuzzers check).
// Sample, version 2, 57 bytes:
//
//	off size field
//	0   1    format byte: sampleV2
//	1   4    Node
//	5   8    Iteration
//	13  8    UpRate (IEEE 754 bits)
//	21  8    DownRate
//	29  8    SentBytes
//	37  8    ReceivedBytes
//	45  8    ModelBytes
//	53  4    Version
//
// Directive, version 1:
//
//	0   1    format byte: directiveV1
//	1   1    flags: flagShaping | flagProbe | flagDecision | flagRetry |
//	         flagDone | flagWorkers; others zero
//	2   8    Horizon
//	         if flagDone: Done u64 (not zero)
//	         if flagDecision: Version u32, Iteration u64, count n u32
//	         (1..MaxAggregators), then n × (aggregator u32, share f64)
//	         if flagWorkers (needs flagDecision): count m u32
//	         (1..MaxAggregators), then m × worker u32, increasing
//	    2    Reason length (≤ MaxReason), then Reason
//
// The format bytes differ, so no message can be read as another; a later
// version changes them. Version 1 of the sample (0xA1, 53 bytes, without
// Version) is refused: a worker that cannot say which retry it applied
// would count as having the sums of a lost worker's retry.
const (
	sampleV2    = 0xA3
	directiveV1 = 0xA2
	sampleLen   = 1 + 4 + 8 + 8 + 8 + 8 + 8 + 8 + 4

	flagShaping  = 1
	flagProbe    = 2
	flagDecision = 4
	flagRetry    = 8
	flagDone     = 16
	flagWorkers  = 32
	flagsKnown   = flagShaping | flagProbe | flagDecision | flagRetry | flagDone | flagWorkers
)

// Limits of the wire format; decoding checks them before allocating.
const (
	MaxAggregators = 1 << 16   // aggregators in one decision
	MaxReason      = 4 << 10   // bytes of Directive.Reason
	aggregatorLen  = 4 + 8     // one aggregator on the wire
	decisionHead   = 4 + 8 + 4 // Version, Iteration, count
	workerLen      = 4         // one worker id on the wire
)

// ErrMalformed is wrapped by every error UnmarshalSample and
// UnmarshalDirective return.
var ErrMalformed = errors.New("lb: malformed message")

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
}

// MarshalBinary encodes s (encoding.BinaryMarshaler). It never fails.
func (s Sample) MarshalBinary() ([]byte, error) {
	b := make([]byte, 0, sampleLen)
	b = append(b, sampleV2)
	b = binary.LittleEndian.AppendUint32(b, uint32(s.Node))
	b = binary.LittleEndian.AppendUint64(b, s.Iteration)
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(s.UpRate))
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(s.DownRate))
	b = binary.LittleEndian.AppendUint64(b, s.SentBytes)
	b = binary.LittleEndian.AppendUint64(b, s.ReceivedBytes)
	b = binary.LittleEndian.AppendUint64(b, s.ModelBytes)
	b = binary.LittleEndian.AppendUint32(b, s.Version)
	return b, nil
}

// UnmarshalSample decodes a sample. The rates are passed on as sent, even
// NaN or negative: judging them is the Balancer's business.
func UnmarshalSample(b []byte) (Sample, error) {
	if len(b) != sampleLen {
		return Sample{}, malformed("sample of %d bytes, want %d", len(b), sampleLen)
	}
	if b[0] != sampleV2 {
		return Sample{}, malformed("sample format byte %#x, want %#x", b[0], sampleV2)
	}
	le := binary.LittleEndian
	return Sample{
		Node:          node.ID(le.Uint32(b[1:])),
		Iteration:     le.Uint64(b[5:]),
		UpRate:        math.Float64frombits(le.Uint64(b[13:])),
		DownRate:      math.Float64frombits(le.Uint64(b[21:])),
		SentBytes:     le.Uint64(b[29:]),
		ReceivedBytes: le.Uint64(b[37:]),
		ModelBytes:    le.Uint64(b[45:]),
		Version:       le.Uint32(b[53:]),
	}, nil
}

// check returns why d cannot be encoded, or nil.
func (d Directive) check() error {
	if len(d.Reason) > MaxReason {
		return fmt.Errorf("reason of %d bytes, limit %d", len(d.Reason), MaxReason)
	}
	if d.Decision == nil {
		if d.Probe || d.Retry {
			return errors.New("probe or retry without a decision")
		}
		return nil
	}
	if n := len(d.Decision.Aggregators); n > MaxAggregators {
		return fmt.Errorf("%d aggregators, limit %d", n, MaxAggregators)
	}
	if n := len(d.Decision.Workers); n > MaxAggregators {
		return fmt.Errorf("%d workers, limit %d", n, MaxAggregators)
	}
	return d.Decision.Validate()
}

// MarshalBinary encodes d (encoding.BinaryMarshaler). It fails when d
// carries an invalid decision, a probe flag without a decision, or breaks
// a limit of the wire format; whatever it accepts, UnmarshalDirective
// accepts.
func (d Directive) MarshalBinary() ([]byte, error) {
	if err := d.check(); err != nil {
		return nil, fmt.Errorf("lb: encode directive: %w", err)
	}
	n := 1 + 1 + 8 + 2 + len(d.Reason)
	var flags byte
	if d.Shaping {
		flags |= flagShaping
	}
	if d.Probe {
		flags |= flagProbe
	}
	if d.Retry {
		flags |= flagRetry
	}
	if d.Done != 0 {
		flags |= flagDone
		n += 8
	}
	if d.Decision != nil {
		flags |= flagDecision
		n += decisionHead + aggregatorLen*len(d.Decision.Aggregators)
		if d.Decision.Workers != nil {
			flags |= flagWorkers
			n += 4 + workerLen*len(d.Decision.Workers)
		}
	}
	b := make([]byte, 0, n)
	b = append(b, directiveV1, flags)
	b = binary.LittleEndian.AppendUint64(b, d.Horizon)
	if d.Done != 0 {
		b = binary.LittleEndian.AppendUint64(b, d.Done)
	}
	if dec := d.Decision; dec != nil {
		b = binary.LittleEndian.AppendUint32(b, dec.Version)
		b = binary.LittleEndian.AppendUint64(b, dec.Iteration)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(dec.Aggregators)))
		for i, a := range dec.Aggregators {
			b = binary.LittleEndian.AppendUint32(b, uint32(a))
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(dec.Shares[i]))
		}
		if dec.Workers != nil {
			b = binary.LittleEndian.AppendUint32(b, uint32(len(dec.Workers)))
			for _, w := range dec.Workers {
				b = binary.LittleEndian.AppendUint32(b, uint32(w))
			}
		}
	}
	b = binary.LittleEndian.AppendUint16(b, uint16(len(d.Reason)))
	b = append(b, d.Reason...)
	return b, nil
}

// UnmarshalDirective decodes a directive. It rejects unknown formats and
// flags, counts beyond the limits or the bytes present, trailing bytes,
// and a carried decision that does not Validate (the error then wraps
// ErrInvalid too).
func UnmarshalDirective(b []byte) (Directive, error) {
	r := reader{b: b}
	head, err := r.next(10, "header")
	if err != nil {
		return Directive{}, err
	}
	if head[0] != directiveV1 {
		return Directive{}, malformed("directive format byte %#x, want %#x", head[0], directiveV1)
	}
	flags := head[1]
	if flags&^flagsKnown != 0 {
		return Directive{}, malformed("unknown directive flags %#x", flags)
	}
	d := Directive{
		Horizon: binary.LittleEndian.Uint64(head[2:]),
		Shaping: flags&flagShaping != 0,
		Probe:   flags&flagProbe != 0,
		Retry:   flags&flagRetry != 0,
	}
	if flags&flagDone != 0 {
		done, err := r.next(8, "done")
		if err != nil {
			return Directive{}, err
		}
		// Zero is sent as no flag: accepting it would make two encodings.
		if d.Done = binary.LittleEndian.Uint64(done); d.Done == 0 {
			return Directive{}, malformed("done flag with a zero done")
		}
	}
	if flags&flagDecision != 0 {
		dh, err := r.next(decisionHead, "decision header")
		if err != nil {
			return Directive{}, err
		}
		dec := Decision{
			Version:   binary.LittleEndian.Uint32(dh),
			Iteration: binary.LittleEndian.Uint64(dh[4:]),
		}
		n := int(binary.LittleEndian.Uint32(dh[12:]))
		// Bound the count by the limit and by the bytes present before
		// allocating anything.
		if n > MaxAggregators {
			return Directive{}, malformed("decision of %d aggregators, limit %d", n, MaxAggregators)
		}
		body, err := r.next(n*aggregatorLen, "aggregators")
		if err != nil {
			return Directive{}, err
		}
		dec.Aggregators = make([]node.ID, n)
		dec.Shares = make([]float64, n)
		for i := range n {
			e := body[i*aggregatorLen:]
			dec.Aggregators[i] = node.ID(binary.LittleEndian.Uint32(e))
			dec.Shares[i] = math.Float64frombits(binary.LittleEndian.Uint64(e[4:]))
		}
		if flags&flagWorkers != 0 {
			if dec.Workers, err = readWorkers(&r); err != nil {
				return Directive{}, err
			}
		}
		if err := dec.Validate(); err != nil {
			return Directive{}, fmt.Errorf("%w: carried decision: %w", ErrMalformed, err)
		}
		d.Decision = &dec
	} else if d.Probe || d.Retry || flags&flagWorkers != 0 {
		return Directive{}, malformed("probe, retry or workers flag without a decision")
	}
	rl, err := r.next(2, "reason length")
	if err != nil {
		return Directive{}, err
	}
	n := int(binary.LittleEndian.Uint16(rl))
	if n > MaxReason {
		return Directive{}, malformed("reason of %d bytes, limit %d", n, MaxReason)
	}
	reason, err := r.next(n, "reason")
	if err != nil {
		return Directive{}, err
	}
	d.Reason = string(reason)
	if r.left() != 0 {
		return Directive{}, malformed("%d trailing bytes after the directive", r.left())
	}
	return d, nil
}

// readWorkers reads a decision's workers: a count, then the ids. The
// count is checked against the limit and the bytes present before the
// slice exists; the ids' order is Validate's to check.
func readWorkers(r *reader) ([]node.ID, error) {
	cb, err := r.next(4, "worker count")
	if err != nil {
		return nil, err
	}
	n := int(binary.LittleEndian.Uint32(cb))
	// An empty set is sent as no flag: accepting it would make two
	// encodings of nil.
	if n == 0 || n > MaxAggregators {
		return nil, malformed("decision of %d workers, want 1..%d", n, MaxAggregators)
	}
	body, err := r.next(n*workerLen, "workers")
	if err != nil {
		return nil, err
	}
	ws := make([]node.ID, n)
	for i := range ws {
		ws[i] = node.ID(binary.LittleEndian.Uint32(body[i*workerLen:]))
	}
	return ws, nil
}

// reader walks an input buffer, checking the bounds before every read, so
// that decoding cannot index out of range whatever the input.
type reader struct {
	b   []byte
	off int
}

func (r *reader) left() int { return len(r.b) - r.off }

func (r *reader) next(n int, what string) ([]byte, error) {
	if n < 0 || n > r.left() {
		return nil, malformed("%s: need %d bytes at offset %d, have %d", what, n, r.off, r.left())
	}
	s := r.b[r.off : r.off+n]
	r.off += n
	return s, nil
}

// String is the one-line description shown in logs, such as
//
//	v3 from iteration 12: server0(8) 12.5%, worker0(9) 87.5% (balanced: ...)
//	v4 from iteration 15: server0(8) 100.0%; workers worker1(11); retry (...)
//	horizon 14, no change
func (d Directive) String() string {
	var sb strings.Builder
	if dec := d.Decision; dec != nil {
		fmt.Fprintf(&sb, "v%d from iteration %d:", dec.Version, dec.Iteration)
		for i, a := range dec.Aggregators {
			if i > 0 {
				sb.WriteByte(',')
			}
			share := math.NaN()
			if i < len(dec.Shares) {
				share = dec.Shares[i]
			}
			fmt.Fprintf(&sb, " %s %.1f%%", node.ID(a), 100*share)
		}
		if dec.Workers != nil {
			sb.WriteString("; workers")
			for i, w := range dec.Workers {
				if i > 0 {
					sb.WriteByte(',')
				}
				fmt.Fprintf(&sb, " %s", w)
			}
		}
		if d.Probe {
			sb.WriteString("; probe")
		}
		if d.Retry {
			sb.WriteString("; retry")
		}
	} else {
		fmt.Fprintf(&sb, "horizon %d, no change", d.Horizon)
	}
	if !d.Shaping {
		sb.WriteString("; shaping off")
	}
	if d.Reason != "" {
		fmt.Fprintf(&sb, " (%s)", d.Reason)
	}
	return sb.String()
}
