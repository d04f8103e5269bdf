package lb

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/node"
)

// oneHost places every node of cfg on host 0, its workers summing there.
func oneHost(c *Config) {
	c.Hosts = &Hosts{Of: map[node.ID]int{}, Local: true}
	for _, id := range slices.Concat(c.Servers, c.Workers) {
		c.Hosts.Of[id] = 0
	}
}

func TestBalancerOneHost(t *testing.T) {
	ms := func(n float64) time.Duration { return time.Duration(n * float64(time.Millisecond)) }
	leaderOf := func(workers []node.ID) Decision {
		return Decision{Aggregators: []node.ID{slices.Min(workers)}, Shares: []float64{1}}
	}
	tests := []struct {
		name      string
		place     func(*Config) // nil: oneHost
		even, ldr time.Duration
		from      uint64  // 0: no change
		slower    float64 // the leader's time times this from `from`
		burst     uint64  // for this many iterations (0: to the end)
		// onLeader and guards: the steps (the iterations whose completion
		// issued them) of the leader's splits and of the guard's
		// decisions; backoffs: from each guard to the next leader's split.
		onLeader []uint64
		guards   []uint64
		backoffs []uint64
		probes   int
		reason   string // the first leader's decision's
		guardMsg string // the first guard's
		state    State
	}{
		{
			name: "the leader faster: on it once the even split is timed, for good",
			even: ms(30), ldr: ms(10), onLeader: []uint64{5}, state: Balanced,
			reason: "one host: every partition on its group's leader worker0(9) (the even split over the servers took 30.0 ms; warm-up done (2 iterations on the even split))",
		},
		{
			// No rate is measured, so short iterations do not keep it
			// from the leader, as they keep a probe from starting.
			name: "short iterations: on the leader all the same",
			even: ms(2), ldr: ms(1), onLeader: []uint64{5}, state: Balanced,
		},
		{
			name: "the leader twice as slow: the guard, back-off doubling",
			even: ms(25), ldr: ms(50), onLeader: []uint64{5, 61, 167, 373}, guards: []uint64{11, 67, 173, 379},
			backoffs: []uint64{50, 100, 200}, state: Default,
			guardMsg: "balanced split measured 50.0 ms, slower than the even split's 25.0 ms; back to the even split, next try of the leader's split after iteration 61",
		},
		{
			name: "the leader slows: back to the even split, timed afresh, then the leader again",
			even: ms(30), ldr: ms(10), from: 100, slower: 2,
			onLeader: []uint64{5, 112}, state: Balanced, // 10 ms is short until the slowed ones fill the recent times
		},
		{
			// Scheduling noise: three iterations in a row twice as slow.
			name: "short iterations, three slow in a row: still on the leader",
			even: ms(2), ldr: ms(1), from: 100, slower: 2, burst: 3,
			onLeader: []uint64{5}, state: Balanced,
		},
		{
			// The leader's first iterations, slow with the job's start
			// (its segment's pages, the workers' first steps), against
			// the even split's warm-up times: one report's worth of them
			// is no measurement.
			name: "short iterations, the leader's first four slow: still on the leader",
			even: ms(2), ldr: ms(1), from: 16, slower: 3, burst: 4,
			onLeader: []uint64{5}, state: Balanced,
		},
		{
			name: "short iterations, the leader twice as slow: the guard, after 12 of them",
			even: ms(1), ldr: ms(2), onLeader: []uint64{5, 88, 221}, guards: []uint64{38, 121, 254}, backoffs: []uint64{50, 100},
			state:    Default,
			guardMsg: "balanced split measured 2.0 ms, slower than the even split's 1.0 ms; back to the even split, next try of the leader's split after iteration 88",
		},
		{
			name: "short iterations, a lasting slowdown: the even split after 12 iterations (at 111), then the leader again",
			even: ms(2), ldr: ms(1), from: 100, slower: 2,
			onLeader: []uint64{5, 127}, state: Balanced,
		},
		{
			// FPT_LOCAL_AGGREGATION=on with one worker: no group, and no
			// link to measure either (a probe failed every time).
			name:  "a lone worker: on it",
			place: func(c *Config) { c.Workers = c.Workers[:1]; oneHost(c) },
			even:  ms(30), ldr: ms(10), onLeader: []uint64{5}, state: Balanced,
		},
		{
			name:  "a server on another host: the probe, as by host",
			place: func(c *Config) { oneHost(c); c.Hosts.Of[c.Servers[1]] = 1 },
			even:  ms(30), ldr: ms(10), probes: 1, state: Balanced,
		},
		{
			name:  "a worker without shared memory: the probe",
			place: func(c *Config) { oneHost(c); c.Hosts.Alone = map[node.ID]bool{c.Workers[1]: true} },
			even:  ms(30), ldr: ms(10), probes: 1, state: Balanced,
		},
		{
			name:  "workers not summing on the host: the probe",
			place: func(c *Config) { oneHost(c); c.Hosts.Local = false },
			even:  ms(30), ldr: ms(10), probes: 1, state: Balanced,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			place := tt.place
			if place == nil {
				place = oneHost
			}
			var s *sim
			s = newTimedSim(t, place, func(it uint64) time.Duration {
				d := tt.ldr
				switch dec := s.sched.At(it); {
				case dec.SplitWithin(Even(0, 0, s.servers), ShareTolerance):
					d = tt.even
				case !dec.SplitWithin(leaderOf(s.workers), ShareTolerance):
					d = (tt.even + tt.ldr) / 2 // a probe's or a balanced split's
				case tt.from > 0 && it >= tt.from && (tt.burst == 0 || it < tt.from+tt.burst):
					d = time.Duration(float64(d) * tt.slower)
				}
				return d
			})
			s.run(399)
			var on, guards []uint64
			probes := 0
			for _, st := range s.decisions() {
				switch dec := st.d.Decision; {
				case st.d.Probe:
					probes++
				case dec.SplitWithin(leaderOf(s.workers), ShareTolerance):
					on = append(on, st.it)
					if len(on) == 1 && tt.reason != "" && st.d.Reason != tt.reason {
						t.Errorf("reason %q, want %q", st.d.Reason, tt.reason)
					}
				case strings.HasPrefix(st.d.Reason, "balanced split measured"):
					guards = append(guards, st.it)
					if len(guards) == 1 && st.d.Reason != tt.guardMsg {
						t.Errorf("guard's reason %q, want %q", st.d.Reason, tt.guardMsg)
					}
				}
			}
			if !slices.Equal(on, tt.onLeader) || !slices.Equal(guards, tt.guards) || probes != tt.probes {
				t.Fatalf("on the leader from iterations %v, guards at %v, %d probes; want %v, %v, %d: %v",
					on, guards, probes, tt.onLeader, tt.guards, tt.probes, s.decisions())
			}
			for j, g := range tt.backoffs {
				if on[j+1]-guards[j] != g {
					t.Errorf("the leader again at %d after the guard at %d: want a back-off of %d", on[j+1], guards[j], g)
				}
			}
			if s.b.State() != tt.state {
				t.Errorf("state %v, want %v", s.b.State(), tt.state)
			}
		})
	}
}

