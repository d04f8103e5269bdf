package van

import (
	"bytes"
	"testing"
)

func TestWindowAdvance(t *testing.T) {
	parts := func() [][]byte { return [][]byte{[]byte("head"), []byte("ab"), []byte("cdefg")} }
	for _, tc := range []struct {
		limit, written int
		window, rest   string
	}{
		{limit: 100, written: 11, window: "headabcdefg", rest: ""},
		{limit: 5, written: 5, window: "heada", rest: "bcdefg"},
		{limit: 4, written: 3, window: "head", rest: "dabcdefg"},
		{limit: 6, written: 6, window: "headab", rest: "cdefg"},
		{limit: 0, written: 0, window: "", rest: "headabcdefg"},
	} {
		bufs := parts()
		w := window(nil, bufs, tc.limit)
		if got := string(bytes.Join(w, nil)); got != tc.window {
			t.Errorf("window(%d) = %q, want %q", tc.limit, got, tc.window)
		}
		if size(w) != len(tc.window) {
			t.Errorf("size(window(%d)) = %d, want %d", tc.limit, size(w), len(tc.window))
		}
		rest := advance(bufs, tc.written)
		if got := string(bytes.Join(rest, nil)); got != tc.rest {
			t.Errorf("advance(%d) leaves %q, want %q", tc.written, got, tc.rest)
		}
		for _, b := range rest {
			if len(b) == 0 {
				t.Errorf("advance(%d) left an empty slice", tc.written)
			}
		}
	}
}
