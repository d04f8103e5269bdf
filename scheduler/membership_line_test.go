package scheduler

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/fptps/fpt/node"
)

// ParseMembershipLine reads back what the scheduler's logger writes for a
// membership change, and nothing else.
func TestParseMembershipLine(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil)).With("role", "scheduler")
	lost := node.Info{ID: node.ServerID(1), Role: node.Server, Host: "10.0.0.2", ControlPort: 9100}
	joined := node.Info{ID: node.ServerID(2), Role: node.Server, Host: "10.0.0.3", ControlPort: 9200}
	log.Warn(msgServerLeft, "node", lost, "reason", `cluster: lost node=x: "quoted"`, "membership_version", 1,
		"retry_from_iteration", uint64(20), "decision_version", uint32(4), "servers", 1)
	log.Warn(msgServerJoined, "node", joined, "membership_version", 2, "servers", 2, "share", "from iteration 31")
	log.Info("lb decision", "version", 5)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	want := []struct {
		m  Membership
		ok bool
	}{
		{Membership{Node: lost.String(), RetryFrom: 20}, true},
		{Membership{Joined: true, Node: joined.String()}, true},
		{Membership{}, false},
	}
	for i, line := range lines {
		if m, ok := ParseMembershipLine(line); ok != want[i].ok || m != want[i].m {
			t.Errorf("%q: %+v, %v; want %+v, %v", line, m, ok, want[i].m, want[i].ok)
		}
	}
}
