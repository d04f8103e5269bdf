package lbagent

import "time"

// Meter turns a node's cumulative byte counters, read at regular ticks,
// into the highest rate each direction sustained over a window since the
// last Take. A link's capacity shows as its rate while it is saturated; an
// average over an iteration would also count the time the node waited for
// others. The window is long enough to smooth bursts (a socket buffer
// filling at memory speed, a token bucket's burst) and short enough to fit
// in the part of an iteration where a link is saturated. Meter is pure: the
// caller passes the clock.
//
// A period in which no window ended (Takes closer together than the
// counters' tick, as with iterations of a few milliseconds) reports the
// rates of the latest window instead of none: the LB needs every node's
// capacity in a probe, and the link has not changed since.
type Meter struct {
	window time.Duration
	hist   []reading // oldest first; spans at most about one window
	peak   [2]float64
	// latest is the rates of the last whole window; ended says whether
	// one ended since the last Take.
	latest [2]float64
	ended  bool
	taken  reading // counters at the last Take
	primed bool
}

type reading struct {
	at         time.Time
	sent, recv uint64
}

// NewMeter returns a meter measuring rates over windows of the given length.
func NewMeter(window time.Duration) *Meter { return &Meter{window: window} }

// Add records the counters read at t. Readings must come in time order;
// counters that go backwards (a peer's counters dropped) restart the
// history rather than produce a negative rate.
func (m *Meter) Add(t time.Time, sent, recv uint64) {
	r := reading{t, sent, recv}
	if !m.primed {
		m.taken, m.primed = r, true
	}
	if n := len(m.hist); n > 0 {
		last := m.hist[n-1]
		if !t.After(last.at) {
			return
		}
		if sent < last.sent || recv < last.recv {
			m.hist = m.hist[:0]
			m.taken = r
		}
	}
	m.hist = append(m.hist, r)
	// Drop readings that are more than a window older than the one after
	// them: the oldest kept starts the longest span of at most a window.
	for len(m.hist) > 2 && t.Sub(m.hist[1].at) >= m.window {
		m.hist = m.hist[1:]
	}
	first := m.hist[0]
	span := t.Sub(first.at)
	if span < m.window*9/10 {
		return // not a whole window yet
	}
	secs := span.Seconds()
	m.latest = [2]float64{float64(sent-first.sent) / secs, float64(recv-first.recv) / secs}
	m.peak[0] = max(m.peak[0], m.latest[0])
	m.peak[1] = max(m.peak[1], m.latest[1])
	m.ended = true
}

// Take returns the peak send and receive rates (bytes per second) of the
// windows that ended since the previous Take (none ended: the latest
// window's; none ever: 0) and the bytes moved since the previous Take, and
// starts a new period.
func (m *Meter) Take() (up, down float64, sent, recv uint64) {
	up, down = m.peak[0], m.peak[1]
	if !m.ended {
		up, down = m.latest[0], m.latest[1]
	}
	m.peak, m.ended = [2]float64{}, false
	if n := len(m.hist); n > 0 {
		last := m.hist[n-1]
		sent, recv = last.sent-m.taken.sent, last.recv-m.taken.recv
		m.taken = last
	}
	return up, down, sent, recv
}
