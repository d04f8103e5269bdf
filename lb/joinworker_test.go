package lb

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/node"
)

// joinWorker has the sim's Balancer take worker id in, checks the
// directive every node relies on, and carries on with it: the joiner
// reports from the decision's iteration on, as a joining worker pushes.
func (s *sim) joinWorker(id node.ID) Directive {
	s.t.Helper()
	prev, granted, done := s.b.Current().Version, s.granted, s.b.Done()
	held := s.b.Held()
	d, err := s.b.JoinWorker(id, s.now)
	if err != nil {
		s.t.Fatalf("JoinWorker(%s): %v", id, err)
	}
	workers := slices.Sorted(slices.Values(append(slices.Clone(s.workers), id)))
	want := Decision{Version: prev + 1, Iteration: granted + 1, Aggregators: s.split.Aggregators, Shares: s.split.Shares, Workers: workers}
	reason := fmt.Sprintf("%s joined: sums count it from iteration %d", id, want.Iteration)
	switch {
	case d.Retry || d.Probe || !d.Shaping || d.Decision == nil:
		s.t.Fatalf("JoinWorker(%s) = %v: want a decision, not a retry nor a probe, shaping on", id, d)
	case !reflect.DeepEqual(*d.Decision, want):
		s.t.Fatalf("JoinWorker(%s) = %v, want the last split that was not a probe, after the horizon %d, with the joiner: %v", id, d.Decision, granted, want)
	case d.Done != done:
		s.t.Fatalf("JoinWorker(%s): Done %d, want %d", id, d.Done, done)
	case d.Horizon != max(granted, done+s.b.cfg.Lookahead):
		// Held: every iteration granted may be done, and no step would
		// come to grant more.
		s.t.Fatalf("JoinWorker(%s): horizon %d after %d granted (held %v), want %d", id, d.Horizon, granted, held, done+s.b.cfg.Lookahead)
	case !strings.HasPrefix(d.Reason, reason):
		s.t.Fatalf("JoinWorker(%s): reason %q, want %q", id, d.Reason, reason)
	case s.b.Held():
		s.t.Fatalf("JoinWorker(%s) left the grants held", id)
	case !slices.Contains(s.b.Workers(), id):
		s.t.Fatalf("Workers() = %v after JoinWorker(%s)", s.b.Workers(), id)
	}
	s.check(s.t, d) // a worker's schedule takes it
	skip, from := s.skip, want.Iteration
	s.skip = func(n node.ID, it uint64) bool { return n == id && it < from || skip(n, it) }
	s.workers = append(s.workers, id)
	s.joined = s.now
	return d
}

