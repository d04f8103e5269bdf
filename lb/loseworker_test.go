package lb

import (
	"encoding/binary"
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/fptps/fpt/node"
)

// TestMarshalDirectiveRejectsWorkers: what Validate refuses does not
// encode either.
func TestMarshalDirectiveRejectsWorkers(t *testing.T) {
	too := Even(1, 0, []node.ID{8})
	for i := range MaxAggregators + 1 {
		too.Workers = append(too.Workers, node.WorkerID(i))
	}
	for name, ws := range map[string][]node.ID{
		"empty":    {},
		"unsorted": {11, 9},
		"a server": {8},
		"too many": too.Workers,
	} {
		d := Even(2, 5, []node.ID{8})
		d.Workers = ws
		if b, err := (Directive{Decision: &d}).MarshalBinary(); err == nil {
			t.Errorf("%s: encoded as %x", name, b)
		}
	}
}

// TestUnmarshalDirectiveRejectsWorkers: the workers flag needs a
// decision, a count in 1..MaxAggregators within the bytes present, and
// ids the decision validates with.
func TestUnmarshalDirectiveRejectsWorkers(t *testing.T) {
	le := binary.LittleEndian
	dec := Even(6, 9, []node.ID{8, 10})
	dec.Workers = []node.ID{9, 13}
	good := mustMarshal(t, Directive{Horizon: 14, Decision: &dec})
	// Offsets in good: 22 aggregator count, 50 worker count, 54 and 58
	// the ids, 62 the reason length.
	if len(good) != 64 || le.Uint32(good[50:]) != 2 || good[1] != flagDecision|flagWorkers {
		t.Fatalf("layout changed: %x", good)
	}
	if d, err := UnmarshalDirective(good); err != nil || !reflect.DeepEqual(d.Decision.Workers, dec.Workers) {
		t.Fatalf("the valid one: %v, %v", d, err)
	}
	edit := func(f func(b []byte) []byte) []byte { return f(slices.Clone(good)) }
	count := func(n uint32) []byte { return edit(func(b []byte) []byte { le.PutUint32(b[50:], n); return b }) }
	checkRejects(t, []rejectCase{
		{"workers flag without a decision", cat([]byte{directiveV1, flagWorkers}, make([]byte, 8), le.AppendUint32(nil, 1), le.AppendUint32(nil, 9), []byte{0, 0}), false},
		{"workers flag alone", cat([]byte{directiveV1, flagWorkers}, make([]byte, 8), []byte{0, 0}), false},
		// Nil is sent as no flag: an empty set would be a second encoding.
		{"zero count", cat(good[:50], le.AppendUint32(nil, 0), good[62:]), false},
		{"count beyond the bytes", count(3), false},
		{"count beyond the limit", count(MaxAggregators + 1), false},
		{"huge count", count(1<<32 - 1), false},
		{"ids cut short", cat(good[:58], []byte{0, 0}), false},
		{"workers flag, workers absent", cat(good[:1], []byte{flagDecision | flagWorkers}, good[2:50], good[62:]), false},
		{"workers present, flag absent", edit(func(b []byte) []byte { b[1] = flagDecision; return b }), false},
		{"unsorted", edit(func(b []byte) []byte { le.PutUint32(b[54:], 13); le.PutUint32(b[58:], 9); return b }), true},
		{"twice", edit(func(b []byte) []byte { le.PutUint32(b[58:], 9); return b }), true},
		{"a server", edit(func(b []byte) []byte { le.PutUint32(b[54:], 8); return b }), true},
	})
}

