package bench

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// median is the median of xs (the mean of the middle two when their number
// is even), 0 for none; xs is not reordered.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// mean is the mean of xs, 0 for none.
func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

// tailMedian is the median of the last k of xs, to three decimals.
func tailMedian(xs []float64, k int) (float64, error) {
	if k < 1 || len(xs) < k {
		return 0, fmt.Errorf("the median of the last %d of %d iterations", k, len(xs))
	}
	return round3(median(xs[len(xs)-k:])), nil
}

// round3 rounds to three decimals: a microsecond of a time in
// milliseconds, and all a noisy machine's ratios are worth.
func round3(x float64) float64 { return math.Round(x*1000) / 1000 }

// ms is d in milliseconds, to the microsecond.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }

// gbps is bytes moved in d, in Gbit/s.
func gbps(bytes float64, d time.Duration) float64 { return bytes * 8 / d.Seconds() / 1e9 }

// cpuPerGB is CPU seconds per GB (1e9 bytes) of bytes moved; 0 when
// nothing moved.
func cpuPerGB(cpu time.Duration, bytes float64) float64 {
	if bytes <= 0 {
		return 0
	}
	return cpu.Seconds() / (bytes / 1e9)
}
