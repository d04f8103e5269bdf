package control

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/fptps/fpt/node"
)

// sampleMessages has one realistic message per command, plus edge cases.
func sampleMessages() map[string]*Message {
	table := []node.Info{
		{ID: node.SchedulerID, Role: node.Scheduler, Host: "10.0.0.1", ControlPort: 9000, DataPort: 9001},
		{ID: node.ServerID(0), Role: node.Server, Host: "10.0.0.2", ControlPort: 9100, DataPort: 9101},
		{ID: node.WorkerID(0), Role: node.Worker, Host: "worker-0.example", ControlPort: 65535, DataPort: 0},
		{ID: node.WorkerID(1), Role: node.Worker, Host: "::1", ControlPort: 1, DataPort: 2},
	}
	return map[string]*Message{
		"AddNode":      {Command: AddNode, Nodes: []node.Info{{Role: node.Worker, Host: "198.18.0.7", ControlPort: 9200, DataPort: 9201}}},
		"NodeTable":    {Command: NodeTable, Sender: node.SchedulerID, Recipient: node.WorkerID(1), Nodes: table},
		"Barrier":      {Command: Barrier, Sender: node.ServerID(3), Group: node.AllGroup, Seq: 42},
		"BarrierFinal": {Command: Barrier, Flags: FlagFinal, Sender: node.WorkerID(0), Group: node.AllGroup, Seq: 1<<64 - 1},
		"BarrierDone":  {Command: BarrierDone, Sender: node.SchedulerID, Recipient: node.WorkerID(7), Group: node.WorkerGroup | node.ServerGroup, Seq: 7},
		"Heartbeat":    {Command: Heartbeat, Sender: node.WorkerID(2)},
		"HeartbeatAck": {Command: HeartbeatAck, Sender: node.SchedulerID, Recipient: node.WorkerID(2)},
		"NodeFailed":   {Command: NodeFailed, Sender: node.SchedulerID, Target: node.ServerID(1), Text: "server1(10) lost: connection reset by peer"},
		"NodeJoined":   {Command: NodeJoined, Sender: node.SchedulerID, Nodes: []node.Info{{Role: node.Server, ID: node.ServerID(2), Host: "10.0.0.3", ControlPort: 9100}}},
		"Joined":       {Command: Joined, Sender: node.ServerID(2), Seq: 1},
		"Layout":       {Command: Layout, Sender: node.SchedulerID, Body: []byte{1, 0, 0, 0, 1, 0, 0, 0, 8, 0, 0, 0}},
		"Leave":        {Command: Leave, Sender: 12, Seq: 1},
		"App":          {Command: App, Sender: 1, Target: 9, Seq: 3, Body: []byte("app message")},
		"NodeLeft":     {Command: NodeLeft, Sender: node.SchedulerID, Target: node.ServerID(1), Text: "lost: connection reset by peer"},
		"Terminate":    {Command: Terminate, Sender: node.SchedulerID, Recipient: 0xFFFFFFFF},
		"Report":       {Command: Report, Sender: node.WorkerID(0), Seq: 1000, Body: []byte{1, 2, 3, 0, 255}},
		"Decision":     {Command: Decision, Sender: node.SchedulerID, Seq: 3, Body: bytes.Repeat([]byte{0xAB}, 70000), Text: "v3 @ iter 120"},
		"Unicode":      {Command: NodeFailed, Text: "nœud ☠ \x00 perdu", Nodes: []node.Info{{Role: node.Server, Host: ""}}},
		"AllFlags":     {Command: Heartbeat, Flags: 0xFF, Group: 0xFF},
	}
}

func mustMarshal(tb testing.TB, m *Message) []byte {
	tb.Helper()
	b, err := m.MarshalBinary()
	if err != nil {
		tb.Fatalf("MarshalBinary(%+v): %v", m, err)
	}
	return b
}

