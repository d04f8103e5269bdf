package lbagent

import (
	"math"
	"testing"
	"time"
)

func TestMeter(t *testing.T) {
	t0 := time.Unix(1000, 0)
	const tick = 25 * time.Millisecond
	type reading struct{ sent, recv uint64 }
	// steady feeds n ticks at the given rates (bytes per tick) after start.
	steady := func(start reading, n int, sent, recv uint64) []reading {
		out := []reading{start}
		for range n {
			start.sent += sent
			start.recv += recv
			out = append(out, start)
		}
		return out
	}
	tests := []struct {
		name             string
		readings         []reading
		wantUp, wantDown float64 // bytes/s
		wantSent         uint64
	}{
		{"shorter than a window", steady(reading{}, 5, 1000, 1000), 0, 0, 5000},
		// 1000 bytes per 25 ms = 40 kB/s.
		{"steady", steady(reading{}, 40, 1000, 2000), 40e3, 80e3, 40000},
		// A burst that lasts a tick is smoothed over the window (10 ticks).
		{"burst", append(steady(reading{}, 20, 100, 100), reading{2000 + 100000, 2000 + 100000}, reading{102100, 102100}),
			(100000.0 + 9*100) / 0.25, (100000.0 + 9*100) / 0.25, 102100},
		// Idle time does not lower the peak of the busy part.
		{"busy then idle", append(steady(reading{}, 20, 1000, 1000), steady(reading{20000, 20000}, 40, 0, 0)[1:]...), 40e3, 40e3, 20000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := NewMeter(10 * tick)
			for i, r := range tt.readings {
				m.Add(t0.Add(time.Duration(i)*tick), r.sent, r.recv)
			}
			up, down, sent, _ := m.Take()
			if math.Abs(up-tt.wantUp) > 1e-6*max(1, tt.wantUp) || math.Abs(down-tt.wantDown) > 1e-6*max(1, tt.wantDown) {
				t.Errorf("rates %g up, %g down; want %g, %g", up, down, tt.wantUp, tt.wantDown)
			}
			if sent != tt.wantSent {
				t.Errorf("sent %d, want %d", sent, tt.wantSent)
			}
		})
	}
}

// Take starts a new period: peaks and byte counts restart, and counters
// that go backwards never give a negative or huge rate.
func TestMeterPeriodsAndResets(t *testing.T) {
	t0 := time.Unix(1000, 0)
	m := NewMeter(100 * time.Millisecond)
	for i := range 10 {
		m.Add(t0.Add(time.Duration(i)*20*time.Millisecond), uint64(i)*1000, uint64(i)*1000)
	}
	if up, _, sent, _ := m.Take(); up == 0 || sent != 9000 {
		t.Fatalf("first period: up %g, sent %d", up, sent)
	}
	// A period in which no window ended (no reading since the last
	// Take) reports the latest window's rates, and no bytes.
	if up, down, sent, recv := m.Take(); up != 50e3 || down != 50e3 || sent != 0 || recv != 0 {
		t.Fatalf("empty period: %g %g %d %d, want the latest window's 50000 50000 0 0", up, down, sent, recv)
	}
	// The counters restart (a peer's counters went away).
	for i := range 3 {
		m.Add(t0.Add(time.Second+time.Duration(i)*20*time.Millisecond), uint64(i), uint64(i))
	}
	// The same instant twice, and time going back, are ignored.
	m.Add(t0.Add(time.Second+40*time.Millisecond), 5, 5)
	m.Add(t0, 1<<60, 1<<60)
	up, down, sent, recv := m.Take()
	if up < 0 || down < 0 || up > 1e6 || down > 1e6 || sent > 10 || recv > 10 {
		t.Fatalf("after a reset: %g %g %d %d", up, down, sent, recv)
	}
}