// TestScheduleWorkers: a decision that leaves Workers nil inherits them
// from the latest decision held, on Add and on Rewrite, so that every
// decision names its workers once one has; WorkersAt reads them.
func TestScheduleWorkers(t *testing.T) {
	servers := []node.ID{8, 10}
	all, left, fewer := []node.ID{9, 11, 13}, []node.ID{9, 13}, []node.ID{13}
	dec := func(v uint32, it uint64, ws []node.ID) Decision {
		d := Even(v, it, servers)
		d.Workers = ws
		return d
	}
	type op struct {
		rewrite bool
		d       Decision
	}
	cases := []struct {
		name    string
		initial []node.ID // the initial decision's Workers
		ops     []op
		want    map[uint64][]node.ID // WorkersAt
	}{
		{
			name: "nil throughout: nil",
			ops:  []op{{false, dec(1, 5, nil)}, {true, dec(2, 3, nil)}},
			want: map[uint64][]node.ID{0: nil, 3: nil, 100: nil},
		},
		{
			name:    "set at the start: Add inherits",
			initial: all,
			ops:     []op{{false, dec(1, 5, nil)}, {false, dec(2, 8, nil)}},
			want:    map[uint64][]node.ID{0: all, 5: all, 8: all, 100: all},
		},
		{
			name: "a lost worker's retry, then decisions that leave them",
			ops: []op{
				{false, dec(1, 5, nil)},
				{true, dec(2, 4, left)},
				{false, dec(3, 9, nil)},
				{false, dec(4, 9, nil)}, // supersedes 3 at the same iteration
				{false, dec(5, 12, nil)},
			},
			want: map[uint64][]node.ID{0: nil, 3: nil, 4: left, 9: left, 12: left, 100: left},
		},
		{
			name:    "a second lost worker",
			initial: all,
			ops:     []op{{true, dec(1, 4, left)}, {false, dec(2, 7, nil)}, {true, dec(3, 6, fewer)}},
			want:    map[uint64][]node.ID{0: all, 3: all, 4: left, 5: left, 6: fewer, 7: fewer, 100: fewer},
		},
		{
			// A server lost right after a worker, at the same Done: the
			// server's retry drops the worker's but not its workers.
			name:    "a lost server's retry replaces a lost worker's",
			initial: all,
			ops:     []op{{false, dec(1, 5, nil)}, {true, dec(2, 5, left)}, {true, dec(3, 5, nil)}},
			want:    map[uint64][]node.ID{0: all, 4: all, 5: left, 100: left},
		},
		{
			name:    "Rewrite before every decision held",
			initial: all,
			ops:     []op{{true, dec(1, 0, left)}, {true, dec(2, 0, nil)}},
			want:    map[uint64][]node.ID{0: left, 100: left},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := NewSchedule(dec(0, 0, tc.initial))
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range tc.ops {
				if o.rewrite {
					err = s.Rewrite(o.d)
				} else {
					err = s.Add(o.d)
				}
				if err != nil {
					t.Fatalf("%v: %v", o.d, err)
				}
			}
			for it, want := range tc.want {
				if got := s.WorkersAt(it); !slices.Equal(got, want) || (got == nil) != (want == nil) {
					t.Errorf("WorkersAt(%d) = %v, want %v", it, got, want)
				}
				if got := s.At(it).Workers; !slices.Equal(got, s.WorkersAt(it)) {
					t.Errorf("At(%d).Workers = %v, WorkersAt %v", it, got, s.WorkersAt(it))
				}
			}
		})
	}

	// The schedule keeps its own copy of the workers, and refuses
	// decisions whose workers do not validate.
	ws := slices.Clone(left)
	s, err := NewSchedule(dec(0, 0, ws))
	if err != nil {
		t.Fatal(err)
	}
	ws[0] = 99
	if got := s.WorkersAt(0); !slices.Equal(got, left) {
		t.Errorf("the schedule shares the caller's workers: %v", got)
	}
	for _, d := range []Decision{dec(1, 3, []node.ID{}), dec(1, 3, []node.ID{13, 9}), dec(1, 3, []node.ID{10})} {
		if s.Add(d) == nil || s.Rewrite(d) == nil {
			t.Errorf("workers %v accepted", d.Workers)
		}
	}
	if _, err := NewSchedule(dec(0, 0, []node.ID{})); err == nil {
		t.Error("an initial decision with no workers accepted")
	}
}

// slowServer1 is a sim's rates with server 1 slow: the balanced split
// gives the workers shares.
func slowServer1(id node.ID, _ uint64) (float64, float64) {
	if id == node.ServerID(1) {
		return 1e9, 2.5e8
	}
	return 1e9, 1e9
}

