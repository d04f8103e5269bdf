package lb

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/node"
)

// hosts places workers per host (ranks in order) and one server per host.
func hosts(workers ...int) (map[node.ID]int, []node.ID) {
	m := map[node.ID]int{}
	var servers []node.ID
	r := 0
	for h, n := range workers {
		for range n {
			m[node.WorkerID(r)] = h
			r++
		}
		m[node.ServerID(h)] = h
		servers = append(servers, node.ServerID(h))
	}
	return m, servers
}

func TestHostModel(t *testing.T) {
	const M, gbit = 100e6, 125e6 // bytes; 1 Gbit/s in bytes per second
	tests := []struct {
		name    string
		workers []int
		local   bool
		load    []float64 // under the even split over the servers, in M
		bound   float64   // seconds
	}{
		{"4,4 off", []int{4, 4}, false, []float64{4, 4}, 4 * M / gbit},
		{"4,4 on: a quarter", []int{4, 4}, true, []float64{1, 1}, M / gbit},
		{"4,3,1 off: the 4-worker host sets the pace", []int{4, 3, 1}, false, []float64{4, 3 + 2.0/3, 3}, 4 * M / gbit},
		{"4,3,1 on", []int{4, 3, 1}, true, []float64{4.0 / 3, 4.0 / 3, 4.0 / 3}, 4.0 / 3 * M / gbit},
		{"one host: nothing crosses", []int{3}, false, []float64{0}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hostOf, servers := hosts(tt.workers...)
			caps := make([]float64, len(tt.workers))
			for i := range caps {
				caps[i] = gbit
			}
			in := HostInput{HostOf: hostOf, Capacity: caps, ModelBytes: M, Local: tt.local}
			load, err := HostLoad(in, Even(1, 0, servers))
			if err != nil {
				t.Fatal(err)
			}
			for h := range load {
				if math.Abs(load[h]-tt.load[h]*M) > 1 {
					t.Errorf("host %d carries %.0f bytes, want %.0f", h, load[h], tt.load[h]*M)
				}
			}
			got, err := HostBound(in)
			if err != nil {
				t.Fatal(err)
			}
			if want := time.Duration(tt.bound * float64(time.Second)); got < want-time.Microsecond || got > want+time.Microsecond {
				t.Errorf("bound %v, want %v", got, want)
			}
		})
	}
}

func TestHostModelRefuses(t *testing.T) {
	hostOf, servers := hosts(2, 2)
	for _, in := range []HostInput{
		{HostOf: hostOf, Capacity: []float64{1e9}, ModelBytes: 1},             // a node on a host not listed
		{HostOf: hostOf, Capacity: []float64{1e9, 0}, ModelBytes: 1},          // a zero capacity
		{HostOf: hostOf, Capacity: []float64{1e9, math.NaN()}, ModelBytes: 1}, // NaN
		{HostOf: hostOf, Capacity: []float64{1e9, 1e9}, ModelBytes: math.Inf(1)},
	} {
		if _, err := HostLoad(in, Even(1, 0, servers)); err == nil {
			t.Errorf("HostLoad(%+v): no error", in)
		}
		if _, err := HostBound(in); err == nil {
			t.Errorf("HostBound(%+v): no error", in)
		}
	}
	in := HostInput{HostOf: hostOf, Capacity: []float64{1e9, 1e9}, ModelBytes: 1}
	if _, err := HostLoad(in, Even(1, 0, []node.ID{node.ServerID(5)})); err == nil {
		t.Error("HostLoad with an aggregator on no host: no error")
	}
}

// TestBalancerByHost runs the Balancer through its probe with the nodes
// placed on hosts, one server per host, each node measuring its share of
// its host's link (the nodes of a host share it), and checks the split it
// settles on against the model by host, and that the model by node (the
// same measurements, hosts unknown) settles elsewhere.
func TestBalancerByHost(t *testing.T) {
	const gbit = 125e6
	type agg struct {
		id    node.ID
		share float64
	}
	tests := []struct {
		name    string
		workers []int
		links   []float64 // each host's link, in Gbit/s
		local   bool
		want    []agg
	}{
		{"4,4 local: the even split over the servers", []int{4, 4}, []float64{1, 1}, true,
			[]agg{{node.ServerID(0), 0.5}, {node.ServerID(1), 0.5}}},
		{"4,3,1 local: one sum per host, even", []int{4, 3, 1}, []float64{1, 1, 1}, true,
			[]agg{{node.ServerID(0), 1.0 / 3}, {node.ServerID(1), 1.0 / 3}, {node.ServerID(2), 1.0 / 3}}},
		{"4,3,1 local, host 2 at half a Gbit: nothing on it", []int{4, 3, 1}, []float64{1, 1, 0.5}, true,
			[]agg{{node.ServerID(0), 0.5}, {node.ServerID(1), 0.5}}},
		{"4,3,1 local, host 0 at 2 Gbit: all on it", []int{4, 3, 1}, []float64{2, 1, 1}, true,
			// Host 0 carries M·(1+S_0) at 2 Gbit, the others M·(1+S_h) at
			// 1: all on host 0 leaves each at 1 (M per Gbit), where any
			// share elsewhere raises that host above it.
			[]agg{{node.ServerID(0), 1}}},
		{"4,3,1 not local: host 0's workers set the pace whatever the split", []int{4, 3, 1}, []float64{1, 1, 1}, false,
			[]agg{{node.ServerID(0), 1.0 / 3}, {node.ServerID(1), 1.0 / 3}, {node.ServerID(2), 1.0 / 3}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hostOf, servers := hosts(tt.workers...)
			var workers []node.ID
			on := make([]int, len(tt.workers))
			for id, h := range hostOf {
				on[h]++
				if r, _ := id.Role(); r == node.Worker {
					workers = append(workers, id)
				}
			}
			slices.Sort(workers)
			rate := func(id node.ID, _ uint64) (float64, float64) {
				h := hostOf[id]
				r := tt.links[h] * gbit / float64(on[h])
				return r, r
			}
			settle := func(h *Hosts) Decision {
				s := newSim(t, Config{Servers: servers, Workers: workers, Hosts: h})
				s.rate = rate
				s.run(12)
				ds := s.decisions()
				if len(ds) < 2 || !ds[0].d.Probe {
					t.Fatalf("decisions %v", ds)
				}
				return *ds[1].d.Decision
			}
			got := settle(&Hosts{Of: hostOf, Local: tt.local})
			var want Decision
			for _, a := range tt.want {
				want.Aggregators = append(want.Aggregators, a.id)
				want.Shares = append(want.Shares, a.share)
			}
			if !got.SplitWithin(want, 1e-6) {
				t.Errorf("by host: %v %v, want %v %v", got.Aggregators, got.Shares, want.Aggregators, want.Shares)
			}
			if blind := settle(nil); blind.SplitWithin(want, 0.01) {
				t.Errorf("by node, hosts unknown: %v %v, the same as by host", blind.Aggregators, blind.Shares)
			}
		})
	}
}

