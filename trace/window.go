package trace

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Window is the inclusive range of iterations a recorder keeps.
type Window struct{ First, Last uint64 }

// All is every iteration: the default when FPT_TRACE_ITERS is not set.
var All = Window{0, math.MaxUint64}

// Contains reports whether iteration it is in the window.
func (w Window) Contains(it uint64) bool { return it >= w.First && it <= w.Last }

// String is the window as ParseWindow reads it.
func (w Window) String() string {
	switch {
	case w == All:
		return "all"
	case w.Last == math.MaxUint64:
		return fmt.Sprintf("%d-", w.First)
	case w.First == w.Last:
		return strconv.FormatUint(w.First, 10)
	}
	return fmt.Sprintf("%d-%d", w.First, w.Last)
}

// ErrWindow is what a bad FPT_TRACE_ITERS is wrapped in; it says what the
// variable accepts.
var ErrWindow = errors.New(`must be an iteration N, a range "A-B" (A ≤ B, both included), "A-" (from A on) or "all"`)

// ParseWindow reads FPT_TRACE_ITERS: "10-20", "10-", "7", "all" or "" (all).
// Iteration 0 is the init round.
func ParseWindow(s string) (Window, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "all" {
		return All, nil
	}
	num := func(v string) (uint64, bool) {
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		return n, err == nil
	}
	first, last, isRange := strings.Cut(s, "-")
	a, ok := num(first)
	if !ok {
		return Window{}, fmt.Errorf("FPT_TRACE_ITERS=%q: %w", s, ErrWindow)
	}
	if !isRange {
		return Window{a, a}, nil
	}
	if strings.TrimSpace(last) == "" {
		return Window{a, math.MaxUint64}, nil
	}
	b, ok := num(last)
	if !ok || b < a {
		return Window{}, fmt.Errorf("FPT_TRACE_ITERS=%q: %w", s, ErrWindow)
	}
	return Window{a, b}, nil
}
