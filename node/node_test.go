package node

import "testing"

func TestIDScheme(t *testing.T) {
	tests := []struct {
		id     ID
		role   Role
		ok     bool
		rank   int
		groups Group
		name   string
	}{
		{SchedulerID, Scheduler, true, 0, SchedulerGroup, "scheduler(1)"},
		{ServerID(0), Server, true, 0, ServerGroup, "server0(8)"},
		{ServerID(3), Server, true, 3, ServerGroup, "server3(14)"},
		{WorkerID(0), Worker, true, 0, WorkerGroup, "worker0(9)"},
		{WorkerID(5), Worker, true, 5, WorkerGroup, "worker5(19)"},
		{0, 0, false, 0, 0, "node(0)"},
		{4, 0, false, 0, 0, "node(4)"},
		{7, 0, false, 0, 0, "node(7)"},
	}
	for _, tt := range tests {
		r, ok := tt.id.Role()
		if r != tt.role || ok != tt.ok {
			t.Errorf("%d.Role() = %v, %v; want %v, %v", tt.id, r, ok, tt.role, tt.ok)
		}
		if ok && tt.id.Rank() != tt.rank {
			t.Errorf("%d.Rank() = %d; want %d", tt.id, tt.id.Rank(), tt.rank)
		}
		for _, g := range []Group{SchedulerGroup, ServerGroup, WorkerGroup} {
			if got, want := tt.id.InGroup(g), tt.groups&g != 0; got != want {
				t.Errorf("%d.InGroup(%d) = %v; want %v", tt.id, g, got, want)
			}
		}
		if ok && !tt.id.InGroup(AllGroup) {
			t.Errorf("%d not in AllGroup", tt.id)
		}
		if got := tt.id.String(); got != tt.name {
			t.Errorf("%d.String() = %q; want %q", tt.id, got, tt.name)
		}
	}
}

func TestParseRole(t *testing.T) {
	for _, r := range []Role{Scheduler, Server, Worker} {
		got, err := ParseRole(r.String())
		if err != nil || got != r {
			t.Errorf("ParseRole(%q) = %v, %v", r.String(), got, err)
		}
	}
	if _, err := ParseRole("Worker"); err == nil {
		t.Error("ParseRole accepted a misspelt role")
	}
}

func TestInfoEndpoints(t *testing.T) {
	n := Info{ID: ServerID(1), Role: Server, Host: "::1", ControlPort: 9000, DataPort: 9001}
	if got := n.ControlEndpoint(); got != "tcp://[::1]:9000" {
		t.Errorf("ControlEndpoint = %q", got)
	}
	if got := n.DataAddr(); got != "[::1]:9001" {
		t.Errorf("DataAddr = %q", got)
	}
}
