package netem

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// HostSpec is one host's link: rates in tc syntax ("200mbit", "1gbit"); ""
// means unlimited. Up limits what the host sends, Down what it receives.
// FlowCap, with Up, caps each TCP connection's share of Up (see
// flowcap.go); it is set in code (the channels scenario), not parsed.
type HostSpec struct{ Up, Down, FlowCap string }

// String is the spec as ParseHostSpec reads it back.
func (h HostSpec) String() string {
	side := func(r string) string {
		if r == "" {
			return "none"
		}
		return r
	}
	if h.Up == h.Down {
		return side(h.Up)
	}
	return side(h.Up) + "/" + side(h.Down)
}

// ParseHostSpec parses "200mbit" (both directions), "100mbit/1gbit"
// (up/down), "0" or "none" (unlimited); either side of a "/" may be "0" or
// "none" too.
func ParseHostSpec(s string) (HostSpec, error) {
	up, down, split := strings.Cut(strings.TrimSpace(s), "/")
	if !split {
		down = up
	}
	var h HostSpec
	var err error
	if h.Up, err = parseSide(up); err != nil {
		return HostSpec{}, fmt.Errorf("netem: host spec %q: %w", s, err)
	}
	if h.Down, err = parseSide(down); err != nil {
		return HostSpec{}, fmt.Errorf("netem: host spec %q: %w", s, err)
	}
	return h, nil
}

// parseSide validates one direction's rate and returns it in canonical
// form (lower case, no spaces), "" for unlimited.
func parseSide(s string) (string, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	switch s {
	case "0", "none":
		return "", nil
	case "":
		return "", fmt.Errorf("empty rate (use 0 or none for unlimited)")
	}
	if _, err := parseRate(s); err != nil {
		return "", err
	}
	return s, nil
}

// unitBits gives tc's rate units (tc(8), "RATES") in bits per second. A
// bare number is bits per second, as in tc.
func unitBits(unit string) (float64, bool) {
	switch unit {
	case "", "bit":
		return 1, true
	case "kbit":
		return 1e3, true
	case "mbit":
		return 1e6, true
	case "gbit":
		return 1e9, true
	case "tbit":
		return 1e12, true
	case "kibit":
		return 1 << 10, true
	case "mibit":
		return 1 << 20, true
	case "gibit":
		return 1 << 30, true
	case "tibit":
		return 1 << 40, true
	case "bps":
		return 8, true
	case "kbps":
		return 8e3, true
	case "mbps":
		return 8e6, true
	case "gbps":
		return 8e9, true
	case "tbps":
		return 8e12, true
	case "kibps":
		return 8 << 10, true
	case "mibps":
		return 8 << 20, true
	case "gibps":
		return 8 << 30, true
	case "tibps":
		return 8 << 40, true
	}
	return 0, false
}

const (
	// minRate keeps a typo ("200bit") from making a run crawl for hours.
	minRate = 8_000
	// maxRate is far above what veth pairs carry; beyond it is a typo too.
	maxRate = 1e12
)

// ParseRate reads one rate in tc syntax ("200mbit", "1gbit", "100mbps")
// and returns it in bits per second. It accepts what a HostSpec side
// accepts, except "0" and "none" (unlimited), which are errors here.
func ParseRate(s string) (bitsPerSecond uint64, err error) {
	bits, err := parseRate(s)
	if err != nil {
		return 0, fmt.Errorf("netem: %w", err)
	}
	return bits, nil
}

// FormatRate writes bits per second in tc syntax, in the largest decimal
// unit that keeps it whole: ParseRate(FormatRate(b)) == b.
func FormatRate(bits uint64) string {
	switch {
	case bits >= 1e9 && bits%1e9 == 0:
		return strconv.FormatUint(bits/1e9, 10) + "gbit"
	case bits >= 1e6 && bits%1e6 == 0:
		return strconv.FormatUint(bits/1e6, 10) + "mbit"
	case bits >= 1e3 && bits%1e3 == 0:
		return strconv.FormatUint(bits/1e3, 10) + "kbit"
	}
	return strconv.FormatUint(bits, 10) + "bit"
}

// DivideRate is rate (tc syntax) divided by d, in tc syntax.
func DivideRate(rate string, d uint64) (string, error) {
	if d == 0 {
		return "", fmt.Errorf("netem: rate %q divided by 0", rate)
	}
	bits, err := ParseRate(rate)
	if err != nil {
		return "", err
	}
	return FormatRate(bits / d), nil
}

// Capacity is the host's capacity as the LB's traffic model counts it
// (lb.Input.Capacity): the slower of its two sides, in bytes per second.
// An unlimited side has no capacity to bound by, so it is an error.
func (h HostSpec) Capacity() (bytesPerSecond float64, err error) {
	if h.Up == "" || h.Down == "" {
		return 0, fmt.Errorf("netem: host %s: an unlimited side has no capacity", h)
	}
	up, err := ParseRate(h.Up)
	if err != nil {
		return 0, err
	}
	down, err := ParseRate(h.Down)
	if err != nil {
		return 0, err
	}
	return float64(min(up, down)) / 8, nil
}

// parseRate reads a rate in tc syntax and returns bits per second.
func parseRate(s string) (uint64, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	i := strings.IndexFunc(s, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	if i < 0 {
		i = len(s)
	}
	num, unit := s[:i], s[i:]
	if num == "" {
		return 0, fmt.Errorf("rate %q is not a number with a unit", s)
	}
	mult, ok := unitBits(unit)
	if !ok {
		return 0, fmt.Errorf("rate %q: unknown unit %q (want bit, kbit, mbit, gbit, tbit, bps, kbps, mbps, gbps, ...)", s, unit)
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, fmt.Errorf("rate %q: %q is not a number", s, num)
	}
	bits := v * mult
	switch {
	case bits <= 0:
		return 0, fmt.Errorf("rate %q must be positive (0 or none means unlimited)", s)
	case bits < minRate:
		return 0, fmt.Errorf("rate %q is below %d bit/s", s, minRate)
	case bits > maxRate:
		return 0, fmt.Errorf("rate %q is above %g bit/s", s, float64(maxRate))
	}
	return uint64(math.Round(bits)), nil
}

const (
	// minBurst is tbf's bucket floor: a few full-sized TCP segments (and
	// GSO batches on veth), so that a slow rate still lets packets through.
	minBurst = 32 << 10
	// burstTime sizes the bucket from the rate: at high rates a smaller
	// bucket than 10 ms of traffic starves the shaper between timer ticks.
	burstTimeMs = 10
	// latency bounds tbf's queue; beyond it packets drop and TCP backs off,
	// as on a real bottleneck link.
	latency = "50ms"
)

// tbfArgs are the tc arguments after "qdisc add dev DEV root" that shape
// a link to bits per second.
func tbfArgs(bits uint64) []string {
	burst := max(bits/8*burstTimeMs/1000, minBurst)
	return []string{"tbf", "rate", strconv.FormatUint(bits, 10) + "bit",
		"burst", strconv.FormatUint(burst, 10), "latency", latency}
}
