package bench

import (
	"reflect"
	"testing"
)

func TestHostsScenarioParts(t *testing.T) {
	for _, bad := range []string{"", "4", "4,0", "4,x", "4,17"} {
		if _, err := parseHostsWorkers(bad); err == nil {
			t.Errorf("--hosts-workers %q taken", bad)
		}
	}
	ws, err := parseHostsWorkers("4, 3,1")
	if err != nil || !reflect.DeepEqual(ws, []int{4, 3, 1}) {
		t.Fatalf("parseHostsWorkers = %v, %v", ws, err)
	}
	place := hostsPlacement(ws)
	want := map[string]int{"scheduler": 0, "server0": 0, "server1": 1, "server2": 2,
		"worker0": 0, "worker1": 0, "worker2": 0, "worker3": 0, "worker4": 1, "worker5": 1, "worker6": 1, "worker7": 2}
	if !reflect.DeepEqual(place, want) {
		t.Errorf("placement %v, want %v", place, want)
	}
	// 1 Gbit/s links, a 100 MB model: without local aggregation the
	// 4-worker host carries 4 M each way, with it 4/3 M.
	for _, tc := range []struct {
		local bool
		bytes []int64
	}{
		{false, []int64{800_000_000, 733_333_333, 600_000_000}},
		{true, []int64{266_666_666, 266_666_666, 266_666_666}},
	} {
		_, got, err := hostsModel(ws, 125e6, 100_000_000, tc.local)
		if err != nil {
			t.Fatal(err)
		}
		for h := range got {
			if d := got[h] - tc.bytes[h]; d < -1 || d > 1 {
				t.Errorf("local %v: host %d carries %d bytes both ways, want %d", tc.local, h, got[h], tc.bytes[h])
			}
		}
	}
}
