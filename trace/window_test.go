package trace

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func TestParseWindow(t *testing.T) {
	tests := []struct {
		in   string
		want Window
		bad  bool
	}{
		{in: "", want: All},
		{in: "all", want: All},
		{in: "10-20", want: Window{10, 20}},
		{in: " 10 - 20 ", want: Window{10, 20}},
		{in: "7", want: Window{7, 7}},
		{in: "0-0", want: Window{0, 0}},
		{in: "10-", want: Window{10, math.MaxUint64}},
		{in: "20-10", bad: true},
		{in: "-5", bad: true},
		{in: "a-b", bad: true},
		{in: "10-x", bad: true},
		{in: "1.5", bad: true},
		{in: "10-20-30", bad: true},
		{in: "99999999999999999999", bad: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			w, err := ParseWindow(tt.in)
			if tt.bad {
				if err == nil || !strings.Contains(err.Error(), "FPT_TRACE_ITERS") || !errors.Is(err, ErrWindow) {
					t.Fatalf("ParseWindow(%q) = %v, %v; want an error naming FPT_TRACE_ITERS", tt.in, w, err)
				}
				return
			}
			if err != nil || w != tt.want {
				t.Fatalf("ParseWindow(%q) = %v, %v; want %v", tt.in, w, err, tt.want)
			}
			// String reads back as the same window.
			if back, err := ParseWindow(w.String()); err != nil || back != w {
				t.Errorf("ParseWindow(%q) = %v, %v; want %v", w.String(), back, err, w)
			}
		})
	}
}

func TestWindowContains(t *testing.T) {
	w := Window{10, 20}
	for it, want := range map[uint64]bool{9: false, 10: true, 15: true, 20: true, 21: false} {
		if w.Contains(it) != want {
			t.Errorf("%v.Contains(%d) = %v", w, it, !want)
		}
	}
	if !All.Contains(0) || !All.Contains(math.MaxUint64) {
		t.Error("All misses an iteration")
	}
}