// TestBalancerJoinWorker: a joining worker is counted from the first
// iteration after the horizon (a decision keeping the last split that was
// not a probe, naming the workers with it; not a retry), Done does not
// wait for it before then, and training goes on with it. With the LB on
// the next probe measures its links, once they have been measured for
// JoinSettle (its first rates come late: a probe before would fail); with
// it fixed no other decision follows. Under FPT_ON_WORKER_LOSS=wait the
// join ends the hold a lost worker started: the horizon stood still until
// then.
func TestBalancerJoinWorker(t *testing.T) {
	// Server 1 is slow (slowServer1): keeping the balanced split is not
	// keeping the even one.
	cases := []struct {
		name  string
		fixed bool
		upTo  uint64 // the last iteration reported before the join (or the loss)
		state State  // the Balancer's state then
		lose  bool   // wait: worker 1 is lost at upTo, the grants held, then the join
	}{
		{"fixed", true, 7, Default, false},
		{"LB on, default, before the first probe", false, 1, Default, false},
		{"LB on, probing: the split before the probe is kept", false, 5, Probe, false},
		{"LB on, balanced", false, 12, Balanced, false},
		{"wait, fixed: joined after a loss", true, 7, Default, true},
		{"wait, LB on: joined after a loss", false, 12, Balanced, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			servers, workers := ids(2, 3)
			joiner := node.WorkerID(3) // the next worker id no node had
			s := newSim(t, Config{Servers: servers, Workers: workers, Fixed: tc.fixed})
			s.iterTime = func(uint64) time.Duration { return 30 * time.Millisecond }
			s.rate = func(id node.ID, it uint64) (float64, float64) {
				if id == joiner && s.now.Sub(s.joined) < 400*time.Millisecond {
					return 0, 0 // its agent's meter has no whole window yet
				}
				return slowServer1(id, it)
			}
			s.run(tc.upTo)
			if s.b.State() != tc.state {
				t.Fatalf("state %v before the join, want %v", s.b.State(), tc.state)
			}
			if tc.state == Balanced && reflect.DeepEqual(s.split.Shares, Even(0, 0, s.split.Aggregators).Shares) {
				t.Fatalf("balanced at the even split %v: the test shows nothing", s.split)
			}
			if tc.lose {
				s.lose(workers[1])
				s.b.Hold("worker1 lost: waiting for a worker to join")
				frozen := s.granted
				before := len(s.steps)
				s.run(frozen) // every iteration granted
				for _, st := range s.steps[before:] {
					if st.d.Horizon != frozen {
						t.Fatalf("held: after iteration %d, horizon %d, want %d kept", st.it, st.d.Horizon, frozen)
					}
				}
				if s.b.Done() != frozen+1 || len(s.steps) == before {
					t.Fatalf("held: Done %d after %d directives, want %d: the iterations granted complete", s.b.Done(), len(s.steps)-before, frozen+1)
				}
			}
			was := s.b.Current()
			d := s.joinWorker(joiner)
			j := d.Decision.Iteration
			for _, bad := range []node.ID{joiner, servers[0], workers[0], node.ServerID(5)} {
				if d, err := s.b.JoinWorker(bad, s.now); err == nil {
					t.Fatalf("JoinWorker(%s) accepted: %v", bad, d)
				}
			}
			if cur := s.b.Current(); !reflect.DeepEqual(cur, *d.Decision) || reflect.DeepEqual(cur, was) {
				t.Fatalf("current %v after the join and refused ones, want %v", cur, d.Decision)
			}
			before := len(s.steps)
			s.run(j + 40)
			after := s.steps[before:]
			for i, st := range after {
				if want := after[0].d.Done + uint64(i); st.d.Done != want {
					t.Fatalf("directive %d after the join: Done %d, want %d", i, st.d.Done, want)
				}
			}
			for it := uint64(0); it <= s.granted; it++ {
				if got := slices.Contains(s.sched.WorkersAt(it), joiner); got != (it >= j) {
					t.Fatalf("WorkersAt(%d) = %v: the joiner counts from %d", it, s.sched.WorkersAt(it), j)
				}
			}
			var probe *step
			for i, st := range after {
				if st.d.Decision == nil {
					continue
				}
				if strings.HasPrefix(st.d.Reason, "probe failed") {
					t.Fatalf("after the join: %v", st.d)
				}
				if st.d.Probe && probe == nil {
					probe = &after[i]
				}
			}
			if tc.fixed {
				if len(s.decisions()) != 0 {
					t.Fatalf("fixed: decisions %v", s.decisions())
				}
				return
			}
			if probe == nil || !slices.Contains(probe.d.Decision.Aggregators, joiner) || s.b.State() != Balanced {
				t.Fatalf("LB on: probe %v after the join, state %v; want one over the joiner too, then balanced", probe, s.b.State())
			}
			if up, _ := s.b.Measured(); up[joiner] == 0 {
				t.Fatalf("the joiner's links unmeasured: %v", up)
			}
		})
	}
}

// TestBalancerJoinWorkerProgress: a worker that joins after a lost
// worker's retry never had a sum over the old workers: its reports count
// whatever retry version they carry, until the next lost worker's retry,
// which it must then apply like the others.
func TestBalancerJoinWorkerProgress(t *testing.T) {
	servers, workers := ids(1, 3)
	w0, w1, w2, joiner := workers[0], workers[1], workers[2], node.WorkerID(3)
	// AheadFor off: the grants below count on the lookahead of 2.
	b, err := NewBalancer(Config{Servers: servers, Workers: workers, Fixed: true, AheadFor: -1})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	report := func(id node.ID, it uint64, version uint32) {
		t.Helper()
		now = now.Add(time.Millisecond)
		b.Observe(Sample{Node: id, Iteration: it, Version: version}, now)
	}
	for it := range uint64(4) {
		for _, id := range workers {
			report(id, it, 0)
		}
	}
	if _, err := b.Lose(w2, "test"); err != nil || b.Done() != 4 { // version 1, from 4
		t.Fatalf("Lose: %v, Done %d", err, b.Done())
	}
	b.Hold("test")
	for it := uint64(4); it <= 6; it++ {
		report(w0, it, 1)
		report(w1, it, 1)
	}
	d, err := b.JoinWorker(joiner, now)
	if err != nil || d.Decision.Iteration != 7 || b.Done() != 7 {
		t.Fatalf("JoinWorker = %v, %v; Done %d: want a decision from 7 with 4 to 6 done", d, err, b.Done())
	}
	report(w0, 7, 1)
	report(w1, 7, 1)
	report(joiner, 7, 0) // it applied no retry: there was none since it joined
	if b.Done() != 8 {
		t.Fatalf("Done %d after every worker reported 7, want 8", b.Done())
	}
	if _, err := b.Lose(w0, "test"); err != nil { // version 3, from 8
		t.Fatal(err)
	}
	report(w1, 8, 3)
	report(joiner, 8, 0) // made before it applied the retry
	if b.Done() != 8 {
		t.Fatalf("Done %d: the joiner's report under the old workers counted after a new retry", b.Done())
	}
	report(joiner, 8, 3)
	if b.Done() != 9 {
		t.Fatalf("Done %d, want 9", b.Done())
	}
}

