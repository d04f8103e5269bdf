package bench

import (
	"io"
	"math"
	"testing"
	"time"
)

func TestBackloggedRatio(t *testing.T) {
	t0 := time.Unix(0, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	// Flow 0 gets 3 units per tick and has 30 in all; flow 1 gets 1 per
	// tick while flow 0 sends, then all the link (4 per tick) to its 30.
	var samples []sample
	var b0, b1 float64
	for i := 0; b0 < 30 || b1 < 30; i++ {
		samples = append(samples, sample{at: at(100 * i), bytes: [2]float64{b0, b1}})
		if b0 < 30 {
			b0, b1 = b0+3, b1+1
		} else {
			b1 = min(b1+4, 30)
		}
	}
	samples = append(samples, sample{at: at(100 * len(samples)), bytes: [2]float64{30, 30}})
	w, err := backloggedWindow(samples)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(w.ratio-3) > 1e-9 {
		t.Errorf("ratio %v, want 3 (bytes %v)", w.ratio, w.bytes)
	}
	// From 10 % (3 units: tick 1) to 85 % (25.5: tick 8) of flow 0.
	if w.length != 700*time.Millisecond {
		t.Errorf("window %v, want 700ms", w.length)
	}

	// The same with the roles swapped: flow 1 is the one that ends first.
	swapped := make([]sample, len(samples))
	for i, s := range samples {
		swapped[i] = sample{at: s.at, bytes: [2]float64{s.bytes[1], s.bytes[0]}}
	}
	if w, err := backloggedWindow(swapped); err != nil || math.Abs(w.ratio-1.0/3) > 1e-9 {
		t.Errorf("swapped: ratio %v (%v), want 1/3", w.ratio, err)
	}

	// Too few samples: a clear error rather than a ratio from nothing.
	for _, few := range [][]sample{samples[:1], {samples[0], samples[len(samples)-1]}} {
		if _, err := backloggedWindow(few); err == nil {
			t.Errorf("%d samples: no error", len(few))
		}
	}
}

// Flags the shaping and priority scenarios reject before they need root.
func TestScenarioUsage(t *testing.T) {
	for _, args := range [][]string{
		{"--scenario", "shaping", "--weights", "3"},
		{"--scenario", "shaping", "--weights", "0:1"},
		{"--scenario", "shaping", "--rate", "100mbit/1gbit"},
		{"--scenario", "priority", "--tensor-bytes", "6"},
		{"--scenario", "priority", "--iters", "0"},
		{"--scenario", "shaping,priority"},
	} {
		f := newFlags(io.Discard)
		if err := f.fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		if code := scenarioMain(f); code != 2 {
			t.Errorf("%v: exit %d, want 2 (usage)", args, code)
		}
	}
}
