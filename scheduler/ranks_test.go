package scheduler

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/fptps/fpt/node"
)

func worker(host string, port int, id node.ID) node.Info {
	return node.Info{ID: id, Role: node.Worker, Host: host, ControlPort: port, DataPort: port + 1}
}

func server(host string, port int, id node.ID) node.Info {
	return node.Info{ID: id, Role: node.Server, Host: host, ControlPort: port, DataPort: port + 1}
}

// Registrations in order, each checked, then assigned: the ranks asked
// for are kept, the rest fill the gaps in (host, port) order.
func TestRanks(t *testing.T) {
	w, s := node.WorkerID, node.ServerID
	tests := []struct {
		name    string
		servers int
		workers int
		in      []node.Info
		want    map[string]node.ID // host:port -> id
		wantErr string             // from the registration that fails
	}{
		{"none pinned: (host, port) order", 1, 3,
			[]node.Info{worker("b", 1, 0), worker("a", 2, 0), worker("a", 1, 0), server("z", 1, 0)},
			map[string]node.ID{"a:1": w(0), "a:2": w(1), "b:1": w(2), "z:1": s(0)}, ""},
		{"all pinned, reverse of address order", 2, 2,
			[]node.Info{worker("a", 1, w(1)), worker("b", 1, w(0)), server("a", 5, s(1)), server("b", 5, s(0))},
			map[string]node.ID{"a:1": w(1), "b:1": w(0), "a:5": s(1), "b:5": s(0)}, ""},
		{"some pinned: the rest fill the gaps", 1, 4,
			[]node.Info{worker("a", 1, 0), worker("b", 1, w(0)), worker("c", 1, 0), worker("d", 1, w(2)), server("s", 1, 0)},
			map[string]node.ID{"b:1": w(0), "a:1": w(1), "d:1": w(2), "c:1": w(3), "s:1": s(0)}, ""},
		{"duplicate", 1, 2,
			[]node.Info{worker("a", 1, w(1)), worker("b", 1, w(1))},
			nil, "worker rank 1 asked for twice: by worker1(11)@a:1 and by worker1(11)@b:1"},
		{"out of range", 1, 2,
			[]node.Info{worker("a", 1, w(2))},
			nil, "worker rank 2, out of range: the scheduler's cluster has 2 workers (ranks 0 to 1)"},
		{"server asking for a worker's id", 1, 1,
			[]node.Info{server("a", 1, w(0))},
			nil, "which is not a server's"},
		{"id naming no node", 1, 1,
			[]node.Info{worker("a", 1, 3)},
			nil, "asks for id 3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := registry{servers: tt.servers, workers: tt.workers}
			for i, info := range tt.in {
				err := r.add(info, info.DataAddr())
				if err == nil {
					continue
				}
				var re *rankError
				if tt.wantErr == "" || i != len(tt.in)-1 || !errors.As(err, &re) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("registration %d (%s): %v; want a rank error containing %q from the last one", i, info, err, tt.wantErr)
				}
				return
			}
			if tt.wantErr != "" {
				t.Fatalf("no error; want %q", tt.wantErr)
			}
			if !r.complete() {
				t.Fatal("not complete")
			}
			table := r.assign(node.Info{Host: "sched", ControlPort: 9})
			if table[0].ID != node.SchedulerID || len(table) != len(tt.want)+1 {
				t.Fatalf("table %v", table)
			}
			for i, info := range table[1:] {
				key := fmt.Sprintf("%s:%d", info.Host, info.ControlPort)
				if info.ID != tt.want[key] {
					t.Errorf("%s got id %d, want %d", key, info.ID, tt.want[key])
				}
				// Servers first, then workers, each in rank order.
				if i > 0 && (table[i].Role > info.Role || table[i].Role == info.Role && table[i].ID > info.ID) {
					t.Errorf("table out of order: %v", table)
				}
			}
		})
	}
}