// TestBalancerHold: held, the Balancer grants nothing past the horizon
// while the iterations granted complete (Done goes on, directives still
// come), and a decision it makes meanwhile (here the warm-up's probe)
// takes effect after that horizon. Release, or a worker joining, grants
// at once what the steps held back (with every iteration granted done, no
// step would come); a join at the probe's iteration supersedes it.
func TestBalancerHold(t *testing.T) {
	for _, join := range []bool{false, true} {
		t.Run(map[bool]string{false: "Release", true: "JoinWorker"}[join], func(t *testing.T) {
			servers, workers := ids(2, 2)
			s := newSim(t, Config{Servers: servers, Workers: workers})
			s.b.Hold("test")
			if !s.b.Held() {
				t.Fatal("Held() false after Hold")
			}
			s.run(s.granted) // 0 to 2: the warm-up's probe is decided at 2
			if len(s.steps) != 3 || s.granted != 2 || s.b.Done() != 3 {
				t.Fatalf("held: %d directives, horizon %d, Done %d; want 3, 2 kept, 3", len(s.steps), s.granted, s.b.Done())
			}
			ds := s.decisions()
			if len(ds) != 1 || !ds[0].d.Probe || ds[0].d.Decision.Iteration != 3 {
				t.Fatalf("held: decisions %v, want the probe from 3", ds)
			}
			var d Directive
			if join {
				d = s.joinWorker(node.WorkerID(2))
				if d.Decision.Iteration != 3 || s.sched.At(3).Version != d.Decision.Version {
					t.Fatalf("the join %v does not supersede the probe at 3", d)
				}
			} else {
				d = s.b.Release()
				if d.Decision != nil || d.Horizon != 5 || d.Done != 3 || !strings.Contains(d.Reason, "test") {
					t.Fatalf("Release() = %v, want horizon 5, Done 3, no decision", d)
				}
				s.check(t, d)
			}
			if s.b.Held() {
				t.Fatal("still held")
			}
			s.run(20)
			if s.b.State() != Balanced {
				t.Fatalf("state %v after 20 iterations, want balanced", s.b.State())
			}
		})
	}
}

// TestBalancerJoinWorkerLimit: a job with as many nodes as a decision can
// name takes no worker more, and is left as it was.
func TestBalancerJoinWorkerLimit(t *testing.T) {
	servers, workers := ids(1, MaxAggregators-1)
	b, err := NewBalancer(Config{Servers: servers, Workers: workers, Fixed: true})
	if err != nil {
		t.Fatal(err)
	}
	id := node.WorkerID(MaxAggregators)
	if d, err := b.JoinWorker(id, time.Time{}); err == nil || errors.Is(err, ErrInvalid) || len(b.Workers()) != MaxAggregators-1 || b.Current().Version != 0 {
		t.Fatalf("JoinWorker(%s) = %v, %v: want refused, nothing changed", id, d, err)
	}
}

// TestBalancerLoseDuringJoin: a loss while a worker's join iteration is
// still ahead of Done cannot be re-cut around the join, and is refused,
// changing nothing; the joiner's own loss, and any loss once Done reached
// its iteration, are re-cut as usual.
func TestBalancerLoseDuringJoin(t *testing.T) {
	servers, workers := ids(2, 2)
	joiner := node.WorkerID(2)
	tests := []struct {
		name string
		lose node.ID
		done int // 0: Done before the join iteration; 1: at it; 2: past it
		ok   bool
	}{
		{"a worker, join ahead", workers[1], 0, false},
		{"a server, join ahead", servers[0], 0, false},
		{"the joiner, join ahead", joiner, 0, true},
		{"a worker, join under way", workers[1], 1, false},
		{"a server, join under way", servers[0], 1, true},
		{"a worker, join done", workers[1], 2, true},
		{"a server, join done", servers[0], 2, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := NewBalancer(Config{Servers: servers, Workers: workers, Fixed: true})
			if err != nil {
				t.Fatal(err)
			}
			now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
			for _, id := range workers {
				b.Observe(Sample{Node: id, Iteration: 0}, now)
			}
			d, err := b.JoinWorker(joiner, now)
			if err != nil {
				t.Fatal(err)
			}
			at := d.Decision.Iteration
			if tt.done > 0 {
				for it := range at + uint64(tt.done) - 1 {
					for _, id := range append(slices.Clone(workers), joiner) {
						if id != joiner || it >= at {
							b.Observe(Sample{Node: id, Iteration: it}, now)
						}
					}
				}
				if want := at + uint64(tt.done) - 1; b.Done() != want {
					t.Fatalf("Done %d, want %d (the join iteration %d)", b.Done(), want, at)
				}
			}
			before := b.Current()
			_, err = b.Lose(tt.lose, "test")
			if (err == nil) != tt.ok {
				t.Fatalf("Lose(%s) with Done %d, join at %d: %v, want ok %v", tt.lose, b.Done(), at, err, tt.ok)
			}
			if err != nil && (!reflect.DeepEqual(b.Current(), before) || !slices.Contains(b.Workers(), tt.lose) && !slices.Contains(b.Servers(), tt.lose)) {
				t.Fatalf("a refused Lose changed the balancer: %v, was %v", b.Current(), before)
			}
		})
	}
}
