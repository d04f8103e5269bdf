package lb

import (
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/fptps/fpt/node"
)

// lose has the sim's Balancer lose server or worker id, checks the retry
// directive every node relies on, and carries on without the node: it
// reports no more, and the checker's schedule takes the retry like a
// worker's does. After a lost worker the workers left push, and report,
// the re-cut iterations again.
func (s *sim) lose(id node.ID) Directive {
	s.t.Helper()
	prev, done := s.b.Current().Version, s.b.Done()
	without := func(ids []node.ID) []node.ID {
		return slices.DeleteFunc(slices.Clone(ids), func(n node.ID) bool { return n == id })
	}
	left, workers := without(s.servers), without(s.workers)
	d, err := s.b.Lose(id, "connection reset")
	if err != nil {
		s.t.Fatalf("Lose(%s): %v", id, err)
	}
	want := Even(prev+1, done, left)
	if len(workers) < len(s.workers) {
		want.Workers = slices.Sorted(slices.Values(workers))
	}
	switch {
	case !d.Retry || d.Probe || !d.Shaping || d.Decision == nil:
		s.t.Fatalf("Lose(%s) = %v: want a retry decision, shaping on", id, d)
	case d.Done != done || d.Decision.Iteration != done:
		s.t.Fatalf("Lose(%s) = %v: Done %d, iteration %d; want both at Done() = %d", id, d, d.Done, d.Decision.Iteration, done)
	case !reflect.DeepEqual(*d.Decision, want):
		s.t.Fatalf("Lose(%s) = %v, want the even split over the servers left, %v", id, d.Decision, want)
	case d.Horizon != s.granted:
		s.t.Fatalf("Lose(%s): horizon %d, granted %d", id, d.Horizon, s.granted)
	case !slices.Equal(s.b.Servers(), left) || !slices.Equal(s.b.Workers(), workers):
		s.t.Fatalf("Servers() = %v, Workers() = %v after losing %s, want %v and %v", s.b.Servers(), s.b.Workers(), id, left, workers)
	case s.b.State() != Default || !reflect.DeepEqual(s.b.Current(), want):
		s.t.Fatalf("after Lose: state %v, current %v", s.b.State(), s.b.Current())
	}
	b, err := d.MarshalBinary()
	if err != nil {
		s.t.Fatalf("%v does not encode: %v", d, err)
	}
	if back, err := UnmarshalDirective(b); err != nil || !reflect.DeepEqual(back, d) {
		s.t.Fatalf("%v came back as %v, %v", d, back, err)
	}
	if err := s.sched.Rewrite(*d.Decision); err != nil {
		s.t.Fatalf("a worker's schedule refuses %v: %v", d, err)
	}
	s.version, s.retried = d.Decision.Version, d.Decision.Version
	s.split = *d.Decision
	s.servers = left
	if len(workers) < len(s.workers) {
		s.workers = workers
		s.it = d.Decision.Iteration
	}
	// A late report from the lost server is not a member's: it is ignored.
	if out := s.b.Observe(Sample{Node: id, Iteration: s.it, UpRate: 1, DownRate: 1}, s.now); out != nil {
		s.t.Fatalf("a report of the lost server produced %v", out)
	}
	return d
}

// TestBalancerLose: a lost server costs a retry decision at Done(), the
// even split over the servers left; then training goes on without it.
// With the LB on, the Balancer starts over and a later probe measures
// only the nodes left; with it fixed, nothing but horizons follows.
func TestBalancerLose(t *testing.T) {
	cases := []struct {
		name  string
		fixed bool
		upTo  uint64 // the last iteration reported before the loss
		state State  // the Balancer's state then
	}{
		{"default, before the first probe", false, 1, Default},
		{"probe issued, not yet in force", false, 3, Probe},
		{"probing", false, 5, Probe},
		{"balanced", false, 12, Balanced},
		{"fixed", true, 7, Default},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			servers, workers := ids(3, 2)
			s := newSim(t, Config{Servers: servers, Workers: workers, Fixed: tc.fixed})
			s.run(tc.upTo)
			if s.b.State() != tc.state {
				t.Fatalf("state %v before the loss, want %v", s.b.State(), tc.state)
			}
			if s.b.Done() != tc.upTo+1 {
				t.Fatalf("Done() = %d after reporting through %d", s.b.Done(), tc.upTo)
			}
			lost := servers[1]
			s.lose(lost)
			before := len(s.steps)
			s.run(tc.upTo + 50)
			after := s.steps[before:]
			if len(after) != 50 {
				t.Fatalf("%d directives for 50 iterations after the loss", len(after))
			}
			var probes int
			for _, st := range after {
				dec := st.d.Decision
				if dec == nil {
					continue
				}
				if slices.Contains(dec.Aggregators, lost) {
					t.Fatalf("after iteration %d: %v names the lost server", st.it, st.d)
				}
				if st.d.Probe {
					probes++
					if want := slices.Concat(s.servers, workers); !slices.Equal(dec.Aggregators, want) {
						t.Fatalf("probe over %v, want the nodes left %v", dec.Aggregators, want)
					}
				}
			}
			if tc.fixed {
				if len(s.decisions()) != 0 || s.b.State() != Default {
					t.Fatalf("fixed: decisions %v, state %v", s.decisions(), s.b.State())
				}
			} else if probes == 0 || s.b.State() != Balanced {
				t.Fatalf("LB on: %d probes in 50 iterations after the loss, state %v", probes, s.b.State())
			}
		})
	}
}

