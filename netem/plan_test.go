package netem

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestParseHostSpec(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    HostSpec
		wantErr string
	}{
		{in: "200mbit", want: HostSpec{Up: "200mbit", Down: "200mbit"}},
		{in: " 1GBit ", want: HostSpec{Up: "1gbit", Down: "1gbit"}},
		{in: "100mbit/1gbit", want: HostSpec{Up: "100mbit", Down: "1gbit"}},
		{in: "0", want: HostSpec{}},
		{in: "none", want: HostSpec{}},
		{in: "none/50mbit", want: HostSpec{Up: "", Down: "50mbit"}},
		{in: "50mbit/0", want: HostSpec{Up: "50mbit", Down: ""}},
		{in: "1.5gbit", want: HostSpec{Up: "1.5gbit", Down: "1.5gbit"}},
		{in: "", wantErr: "empty rate"},
		{in: "100mbit/", wantErr: "empty rate"},
		{in: "fast", wantErr: "not a number with a unit"},
		{in: "100furlongs", wantErr: "unknown unit"},
		{in: "0mbit", wantErr: "must be positive"},
		{in: "-5mbit", wantErr: "not a number"},
		{in: "200bit", wantErr: "below"},
		{in: "5tbit", wantErr: "above"},
		{in: "1.2.3mbit", wantErr: "not a number"},
		{in: "1mbit/2mbit/3mbit", wantErr: "unknown unit"},
	} {
		got, err := ParseHostSpec(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseHostSpec(%q) = %v, %v; want an error containing %q", tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseHostSpec(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
		// String reads back as the same spec.
		if again, err := ParseHostSpec(got.String()); err != nil || again != got {
			t.Errorf("ParseHostSpec(%q.String() = %q) = %+v, %v", tc.in, got.String(), again, err)
		}
	}
}

