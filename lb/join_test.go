package lb

import (
	"slices"
	"testing"
	"time"

	"github.com/fptps/fpt/node"
)

// TestBalancerJoin: a joining server gets its share at once with the LB
// fixed (the even split over every server, after the horizon granted),
// and with it on from the split after a probe that includes it, which
// waits until its links have been measured for JoinSettle: its agent
// reports no rate before it has seen a whole window, and a probe without
// its rates would fail.
func TestBalancerJoin(t *testing.T) {
	const joiner = node.ID(12) // server 2
	for _, fixed := range []bool{true, false} {
		t.Run(map[bool]string{true: "fixed", false: "LB on"}[fixed], func(t *testing.T) {
			servers, workers := ids(2, 3)
			s := newSim(t, Config{Servers: servers, Workers: workers, Fixed: fixed, Warmup: 1000})
			// 30 ms iterations: a probe of 2 would last 60 ms, far
			// less than the joiner needs to have a rate.
			s.iterTime = func(uint64) time.Duration { return 30 * time.Millisecond }
			joinedAt := uint64(0)
			s.rate = func(id node.ID, it uint64) (float64, float64) {
				if id == joiner && s.now.Sub(s.joined) < 250*time.Millisecond {
					return 0, 0 // the new agent's meter has no whole window yet
				}
				return 1e9, 1e9
			}
			s.run(5)
			joinedAt = s.it
			s.joined = s.now
			d, ok, err := s.b.Join(joiner, s.now)
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := s.b.Join(joiner, s.now); err == nil {
				t.Error("a second Join of the same server accepted")
			}
			s.servers = append(s.servers, joiner)
			if !slices.Contains(s.b.Servers(), joiner) {
				t.Fatalf("Servers() = %v after the join", s.b.Servers())
			}
			if fixed {
				want := Even(1, s.granted+1, s.servers)
				if !ok || d.Decision == nil || d.Retry || !slices.Equal(d.Decision.Aggregators, want.Aggregators) || d.Decision.Iteration != want.Iteration || d.Decision.Version != 1 {
					t.Fatalf("fixed: Join = %v, %v; want %v", d, ok, want)
				}
				s.check(t, d) // a worker's schedule takes it
				s.run(40)
				if ds := s.decisions(); len(ds) != 0 {
					t.Errorf("fixed: decisions after the join: %v", ds)
				}
				return
			}
			if ok || d.Decision != nil {
				t.Fatalf("LB on: Join = %v, want no decision before a probe", d)
			}
			s.run(40)
			var probe, after *step
			for i, st := range s.decisions() {
				switch {
				case st.d.Probe && probe == nil:
					probe = &s.decisions()[i]
				case !st.d.Probe && probe != nil && after == nil:
					after = &s.decisions()[i]
				}
			}
			if probe == nil || after == nil {
				t.Fatalf("no probe and decision after the join: %v", s.decisions())
			}
			if !slices.Contains(probe.d.Decision.Aggregators, joiner) {
				t.Errorf("the probe %v leaves the joiner out", probe.d)
			}
			// The step of iteration i comes when it ends: i-joinedAt+1
			// iterations after the join.
			if waited := time.Duration(probe.it-joinedAt+1) * 30 * time.Millisecond; waited < 500*time.Millisecond {
				t.Errorf("the probe started %s after the join, before JoinSettle", waited)
			}
			if i := slices.Index(after.d.Decision.Aggregators, joiner); i < 0 || after.d.Decision.Shares[i] == 0 {
				t.Errorf("after the probe %v: the joiner has no share (the probe failed?)", after.d)
			}
		})
	}
}