// TestBalancerLoseWorker: a lost worker costs a retry decision at
// Done(), the even split over the servers, naming the workers left; the
// workers left push the re-cut iterations again and training goes on. The
// lost worker is never named again, not even by a probe.
func TestBalancerLoseWorker(t *testing.T) {
	// Server 1 is slow: the balanced split gives the workers shares, so
	// the lost worker was an aggregator.
	cases := []struct {
		name  string
		fixed bool
		upTo  uint64 // the last iteration reported before the loss
		lag   bool   // the lost worker reported nothing of the last two
		state State  // the Balancer's state then
	}{
		{"default, before the first probe", false, 1, false, Default},
		{"probing", false, 5, false, Probe},
		{"balanced", false, 12, false, Balanced},
		{"balanced, the lost worker lagging", false, 12, true, Balanced},
		{"fixed", true, 7, false, Default},
		{"fixed, the lost worker lagging", true, 7, true, Default},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			servers, workers := ids(2, 3)
			lost := workers[1]
			s := newSim(t, Config{Servers: servers, Workers: workers, Fixed: tc.fixed})
			s.rate = slowServer1
			if tc.lag {
				s.skip = func(id node.ID, it uint64) bool { return id == lost && it+2 > tc.upTo }
			}
			s.run(tc.upTo)
			if s.b.State() != tc.state {
				t.Fatalf("state %v before the loss, want %v", s.b.State(), tc.state)
			}
			if named := s.b.Current().Aggregators; tc.state == Balanced && !slices.Contains(named, lost) {
				t.Fatalf("balanced over %v: the worker to lose aggregates nothing", named)
			}
			done := tc.upTo + 1
			if tc.lag {
				done = tc.upTo - 1
			}
			if s.b.Done() != done {
				t.Fatalf("Done() = %d, want %d", s.b.Done(), done)
			}
			d := s.lose(lost)
			if left := []node.ID{workers[0], workers[2]}; !slices.Equal(d.Decision.Workers, left) {
				t.Fatalf("retry names workers %v, want %v", d.Decision.Workers, left)
			}
			before := len(s.steps)
			s.run(done + 50)
			after := s.steps[before:]
			if len(after) != 51 {
				t.Fatalf("%d directives for 51 iterations after the loss", len(after))
			}
			for i, st := range after {
				if st.d.Done != done+uint64(i)+1 {
					t.Fatalf("directive %d after the loss: Done %d, want %d", i, st.d.Done, done+uint64(i)+1)
				}
			}
			var probes int
			for _, st := range after {
				dec := st.d.Decision
				if dec == nil {
					continue
				}
				if slices.Contains(dec.Aggregators, lost) || slices.Contains(dec.Workers, lost) {
					t.Fatalf("after iteration %d: %v names the lost worker", st.it, st.d)
				}
				if st.d.Probe {
					probes++
					if want := slices.Concat(servers, s.workers); !slices.Equal(dec.Aggregators, want) {
						t.Fatalf("probe over %v, want the nodes left %v", dec.Aggregators, want)
					}
				}
			}
			// Every decision since names the workers left, by inheritance.
			for it := done; it <= s.granted; it++ {
				if got := s.sched.WorkersAt(it); !slices.Equal(got, s.workers) {
					t.Fatalf("WorkersAt(%d) = %v, want %v", it, got, s.workers)
				}
			}
			if tc.fixed {
				if len(s.decisions()) != 0 {
					t.Fatalf("fixed: decisions %v", s.decisions())
				}
			} else if probes == 0 || s.b.State() != Balanced {
				t.Fatalf("LB on: %d probes in 50 iterations after the loss, state %v", probes, s.b.State())
			}
		})
	}
}

