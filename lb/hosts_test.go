package lb

import (
	"math"
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