// TestBalancerFixed: with Config.Fixed no probe ever starts; the
// Balancer only grants horizons and reports progress.
func TestBalancerFixed(t *testing.T) {
	servers, workers := ids(2, 2)
	s := newSim(t, Config{Servers: servers, Workers: workers, Fixed: true})
	s.run(50)
	if ds := s.decisions(); len(ds) != 0 || s.b.State() != Default {
		t.Fatalf("fixed: decisions %v, state %v", ds, s.b.State())
	}
	if len(s.steps) != 51 {
		t.Fatalf("%d directives for 51 iterations", len(s.steps))
	}
}

// TestBalancerDone: every step's directive says how far every worker
// has got, which is what a worker's held pushes wait on; Done() agrees.
func TestBalancerDone(t *testing.T) {
	for _, fixed := range []bool{false, true} {
		servers, workers := ids(2, 3)
		s := newSim(t, Config{Servers: servers, Workers: workers, Fixed: fixed})
		s.run(20)
		for _, st := range s.steps {
			if st.d.Done != st.it+1 {
				t.Fatalf("fixed %v: directive after iteration %d has Done %d: %v", fixed, st.it, st.d.Done, st.d)
			}
		}
		if s.b.Done() != 21 {
			t.Fatalf("fixed %v: Done() = %d after iteration 20", fixed, s.b.Done())
		}
	}
	// Iterations that complete together each get their directive, in
	// order, with their own Done.
	servers, workers := ids(1, 2)
	b, err := NewBalancer(Config{Servers: servers, Workers: workers})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	for it := range uint64(3) {
		if out := b.Observe(Sample{Node: workers[0], Iteration: it}, now); out != nil {
			t.Fatalf("one worker of two done with %d: %v", it, out)
		}
	}
	out := b.Observe(Sample{Node: workers[1], Iteration: 2}, now)
	if len(out) != 3 {
		t.Fatalf("%d directives for 3 iterations done", len(out))
	}
	for i, d := range out {
		if d.Done != uint64(i)+1 {
			t.Errorf("directive %d: Done %d", i, d.Done)
		}
	}
}

// TestBalancerLoseRefused: losing what is not a node of the job, or its
// last server or last worker, fails and changes nothing.
func TestBalancerLoseRefused(t *testing.T) {
	cases := []struct {
		name             string
		servers, workers int
		id               func(servers, workers []node.ID) node.ID
	}{
		{"the last worker", 2, 1, func(_, w []node.ID) node.ID { return w[0] }},
		{"an unknown id", 2, 2, func([]node.ID, []node.ID) node.ID { return node.ServerID(7) }},
		{"the scheduler", 2, 2, func([]node.ID, []node.ID) node.ID { return node.SchedulerID }},
		{"the last server", 1, 2, func(s, _ []node.ID) node.ID { return s[0] }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			servers, workers := ids(tc.servers, tc.workers)
			s := newSim(t, Config{Servers: servers, Workers: workers})
			s.run(12)
			state, cur, done := s.b.State(), s.b.Current(), s.b.Done()
			up, down := s.b.Measured()
			if d, err := s.b.Lose(tc.id(servers, workers), "test"); err == nil {
				t.Fatalf("accepted: %v", d)
			}
			up2, down2 := s.b.Measured()
			if s.b.State() != state || !reflect.DeepEqual(s.b.Current(), cur) || s.b.Done() != done ||
				!slices.Equal(s.b.Servers(), servers) || !slices.Equal(s.b.Workers(), workers) ||
				!reflect.DeepEqual(up, up2) || !reflect.DeepEqual(down, down2) {
				t.Fatalf("refused Lose changed the Balancer: state %v, current %v, done %d, servers %v",
					s.b.State(), s.b.Current(), s.b.Done(), s.b.Servers())
			}
			// It carries on as before.
			s.run(20)
		})
	}
	// A server lost twice: the second time it is no longer one.
	servers, workers := ids(3, 2)
	s := newSim(t, Config{Servers: servers, Workers: workers})
	s.run(4)
	s.lose(servers[0])
	if d, err := s.b.Lose(servers[0], "again"); err == nil {
		t.Fatalf("lost twice: %v", d)
	}
	s.lose(servers[2])
	if d, err := s.b.Lose(servers[1], "last"); err == nil {
		t.Fatalf("the last server lost: %v", d)
	}
	s.run(30)
}