func TestParseRate(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want uint64
	}{
		{"200mbit", 200e6},
		{"1gbit", 1e9},
		{"8000", 8000},
		{"10kbit", 10e3},
		{"1mibit", 1 << 20},
		{"100mbps", 800e6},
		{"2.5gbit", 2.5e9},
	} {
		if got, err := parseRate(tc.in); err != nil || got != tc.want {
			t.Errorf("parseRate(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}

func TestTbfArgs(t *testing.T) {
	for _, tc := range []struct {
		bits  uint64
		burst string
	}{
		{1e9, "1250000"},  // 10 ms of 1 Gbit/s
		{200e6, "250000"}, // 10 ms of 200 Mbit/s
		{10e6, "32768"},   // 10 ms would be 12.5 kB: the floor
		{8000, "32768"},
	} {
		got := tbfArgs(tc.bits)
		want := []string{"tbf", "rate", fmt.Sprintf("%dbit", tc.bits), "burst", tc.burst, "latency", "50ms"}
		if !slices.Equal(got, want) {
			t.Errorf("tbfArgs(%d) = %q, want %q", tc.bits, got, want)
		}
	}
}

func TestNames(t *testing.T) {
	n := namesFor(4194304, 2)
	for _, tc := range []struct{ got, want string }{
		{n.bridge(), "fpt4194304cb"},
		{n.namespace(0), "fpt4194304ch0"},
		{n.veth(253), "fpt4194304cv253"},
	} {
		if tc.got != tc.want {
			t.Errorf("name %q, want %q", tc.got, tc.want)
		}
		if pid, ok := ownerPid(tc.got); !ok || pid != 4194304 {
			t.Errorf("ownerPid(%q) = %d, %v", tc.got, pid, ok)
		}
	}
	if len(n.veth(MaxHosts-1)) > ifNameMax {
		t.Errorf("%s is longer than IFNAMSIZ allows", n.veth(MaxHosts-1))
	}
}

func TestOwnerPid(t *testing.T) {
	for _, tc := range []struct {
		name string
		pid  int
		ok   bool
	}{
		{"fpt123ah0", 123, true},
		{"fpt123zv17", 123, true},
		{"fpt9ab", 9, true},
		{"fpt123", 0, false},
		{"fpt123ax0", 0, false},
		{"fptab", 0, false},
		{"eth0", 0, false},
		{"xfpt123ah0", 0, false},
		{"fpt123ah0x", 0, false},
		{"fpt0ah0", 0, false},
	} {
		if pid, ok := ownerPid(tc.name); pid != tc.pid || ok != tc.ok {
			t.Errorf("ownerPid(%q) = %d, %v; want %d, %v", tc.name, pid, ok, tc.pid, tc.ok)
		}
	}
}

func TestSetupPlan(t *testing.T) {
	n := namesFor(42, 0)
	plan, err := setupPlan(n, []HostSpec{{Up: "1gbit", Down: "200mbit"}, {}})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range plan {
		if s.what == "" {
			t.Errorf("step %q has no description", s.args)
		}
		got = append(got, strings.Join(s.args, " "))
	}
	want := []string{
		"ip link add fpt42ab type bridge",
		"ip link set fpt42ab up",
		"ip netns add fpt42ah0",
		"ip link add fpt42av0 type veth peer name eth0 netns fpt42ah0",
		"ip link set fpt42av0 master fpt42ab",
		"ip link set fpt42av0 up",
		"ip -n fpt42ah0 addr add 198.18.0.1/15 dev eth0",
		"ip -n fpt42ah0 link set eth0 up",
		"ip -n fpt42ah0 link set lo up",
		"tc -n fpt42ah0 qdisc add dev eth0 root tbf rate 1000000000bit burst 1250000 latency 50ms",
		"tc qdisc add dev fpt42av0 root tbf rate 200000000bit burst 250000 latency 50ms",
		"ip netns add fpt42ah1",
		"ip link add fpt42av1 type veth peer name eth0 netns fpt42ah1",
		"ip link set fpt42av1 master fpt42ab",
		"ip link set fpt42av1 up",
		"ip -n fpt42ah1 addr add 198.18.0.2/15 dev eth0",
		"ip -n fpt42ah1 link set eth0 up",
		"ip -n fpt42ah1 link set lo up",
	}
	if !slices.Equal(got, want) {
		t.Errorf("setup plan:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestSetupPlanRejects(t *testing.T) {
	for _, tc := range []struct {
		name    string
		pid     int
		hosts   []HostSpec
		wantErr string
	}{
		{"no hosts", 1, nil, "0 hosts"},
		{"too many hosts", 1, make([]HostSpec, MaxHosts+1), "255 hosts"},
		{"bad upload", 1, []HostSpec{{}, {Up: "fast"}}, "host 1: upload"},
		{"bad download", 1, []HostSpec{{Down: "0mbit"}}, "host 0: download"},
		{"name too long", 123456789, make([]HostSpec, 100), "longer than 15"},
	} {
		if _, err := setupPlan(namesFor(tc.pid, 0), tc.hosts); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.wantErr)
		}
	}
}

func TestTeardownPlan(t *testing.T) {
	var got []string
	for _, s := range teardownPlan(namesFor(7, 1), 2) {
		got = append(got, strings.Join(s.args, " "))
	}
	want := []string{
		"ip netns del fpt7bh0", "ip netns del fpt7bh1",
		"ip link del fpt7bv0", "ip link del fpt7bv1",
		"ip link del fpt7bb",
	}
	if !slices.Equal(got, want) {
		t.Errorf("teardown plan %q, want %q", got, want)
	}
}

func TestParseLists(t *testing.T) {
	for _, tc := range []struct {
		name string
		got  []string
		want []string
	}{
		{"netns", parseNetnsList("fpt12ah1 (id: 3)\nfpt12ah0\n\nother (id: 0)\n"), []string{"fpt12ah1", "fpt12ah0", "other"}},
		{"netns empty", parseNetnsList(""), nil},
		{"links", parseLinkList("1: lo: <LOOPBACK,UP> mtu 65536\n7: fpt12av0@if6: <BROADCAST> mtu 1500 master fpt12ab\n8: fpt12ab: <BROADCAST> mtu 1500\n"),
			[]string{"lo", "fpt12av0", "fpt12ab"}},
	} {
		if !slices.Equal(tc.got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, tc.got, tc.want)
		}
	}
	if got := parsePids("12\n345\n\n"); !slices.Equal(got, []int{12, 345}) {
		t.Errorf("parsePids: %v", got)
	}
}

func TestLeftovers(t *testing.T) {
	alive := func(pid int) bool { return pid == 100 }
	got := leftovers([]string{"fpt100ah0", "fpt200ah0", "fpt200ab", "eth0", "fpt300zv3", "fptx"}, alive)
	if want := []string{"fpt200ah0", "fpt200ab", "fpt300zv3"}; !slices.Equal(got, want) {
		t.Errorf("leftovers %q, want %q", got, want)
	}
}

// fakeIP records commands and answers them from a script, standing in for
// ip and tc so that the executor's error paths run without root.
type fakeIP struct {
	ran  []string
	fail map[string]string // command line prefix -> stderr
	out  map[string]string // command line -> stdout
}

func (f *fakeIP) run(_ context.Context, args []string, _ string) (string, error) {
	line := strings.Join(args, " ")
	f.ran = append(f.ran, line)
	for prefix, stderr := range f.fail {
		if strings.HasPrefix(line, prefix) {
			return "", &cmdError{args: args, err: errors.New("exit status 2"), stderr: stderr}
		}
	}
	return f.out[line], nil
}

func (f *fakeIP) ranAll(t *testing.T, lines ...string) {
	t.Helper()
	for _, l := range lines {
		if !slices.Contains(f.ran, l) {
			t.Errorf("did not run %q; ran:\n%s", l, strings.Join(f.ran, "\n"))
		}
	}
}

func TestCreateSkipsTakenSlot(t *testing.T) {
	f := &fakeIP{fail: map[string]string{"ip link add fpt5ab type bridge": "RTNETLINK answers: File exists"}}
	n, err := create(context.Background(), f.run, 5, func(int) bool { return true }, []HostSpec{{}})
	if err != nil {
		t.Fatal(err)
	}
	if got := n.Namespace(0); got != "fpt5bh0" {
		t.Errorf("namespace %s, want fpt5bh0 (slot a is taken)", got)
	}
	// The taken slot's bridge belongs to someone else: never deleted.
	for _, l := range f.ran {
		if l == "ip link del fpt5ab" {
			t.Error("deleted the bridge of a slot it did not claim")
		}
	}
}

func TestCreateFailureTearsDown(t *testing.T) {
	f := &fakeIP{fail: map[string]string{
		"tc qdisc add dev fpt5av1": "Error: Specified qdisc kind is unknown.",
		"ip netns del fpt5ah2":     `Cannot remove namespace file "/run/netns/fpt5ah2": No such file or directory`,
		"ip link del fpt5av2":      `Cannot find device "fpt5av2"`,
	}}
	_, err := create(context.Background(), f.run, 5, func(int) bool { return true }, []HostSpec{{}, {Down: "1gbit"}, {}})
	if err == nil {
		t.Fatal("create succeeded")
	}
	for _, want := range []string{"shape download of fpt5ah1", "tc qdisc add dev fpt5av1 root tbf", "Specified qdisc kind is unknown"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	// Objects that were never made are missing at teardown: not an error.
	if strings.Contains(err.Error(), "tearing down") {
		t.Errorf("teardown of missing objects reported: %v", err)
	}
	f.ranAll(t, "ip netns del fpt5ah0", "ip netns del fpt5ah1", "ip link del fpt5av0", "ip link del fpt5ab")
	for _, l := range f.ran {
		if strings.HasPrefix(l, "ip netns add fpt5ah2") {
			t.Error("went on after the failure")
		}
	}
}

func TestSweepRemovesDeadProcessesLeftovers(t *testing.T) {
	f := &fakeIP{out: map[string]string{
		"ip netns list":          "fpt11ah0 (id: 1)\nfpt22ah0 (id: 2)\nmine\n",
		"ip -o link show":        "1: lo: <LOOPBACK>\n5: fpt11av0@if4: <BROADCAST>\n6: fpt11ab: <BROADCAST>\n7: fpt22ab: <BROADCAST>\n",
		"ip netns pids fpt11ah0": "",
	}}
	alive := func(pid int) bool { return pid == 22 }
	if err := sweep(context.Background(), f.run, alive); err != nil {
		t.Fatal(err)
	}
	f.ranAll(t, "ip netns pids fpt11ah0", "ip netns del fpt11ah0", "ip link del fpt11av0", "ip link del fpt11ab")
	for _, l := range f.ran {
		if strings.Contains(l, "fpt22") || strings.Contains(l, "mine") {
			t.Errorf("touched a live process's or a foreign object: %q", l)
		}
	}
}

func TestCloseOnce(t *testing.T) {
	f := &fakeIP{fail: map[string]string{"ip link del fpt5ab": "RTNETLINK answers: Operation not permitted"}}
	n, err := create(context.Background(), f.run, 5, func(int) bool { return true }, []HostSpec{{}})
	if err != nil {
		t.Fatal(err)
	}
	f.ran = nil
	err1, err2 := n.Close(), n.Close()
	if err1 == nil || !strings.Contains(err1.Error(), "delete bridge fpt5ab") || err2 != err1 {
		t.Errorf("Close = %v then %v; want the bridge's failure twice", err1, err2)
	}
	if got := len(teardownPlan(n.names, 1)) + 1; len(f.ran) != got {
		t.Errorf("second Close ran commands again: %q", f.ran)
	}
}

func TestZombie(t *testing.T) {
	for _, tc := range []struct {
		stat string
		want bool
	}{
		{"6101 (fpt) Z 1 6101 6101 0 -1", true},
		{"6101 (fpt) S 1 6101 6101 0 -1", false},
		{"42 (a) Z) S 1 42", false}, // a command name holding ") Z"
		{"42 (a) Z) Z 1 42", true},
		{"", false},
		{"42 (fpt)", false},
	} {
		if got := zombie([]byte(tc.stat)); got != tc.want {
			t.Errorf("zombie(%q) = %v, want %v", tc.stat, got, tc.want)
		}
	}
}

func TestRatePlan(t *testing.T) {
	n := namesFor(42, 0)
	for _, tc := range []struct {
		name string
		i    int
		h    HostSpec
		want []string
	}{
		{"both sides limited", 1, HostSpec{Up: "25mbit", Down: "200mbit"}, []string{
			"tc -n fpt42ah1 qdisc del dev eth0 root",
			"tc -n fpt42ah1 qdisc add dev eth0 root tbf rate 25000000bit burst 32768 latency 50ms",
			"tc qdisc del dev fpt42av1 root",
			"tc qdisc add dev fpt42av1 root tbf rate 200000000bit burst 250000 latency 50ms",
		}},
		{"unlimited", 0, HostSpec{}, []string{
			"tc -n fpt42ah0 qdisc del dev eth0 root",
			"tc qdisc del dev fpt42av0 root",
		}},
		{"upload only", 3, HostSpec{Up: "1gbit"}, []string{
			"tc -n fpt42ah3 qdisc del dev eth0 root",
			"tc -n fpt42ah3 qdisc add dev eth0 root tbf rate 1000000000bit burst 1250000 latency 50ms",
			"tc qdisc del dev fpt42av3 root",
		}},
	} {
		plan, err := ratePlan(n, tc.i, tc.h)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		var got []string
		for _, s := range plan {
			if s.what == "" {
				t.Errorf("%s: step %q has no description", tc.name, s.args)
			}
			got = append(got, strings.Join(s.args, " "))
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: rate plan\n%s\nwant\n%s", tc.name, strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
		}
	}
	// The shaping commands are setupPlan's, for the new rates.
	setup, err := setupPlan(n, []HostSpec{{}, {Up: "2mbit", Down: "3mbit"}})
	if err != nil {
		t.Fatal(err)
	}
	change, _ := ratePlan(n, 1, HostSpec{Up: "2mbit", Down: "3mbit"})
	if !slices.Equal(setup[len(setup)-2].args, change[1].args) || !slices.Equal(setup[len(setup)-1].args, change[3].args) {
		t.Errorf("setup shapes with %q and %q; SetRate with %q and %q",
			setup[len(setup)-2].args, setup[len(setup)-1].args, change[1].args, change[3].args)
	}
	if _, err := ratePlan(n, 0, HostSpec{Up: "fast"}); err == nil || !strings.Contains(err.Error(), "host 0: upload") {
		t.Errorf("bad rate: error %v", err)
	}
}

func TestSetRateExecutor(t *testing.T) {
	f := &fakeIP{}
	n, err := create(context.Background(), f.run, 5, func(int) bool { return true }, []HostSpec{{}, {Up: "1mbit", Down: "1mbit"}})
	if err != nil {
		t.Fatal(err)
	}
	// Sides whose qdisc is already gone: not an error.
	f.fail = map[string]string{"tc -n fpt5ah0 qdisc del": "Error: Cannot delete qdisc with handle of zero.",
		"tc qdisc del dev fpt5av0": "RTNETLINK answers: No such file or directory"}
	if err := n.SetRate(context.Background(), 0, HostSpec{}); err != nil {
		t.Errorf("unshaping an unshaped host: %v", err)
	}
	f.fail = nil
	f.ran = nil
	if err := n.SetRate(context.Background(), 1, HostSpec{Up: "25mbit", Down: "2mbit"}); err != nil {
		t.Fatal(err)
	}
	f.ranAll(t, "tc -n fpt5ah1 qdisc del dev eth0 root", "tc -n fpt5ah1 qdisc add dev eth0 root tbf rate 25000000bit burst 32768 latency 50ms",
		"tc qdisc del dev fpt5av1 root", "tc qdisc add dev fpt5av1 root tbf rate 2000000bit burst 32768 latency 50ms")
	if got := n.Host(1); got != (HostSpec{Up: "25mbit", Down: "2mbit"}) {
		t.Errorf("Host(1) = %v after SetRate", got)
	}
	// A failing tc: the error names it, the spec stays the last good one.
	f.fail = map[string]string{"tc qdisc add dev fpt5av1": "Error: Specified qdisc kind is unknown."}
	if err := n.SetRate(context.Background(), 1, HostSpec{Up: "3mbit", Down: "3mbit"}); err == nil || !strings.Contains(err.Error(), "shape download of fpt5ah1 to 3mbit") {
		t.Errorf("SetRate with a failing tc: %v", err)
	}
	if got := n.Host(1); got != (HostSpec{Up: "25mbit", Down: "2mbit"}) {
		t.Errorf("Host(1) = %v after a failed SetRate", got)
	}
	if err := n.SetRate(context.Background(), 2, HostSpec{}); err == nil {
		t.Error("SetRate of host 2 of 2: no error")
	}
	if err := n.SetRate(context.Background(), 0, HostSpec{Down: "0mbit"}); err == nil {
		t.Error("SetRate with a bad spec: no error")
	}
}

func TestParseRateExported(t *testing.T) {
	if got, err := ParseRate("400mbit"); err != nil || got != 400e6 {
		t.Errorf("ParseRate(400mbit) = %d, %v", got, err)
	}
	for _, bad := range []string{"none", "0", "", "fast"} {
		if _, err := ParseRate(bad); err == nil {
			t.Errorf("ParseRate(%q): no error", bad)
		}
	}
}

// TestFlowCapPlan: a per-flow cap is one tc process, in the host's
// namespace, reading every qdisc, class and filter from its standard
// input: the root HTB, the link's and the default class, the two hash
// tables, a class and two bucket filters per flow bucket, the two hashing
// filters.
func TestFlowCapPlan(t *testing.T) {
	plan, err := setupPlan(namesFor(42, 0), []HostSpec{{Up: "1gbit", FlowCap: "200mbit"}})
	if err != nil {
		t.Fatal(err)
	}
	var tcs []step
	for _, s := range plan {
		if s.args[0] == "tc" {
			tcs = append(tcs, s)
		}
	}
	if len(tcs) != 1 || strings.Join(tcs[0].args, " ") != "tc -n fpt42ah0 -batch -" {
		t.Fatalf("tc steps %v, want one: tc -n fpt42ah0 -batch -", tcs)
	}
	lines := strings.Split(strings.TrimSuffix(tcs[0].stdin, "\n"), "\n")
	if want := 5 + 3*flowBuckets + 2; len(lines) != want {
		t.Fatalf("%d batch commands, want %d:\n%s", len(lines), want, tcs[0].stdin)
	}
	for _, want := range []string{
		"qdisc add dev eth0 root handle 1: htb default 2",
		"class add dev eth0 parent 1: classid 1:1 htb rate 1000000000bit ceil 1000000000bit",
		"class add dev eth0 parent 1:1 classid 1:13f htb rate 2000000bit ceil 200000000bit",
		"filter add dev eth0 parent 1: prio 1 protocol ip u32 ht 3:3f: match u8 0 0 flowid 1:13f",
	} {
		if !slices.Contains(lines, want) {
			t.Errorf("no batch command %q in:\n%s", want, tcs[0].stdin)
		}
	}
	if last := lines[len(lines)-1]; !strings.HasSuffix(last, "link 3:") {
		t.Errorf("last batch command %q, want the destination port's hashing filter", last)
	}
}
