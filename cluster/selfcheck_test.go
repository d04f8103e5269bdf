package cluster

import (
	"testing"
	"time"
)

// The heartbeat loop's own tick gap tells a node that it was not running.
func TestSelfSilence(t *testing.T) {
	t0 := time.Unix(1000, 0)
	cases := []struct {
		name    string
		gap     time.Duration
		timeout time.Duration
		want    time.Duration
	}{
		{"on time", 200 * time.Millisecond, time.Second, 0},
		{"late but within the timeout", 900 * time.Millisecond, time.Second, 0},
		{"exactly the timeout", time.Second, time.Second, 0},
		{"stopped for 25 s", 25 * time.Second, 10 * time.Second, 25 * time.Second},
	}
	for _, c := range cases {
		if got := selfSilence(t0, t0.Add(c.gap), c.timeout); got != c.want {
			t.Errorf("%s: selfSilence = %s, want %s", c.name, got, c.want)
		}
	}
}