func TestRoundTrip(t *testing.T) {
	seen := make(map[Command]bool)
	for name, m := range sampleMessages() {
		t.Run(name, func(t *testing.T) {
			b := mustMarshal(t, m)
			got, err := Unmarshal(b)
			if err != nil {
				t.Fatalf("Unmarshal: %v", err)
			}
			if !reflect.DeepEqual(got, m) {
				t.Fatalf("round trip changed the message:\n got %+v\nwant %+v", got, m)
			}
			if again := mustMarshal(t, got); !bytes.Equal(again, b) {
				t.Fatal("re-encoding differs")
			}
			// AppendBinary appends and leaves the prefix alone.
			prefix := []byte("xyz")
			ab, err := m.AppendBinary(prefix)
			if err != nil || !bytes.Equal(ab[:3], prefix) || !bytes.Equal(ab[3:], b) {
				t.Fatalf("AppendBinary = %x, %v", ab, err)
			}
		})
		seen[m.Command] = true
	}
	for c := AddNode; c <= lastCommand; c++ {
		if !seen[c] {
			t.Errorf("no sample for %v", c)
		}
	}
}

func TestUnmarshalDoesNotAlias(t *testing.T) {
	b := mustMarshal(t, &Message{Command: Report, Body: []byte{1, 2, 3}})
	m, err := Unmarshal(b)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-1] = 99
	if m.Body[2] != 3 {
		t.Fatal("Body aliases the input buffer")
	}
}

func TestLimitsAccepted(t *testing.T) {
	host := strings.Repeat("h", MaxHostLen)
	many := make([]node.Info, MaxNodes)
	for i := range many {
		many[i] = node.Info{ID: node.ID(i), Role: node.Worker, Host: "a"}
	}
	for name, m := range map[string]*Message{
		"host":  {Command: AddNode, Nodes: []node.Info{{Role: node.Worker, Host: host, ControlPort: 65535, DataPort: 65535}}},
		"text":  {Command: NodeFailed, Text: strings.Repeat("t", MaxTextLen)},
		"body":  {Command: Decision, Body: make([]byte, MaxBodyLen)},
		"nodes": {Command: NodeTable, Nodes: many},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := Unmarshal(mustMarshal(t, m))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, m) {
				t.Fatal("round trip changed the message")
			}
		})
	}
}

func TestMarshalRejects(t *testing.T) {
	big := make([]node.Info, MaxNodes)
	for i := range big {
		big[i] = node.Info{Role: node.Worker, Host: strings.Repeat("h", MaxHostLen)}
	}
	for _, tc := range []struct {
		name string
		m    *Message
		want string
	}{
		{"zero command", &Message{}, "unknown command 0"},
		{"unknown command", &Message{Command: lastCommand + 1}, "unknown command"},
		{"long host", &Message{Command: AddNode, Nodes: []node.Info{{Role: node.Worker, Host: strings.Repeat("h", MaxHostLen+1)}}}, "host of 256 bytes"},
		{"no role", &Message{Command: AddNode, Nodes: []node.Info{{Host: "a"}}}, "invalid role 0"},
		{"port high", &Message{Command: AddNode, Nodes: []node.Info{{Role: node.Server, ControlPort: 65536}}}, "control port 65536"},
		{"port negative", &Message{Command: AddNode, Nodes: []node.Info{{Role: node.Server, DataPort: -1}}}, "data port -1"},
		{"long text", &Message{Command: NodeFailed, Text: strings.Repeat("t", MaxTextLen+1)}, "text of"},
		{"long body", &Message{Command: Report, Body: make([]byte, MaxBodyLen+1)}, "body of"},
		{"many nodes", &Message{Command: NodeTable, Nodes: make([]node.Info, MaxNodes+1)}, "65537 nodes"},
		{"too big", &Message{Command: NodeTable, Nodes: big, Body: make([]byte, MaxBodyLen)}, "message of"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := []byte{7}
			b, err := tc.m.AppendBinary(prefix)
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.HasPrefix(err.Error(), "control: encode: ") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want it to mention %q", err, tc.want)
			}
			if !bytes.Equal(b, prefix) {
				t.Fatal("failed AppendBinary changed the buffer")
			}
		})
	}
}

// rawHeader builds a header by hand, for inputs Marshal would never produce.
func rawHeader(cmd Command, nodes uint32) []byte {
	b := []byte{wireV1, byte(cmd), 0, 0}
	b = append(b, make([]byte, 20)...)
	return binary.LittleEndian.AppendUint32(b, nodes)
}