// A lost leader: the retry's even split, then the next worker leads.
func TestBalancerOneHostLoseLeader(t *testing.T) {
	servers, workers := ids(2, 3)
	cfg := Config{Servers: servers, Workers: workers}
	oneHost(&cfg)
	b, err := NewBalancer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	var decs []Decision
	report := func(from, to uint64, nodes []node.ID, version uint32) {
		for it := from; it <= to; it++ {
			now = now.Add(10 * time.Millisecond)
			for _, id := range nodes {
				for _, d := range b.Observe(Sample{Node: id, Iteration: it, ModelBytes: 1 << 20, Version: version}, now) {
					if d.Decision != nil {
						decs = append(decs, *d.Decision)
					}
				}
			}
		}
	}
	b.Start()
	report(0, 20, slices.Concat(servers, workers), 0)
	if len(decs) == 0 || !slices.Equal(decs[len(decs)-1].Aggregators, []node.ID{workers[0]}) {
		t.Fatalf("not on the leader %s: %v", workers[0], decs)
	}
	d, err := b.Lose(workers[0], "test")
	if err != nil || !d.Retry || !slices.Equal(d.Decision.Aggregators, servers) {
		t.Fatalf("Lose(leader) = %v, %v", d, err)
	}
	decs = nil
	report(b.Done(), 60, slices.Concat(servers, workers[1:]), d.Decision.Version)
	if len(decs) == 0 || !slices.Equal(decs[len(decs)-1].Aggregators, []node.ID{workers[1]}) {
		t.Fatalf("not on the next leader %s: %v", workers[1], decs)
	}
}