// TestBalancerByHostAfterRetry: after a lost worker's retry the groups
// re-form over the workers left, so the Balancer still models one host
// sum per host.
func TestBalancerByHostAfterRetry(t *testing.T) {
	hostOf, servers := hosts(2, 2)
	workers := []node.ID{node.WorkerID(0), node.WorkerID(1), node.WorkerID(2), node.WorkerID(3)}
	b, err := NewBalancer(Config{Servers: servers, Workers: workers, Hosts: &Hosts{Of: hostOf, Local: true}})
	if err != nil {
		t.Fatal(err)
	}
	if h := b.input().Hosts; h == nil || !h.Local {
		t.Fatalf("before a loss: hosts %+v, want local", h)
	}
	if _, err := b.Lose(node.WorkerID(3), "test"); err != nil {
		t.Fatal(err)
	}
	// The workers left on each host sum again from the retry's
	// iteration (the groups re-form): each host's link still carries
	// one contribution.
	if h := b.input().Hosts; h == nil || !h.Local || len(h.Of) != len(hostOf) {
		t.Fatalf("after a worker's retry: hosts %+v, want by host, local", h)
	}
}

// TestBalancerByHostUnmeasuredMember: by host, a group's member that
// exchanged nothing with other hosts (its bytes stay on its host) leaves
// the probe good, since its host's other nodes measure the link; a host
// with no node measured still fails it.
func TestBalancerByHostUnmeasuredMember(t *testing.T) {
	hostOf, servers := hosts(2, 2)
	workers := []node.ID{node.WorkerID(0), node.WorkerID(1), node.WorkerID(2), node.WorkerID(3)}
	for _, tt := range []struct {
		name   string
		silent func(node.ID) bool
		want   string // the reason's start after the probe
	}{
		{"members silent", func(id node.ID) bool { return id == node.WorkerID(1) || id == node.WorkerID(3) }, "balanced"},
		{"a whole host silent", func(id node.ID) bool { return hostOf[id] == 1 }, "probe failed"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := newSim(t, Config{Servers: servers, Workers: workers, Hosts: &Hosts{Of: hostOf, Local: true}})
			s.rate = func(id node.ID, _ uint64) (float64, float64) {
				if tt.silent(id) {
					return 0, 0
				}
				return 1e8, 1e8
			}
			s.run(12)
			ds := s.decisions()
			if len(ds) < 2 || !strings.HasPrefix(ds[1].d.Reason, tt.want) {
				t.Fatalf("decisions %v, want the second's reason to start %q", ds, tt.want)
			}
		})
	}
}

// TestBalancerPlaceOnHost: a joining worker placed on its host adds its
// capacity to that host's link and sums in its group (one sum per host),
// or, without shared memory, beside it; unplaced, it is a host of its
// own.
func TestBalancerPlaceOnHost(t *testing.T) {
	hostOf, servers := hosts(1, 1)
	workers := []node.ID{node.WorkerID(0), node.WorkerID(1)}
	joiner := node.WorkerID(2)
	for _, tt := range []struct {
		name          string
		place, alone  bool
		capacity, per []float64 // by host: capacity, contributions
	}{
		{"unplaced", false, false, []float64{2, 2, 1}, []float64{1, 1, 1}}, // host 0, host 1, the joiner alone
		{"in its host's group", true, false, []float64{2, 3}, []float64{1, 1}},
		{"no shared memory", true, true, []float64{2, 3}, []float64{1, 2}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b, err := NewBalancer(Config{Servers: servers, Workers: workers, Hosts: &Hosts{Of: hostOf, Local: true}})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := b.JoinWorker(joiner, time.Time{}); err != nil {
				t.Fatal(err)
			}
			if tt.place {
				b.PlaceOnHost(joiner, 1, tt.alone)
			}
			in := b.input()
			for _, id := range slices.Concat(servers, b.Workers()) {
				in.Capacity[id] = 1
			}
			hi, err := in.hostInput()
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(hi.Capacity, tt.capacity) {
				t.Errorf("host capacities %v, want %v", hi.Capacity, tt.capacity)
			}
			c, err := hi.perHost()
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(c, tt.per) {
				t.Errorf("contributions per host %v, want %v", c, tt.per)
			}
		})
	}
	if _, ok := hostOf[joiner]; ok || len(hostOf) != 4 {
		t.Errorf("the caller's map changed: %v", hostOf)
	}
}