func le32(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func TestUnmarshalRejects(t *testing.T) {
	valid := mustMarshal(t, sampleMessages()["NodeTable"])
	empty := le32(0)
	node1 := func(role byte, hostLen byte, host string) []byte {
		return cat(le32(9), []byte{role, 1, 0, 2, 0, hostLen}, []byte(host))
	}
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"nil", nil, "shorter than"},
		{"short", valid[:headerLen-1], "shorter than"},
		{"bad format", append([]byte{0xF2}, valid[1:]...), "unknown format byte 0xf2"},
		{"protobuf", cat([]byte{0x08, 0x01}, valid[2:]), "unknown format byte"},
		{"command 0", cat(rawHeader(0, 0), empty, empty), "unknown command 0"},
		{"the command after the last", cat(rawHeader(lastCommand+1, 0), empty, empty), fmt.Sprintf("unknown command %d", lastCommand+1)},
		{"command 255", cat(rawHeader(255, 0), empty, empty), "unknown command 255"},
		{"too many nodes", cat(rawHeader(NodeTable, MaxNodes+1), empty, empty), "65537 nodes"},
		{"huge node count", cat(rawHeader(NodeTable, 0xFFFFFFFF), empty, empty), "nodes, limit"},
		{"nodes beyond input", cat(rawHeader(NodeTable, 1000), empty, empty), "cannot fit"},
		{"bad role", cat(rawHeader(NodeTable, 1), node1(0, 0, ""), empty, empty), "invalid role 0"},
		{"role 4", cat(rawHeader(NodeTable, 1), node1(4, 0, ""), empty, empty), "invalid role 4"},
		{"host beyond input", cat(rawHeader(NodeTable, 1), node1(2, 200, "abc"), empty, empty), "node 0 host"},
		{"missing text length", cat(rawHeader(Heartbeat, 0)), "text length"},
		{"text too long", cat(rawHeader(NodeFailed, 0), le32(MaxTextLen+1)), "text of 65537 bytes"},
		{"text truncated", cat(rawHeader(NodeFailed, 0), le32(10), []byte("abc")), "text: need 10 bytes"},
		{"missing body length", cat(rawHeader(Heartbeat, 0), empty), "body length"},
		{"body too long", cat(rawHeader(Report, 0), empty, le32(MaxBodyLen+1)), "body of"},
		{"body length huge", cat(rawHeader(Report, 0), empty, le32(0xFFFFFFFF)), "body of"},
		{"body truncated", cat(rawHeader(Report, 0), empty, le32(5), []byte{1}), "body: need 5"},
		{"trailing", append(append([]byte(nil), valid...), 0), "1 trailing bytes"},
		{"over 32 MiB", make([]byte, MaxMessageLen+1), "limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Unmarshal(tc.b)
			if err == nil {
				t.Fatalf("accepted: %+v", m)
			}
			if m != nil {
				t.Error("non-nil message with an error")
			}
			if !errors.Is(err, ErrMalformed) {
				t.Errorf("error %v does not match ErrMalformed", err)
			}
			if !strings.HasPrefix(err.Error(), "control: decode: ") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want it to mention %q", err, tc.want)
			}
		})
	}
}

func TestUnmarshalBinaryLeavesMessageOnError(t *testing.T) {
	m := &Message{Command: Heartbeat, Sender: 9}
	if err := m.UnmarshalBinary([]byte{wireV1}); err == nil {
		t.Fatal("accepted")
	}
	if m.Command != Heartbeat || m.Sender != 9 {
		t.Fatal("message changed by a failed decode")
	}
}

// Every truncation of a valid message must be rejected, not crash.
func TestUnmarshalTruncations(t *testing.T) {
	for name, m := range sampleMessages() {
		b := mustMarshal(t, m)
		for n := range len(b) {
			if _, err := Unmarshal(b[:n]); err == nil {
				t.Fatalf("%s: prefix of %d/%d bytes accepted", name, n, len(b))
			}
		}
	}
}

func FuzzUnmarshal(f *testing.F) {
	for _, m := range sampleMessages() {
		if len(m.Body) < 1024 {
			f.Add(mustMarshal(f, m))
		}
	}
	f.Add([]byte{})
	f.Add([]byte{wireV1})
	f.Add(cat(rawHeader(NodeTable, 1), []byte{9, 0, 0, 0, 3, 1, 0, 2, 0, 1, 'h'}, le32(0), le32(0)))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Unmarshal(b)
		if err != nil {
			if m != nil || !errors.Is(err, ErrMalformed) {
				t.Fatalf("bad error result: %v, %v", m, err)
			}
			return
		}
		again, err := m.MarshalBinary()
		if err != nil {
			t.Fatalf("decoded message does not re-encode: %v", err)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs:\n in %x\nout %x", b, again)
		}
	})
}