// Short iterations on one host come to the Balancer tens to a report
// (lbagent.ReportEvery), sharing its one measurement: one slow report is
// one slow time, not a run of them, and retimes nothing; a lasting
// slowdown still does. Two workers' reports paced apart time the
// iterations as they took, from the slower worker's reports.
func TestBalancerOneHostReportedTogether(t *testing.T) {
	const perReport = 32 // 0.3 ms iterations, a report every ~10 ms
	tests := []struct {
		name      string
		from, n   uint64  // iterations [from, from+n) on the leader's split
		slower    float64 // take this many times longer (n 0: to the end)
		stagger   uint64  // the second worker reports this many iterations after the first
		retimings int     // back to the even split, to time both afresh
	}{
		{name: "steady", retimings: 0},
		{name: "one report's iterations twice as slow", from: 1600, n: perReport, slower: 2, retimings: 0},
		{name: "four reports' iterations twice as slow", from: 1600, n: 4 * perReport, slower: 2, retimings: 0},
		{name: "a lasting slowdown", from: 1600, slower: 2, retimings: 1},
		{name: "reports paced apart", stagger: perReport / 4, retimings: 0},
		{name: "reports paced apart, a lasting slowdown", from: 1600, slower: 2, stagger: perReport / 4, retimings: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s *sim
			s = newTimedSim(t, oneHost, func(it uint64) time.Duration {
				d := 300 * time.Microsecond
				if s.sched.At(it).SplitWithin(Even(0, 0, s.servers), ShareTolerance) {
					d = 600 * time.Microsecond
				} else if it >= tt.from && (tt.n == 0 || it < tt.from+tt.n) && tt.slower > 0 {
					d = time.Duration(float64(d) * tt.slower)
				}
				return d
			})
			// Each node reports every perReport-th iteration, and the
			// one that reaches the horizon granted (as lbagent's Pace).
			s.skip = func(id node.ID, it uint64) bool {
				paced := it
				if id == s.workers[1] {
					paced += tt.stagger
				}
				return (paced+1)%perReport != 0 && it < s.granted
			}
			s.run(3999)
			retimings, leader := 0, 0
			for _, st := range s.decisions() {
				switch {
				case strings.HasSuffix(st.d.Reason, "to time both afresh"):
					retimings++
				case st.d.Decision.SplitWithin(Decision{Aggregators: []node.ID{slices.Min(s.workers)}, Shares: []float64{1}}, ShareTolerance):
					leader++
					if want := "the even split over the servers took 0.6 ms"; leader == 1 && !strings.Contains(st.d.Reason, want) {
						t.Errorf("the leader's split: %q, want it to say %q", st.d.Reason, want)
					}
				}
			}
			if retimings != tt.retimings || leader != 1+tt.retimings || s.b.State() != Balanced {
				t.Fatalf("%d retimings, %d decisions on the leader, state %v; want %d, %d, Balanced: %v",
					retimings, leader, s.b.State(), tt.retimings, 1+tt.retimings, s.decisions())
			}
		})
	}
}
