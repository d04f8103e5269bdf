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
	lostWorker := node.Info{ID: node.WorkerID(1), Role: node.Worker, Host: "10.0.0.4", ControlPort: 9300}
	joinedWorker := node.Info{ID: node.WorkerID(3), Role: node.Worker, Host: "10.0.0.5", ControlPort: 9400}
	log.Warn(msgServerLeft, "node", lost, "reason", `cluster: lost node=x: "quoted"`, "membership_version", 1,
		"retry_from_iteration", uint64(20), "decision_version", uint32(4), "servers", 1)
	log.Warn(msgServerJoined, "node", joined, "membership_version", 2, "servers", 2, "share", "from iteration 31")
	log.Info("lb decision", "version", 5)
	log.Warn(msgWorkerLeft, "node", lostWorker, "reason", "no heartbeat for 10s", "membership_version", 3,
		"retry_from_iteration", uint64(40), "decision_version", uint32(6), "servers", 2, "workers", 2)
	log.Warn(msgWorkerJoined, "node", joinedWorker, "membership_version", 4, "workers", 3, "from_iteration", uint64(44))
	log.Warn("membership change: worker joined, said differently", "node", joinedWorker)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	want := []struct {
		m  Membership
		ok bool
	}{
		{Membership{Role: node.Server, Node: lost.String(), RetryFrom: 20}, true},
		{Membership{Joined: true, Role: node.Server, Node: joined.String()}, true},
		{Membership{}, false},
		{Membership{Role: node.Worker, Node: lostWorker.String(), RetryFrom: 40}, true},
		{Membership{Joined: true, Role: node.Worker, Node: joinedWorker.String(), From: 44}, true},
		{Membership{}, false},
	}
	if len(lines) != len(want) {
		t.Fatalf("%d lines for %d cases", len(lines), len(want))
	}
	for i, line := range lines {
		if m, ok := ParseMembershipLine(line); ok != want[i].ok || m != want[i].m {
			t.Errorf("%q: %+v, %v; want %+v, %v", line, m, ok, want[i].m, want[i].ok)
		}
	}
}

// The scheduler's line for a hold under FPT_ON_WORKER_LOSS=wait gives the
// last iteration granted; other lines give nothing.
func TestParseHoldLine(t *testing.T) {
	for _, tc := range []struct {
		line string
		want uint64
		ok   bool
	}{
		{`time=... level=WARN msg="` + msgHold + `" role=scheduler lost=worker2(13)@198.18.0.5:1 last_iteration=12 timeout=5m0s`, 12, true},
		{`time=... level=WARN msg="` + msgWorkerLeft + `" role=scheduler node=worker2(13)@198.18.0.5:1 retry_from_iteration=10`, 0, false},
		{`time=... level=WARN msg="` + msgHold + `" role=scheduler last_iteration=x`, 0, false},
	} {
		if got, ok := ParseHoldLine(tc.line); got != tc.want || ok != tc.ok {
			t.Errorf("ParseHoldLine(%q) = %d, %v; want %d, %v", tc.line, got, ok, tc.want, tc.ok)
		}
	}
}