// TestBalancerLoseWorkerProgress: after a lost worker's retry, the
// workers left have reported the re-cut iterations under the old sums
// only; Done passes such an iteration once every worker left has
// reported it again, under the retry's version or a later one. Stale
// reports still give rates. A lost server's retry changes no sum, so
// reports of any version count.
func TestBalancerLoseWorkerProgress(t *testing.T) {
	servers, workers := ids(1, 3)
	w0, w1, w2 := workers[0], workers[1], workers[2]
	type event struct {
		lose node.ID // Lose it, else observe s
		s    Sample
		done uint64 // Done() after
	}
	smp := func(id node.ID, it uint64, version uint32) event {
		return event{s: Sample{Node: id, Iteration: it, Version: version}}
	}
	at := func(e event, done uint64) event { e.done = done; return e }
	cases := []struct {
		name   string
		events []event
	}{
		{
			// w2 lags at iteration 4; w0 and w1 have reported 4 and 5.
			// The retry (version 1) re-cuts from 4.
			name: "lost worker",
			events: []event{
				{lose: w2, done: 4},
				at(smp(w0, 4, 0), 4), // stale: made before the retry
				at(smp(w1, 4, 0), 4),
				at(smp(w0, 5, 0), 4),
				at(smp(w1, 5, 0), 4),
				at(smp(w2, 5, 1), 4), // the lost worker: ignored
				at(smp(servers[0], 5, 0), 4),
				at(smp(w0, 4, 1), 4), // fresh
				at(smp(w1, 4, 1), 5),
				at(smp(w1, 5, 3), 5), // a later version counts
				at(smp(w0, 5, 1), 6),
			},
		},
		{
			name: "two lost workers: the latest retry counts",
			events: []event{
				{lose: w2, done: 4},
				at(smp(w0, 4, 1), 4),
				at(smp(w1, 4, 1), 5),
				at(smp(w0, 5, 1), 5),
				{lose: w1, done: 5},  // version 2, from 5
				at(smp(w0, 5, 1), 5), // of the first retry: stale now
				at(smp(w0, 6, 1), 5),
				at(smp(w0, 5, 2), 6),
				at(smp(w0, 6, 2), 7),
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b, err := NewBalancer(Config{Servers: servers, Workers: workers, Fixed: true, Lookahead: 4})
			if err != nil {
				t.Fatal(err)
			}
			now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
			for it := range uint64(6) {
				for _, id := range slices.Concat(servers, workers) {
					if id != w2 || it < 4 {
						b.Observe(Sample{Node: id, Iteration: it}, now)
					}
				}
			}
			if b.Done() != 4 {
				t.Fatalf("Done() = %d before the events, want 4", b.Done())
			}
			for i, e := range tc.events {
				now = now.Add(time.Millisecond)
				was := b.Done()
				if e.lose != 0 {
					d, err := b.Lose(e.lose, "test")
					if err != nil || !d.Retry || d.Decision.Iteration != was || d.Done != was || !slices.Equal(d.Decision.Workers, b.Workers()) {
						t.Fatalf("event %d: Lose(%s) = %v, %v", i, e.lose, d, err)
					}
				} else {
					out := b.Observe(e.s, now)
					if uint64(len(out)) != b.Done()-was {
						t.Fatalf("event %d: %d directives for Done %d -> %d", i, len(out), was, b.Done())
					}
				}
				if b.Done() != e.done {
					t.Fatalf("event %d (%+v): Done() = %d, want %d", i, e, b.Done(), e.done)
				}
			}
		})
	}

	// A lost server's retry: reports made before it still count.
	servers2, workers2 := ids(2, 2)
	b, err := NewBalancer(Config{Servers: servers2, Workers: workers2, Fixed: true})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	b.Observe(Sample{Node: workers2[0], Iteration: 0}, now)
	if _, err := b.Lose(servers2[1], "test"); err != nil {
		t.Fatal(err)
	}
	if out := b.Observe(Sample{Node: workers2[1], Iteration: 0}, now); len(out) != 1 || b.Done() != 1 {
		t.Fatalf("after a lost server, a report of version 0: %v, Done %d", out, b.Done())
	}

	// Stale reports give no progress but do give rates: the links they
	// measured are still the node's.
	b, err = NewBalancer(Config{Servers: servers, Workers: workers})
	if err != nil {
		t.Fatal(err)
	}
	for it := range uint64(2) {
		for _, id := range slices.Concat(servers, workers) {
			b.Observe(Sample{Node: id, Iteration: it}, now)
		}
	}
	if _, err := b.Lose(w2, "test"); err != nil {
		t.Fatal(err)
	}
	b.Observe(Sample{Node: w0, Iteration: 3, UpRate: 7e8, DownRate: 6e8}, now) // measured from Done()+1 = 3
	if up, down := b.Measured(); up[w0] != 7e8 || down[w0] != 6e8 || b.Done() != 2 {
		t.Fatalf("a stale report: rates %v, %v, Done %d", up, down, b.Done())
	}
}

// TestBalancerLoseLastWorker: the workers can be lost down to one, not
// to none; a worker is lost once. The retry names the workers in
// increasing id order, whatever the configuration's order (s.lose checks).
func TestBalancerLoseLastWorker(t *testing.T) {
	servers, workers := ids(2, 3)
	slices.Reverse(workers)
	s := newSim(t, Config{Servers: servers, Workers: workers})
	s.run(4)
	s.lose(workers[0])
	if d, err := s.b.Lose(workers[0], "again"); err == nil {
		t.Fatalf("lost twice: %v", d)
	}
	s.run(8)
	s.lose(workers[2])
	cur := s.b.Current()
	if d, err := s.b.Lose(workers[1], "last"); err == nil {
		t.Fatalf("the last worker lost: %v", d)
	}
	if !slices.Equal(s.b.Workers(), workers[1:2]) || !reflect.DeepEqual(s.b.Current(), cur) {
		t.Fatalf("a refused Lose changed the Balancer: workers %v, current %v", s.b.Workers(), s.b.Current())
	}
	s.run(30)

	// A configured "worker" whose id is a server's would be named in a
	// retry no node accepts: refused, nothing changed.
	b, err := NewBalancer(Config{Servers: servers, Workers: []node.ID{9, 100}})
	if err != nil {
		t.Fatal(err)
	}
	if d, err := b.Lose(9, "test"); !errors.Is(err, ErrInvalid) || !slices.Equal(b.Workers(), []node.ID{9, 100}) || b.Current().Version != 0 {
		t.Fatalf("Lose left a server id as the workers: %v, %v; workers %v", d, err, b.Workers())
	}
}
