package netem

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// SkipRootTestsEnv, set to 1, skips the tests that need root instead of
// failing them.
const skipRootTestsEnv = "FPT_SKIP_ROOT_TESTS"

// The test binary doubles as the traffic generator: run inside a host with
// helperEnv set, TestMain runs the helper instead of the tests.
const (
	helperEnv  = "FPT_NETEM_TEST_HELPER" // sink or source
	helperAddr = "FPT_NETEM_TEST_ADDR"   // host:port
	helperSize = "FPT_NETEM_TEST_BYTES"  // bytes the source sends
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		if err := helper(mode, os.Getenv(helperAddr), os.Getenv(helperSize)); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// helper is a sink (accepts one connection, reads it to the end, prints
// "ready" once listening and then "BYTES SECONDS") or a source (sends
// size bytes).
func helper(mode, addr, size string) error {
	switch mode {
	case "sink":
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return err
		}
		fmt.Println("ready")
		c, err := l.Accept()
		if err != nil {
			return err
		}
		t0 := time.Now()
		n, err := io.Copy(io.Discard, c)
		if err != nil {
			return err
		}
		fmt.Println(n, time.Since(t0).Seconds())
		return nil
	case "source":
		bytes, err := strconv.Atoi(size)
		if err != nil {
			return err
		}
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return err
		}
		if _, err := c.Write(make([]byte, bytes)); err != nil {
			return err
		}
		return c.Close()
	}
	return fmt.Errorf("unknown mode %q", mode)
}

func needRoot(t *testing.T) {
	t.Helper()
	if err := Available(); err != nil {
		if os.Getenv(skipRootTestsEnv) == "1" {
			t.Skipf("%v (%s=1)", err, skipRootTestsEnv)
		}
		t.Fatalf("this test needs root, iproute2 and tc (CI runs as root); set %s=1 to skip it: %v", skipRootTestsEnv, err)
	}
}

// transfer sends bytes from host src to host dst and returns the rate the
// receiver saw, in bits per second.
func transfer(t *testing.T, n *Network, src, dst, bytes int) float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	addr := n.Addr(dst) + ":5001"
	sink := n.Command(ctx, dst, os.Args[0])
	sink.Env = append(os.Environ(), helperEnv+"=sink", helperAddr+"="+addr)
	sink.Stderr = os.Stderr
	out, err := sink.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := sink.Start(); err != nil {
		t.Fatal(err)
	}
	defer sink.Wait()
	lines := bufio.NewScanner(out)
	if !lines.Scan() || lines.Text() != "ready" {
		t.Fatalf("sink in host %d did not start: %q %v", dst, lines.Text(), lines.Err())
	}
	source := n.Command(ctx, src, os.Args[0])
	source.Env = append(os.Environ(), helperEnv+"=source", helperAddr+"="+addr, helperSize+"="+strconv.Itoa(bytes))
	if b, err := source.CombinedOutput(); err != nil {
		t.Fatalf("source in host %d: %v\n%s", src, err, b)
	}
	if !lines.Scan() {
		t.Fatalf("sink in host %d printed no result: %v", dst, lines.Err())
	}
	var got int
	var secs float64
	if _, err := fmt.Sscan(lines.Text(), &got, &secs); err != nil || got != bytes {
		t.Fatalf("sink in host %d printed %q (%v), want %d bytes", dst, lines.Text(), err, bytes)
	}
	return float64(got) * 8 / secs
}

// ours lists the namespaces and links of the network named n that exist.
func ours(t *testing.T, n names) []string {
	t.Helper()
	var found []string
	for _, args := range [][]string{{"ip", "netns", "list"}, {"ip", "-o", "link", "show"}} {
		out, err := exec.Command(args[0], args[1:]...).Output()
		if err != nil {
			t.Fatalf("%q: %v", args, err)
		}
		list := parseNetnsList(string(out))
		if args[1] != "netns" {
			list = parseLinkList(string(out))
		}
		for _, name := range list {
			if strings.HasPrefix(name, n.prefix) {
				found = append(found, name)
			}
		}
	}
	return found
}

// Host 0 is shaped both ways, hosts 1 and 2 are not: a transfer from or to
// host 0 runs near the rate; one between hosts 1 and 2, the control, far
// above it. A functional check that tbf sits on both sides, not a speed
// assertion: the bounds are loose.
func TestNetemShapesLinks(t *testing.T) {
	needRoot(t)
	const rate = 50e6
	n, err := New(context.Background(), []HostSpec{{Up: "50mbit", Down: "50mbit"}, {}, {}})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if got := ours(t, n.names); len(got) != 3+3+1 {
		t.Errorf("found %q, want 3 namespaces, 3 veths and a bridge", got)
	}
	const size = 4 << 20 // about 0.7 s at 50 Mbit/s
	for _, tc := range []struct {
		name     string
		src, dst int
		limited  bool
	}{
		{"upload of the shaped host", 0, 1, true},
		{"download of the shaped host", 1, 0, true},
		{"between unshaped hosts", 1, 2, false},
	} {
		got := transfer(t, n, tc.src, tc.dst, size)
		t.Logf("%s: %.1f Mbit/s", tc.name, got/1e6)
		if tc.limited && got > 2*rate {
			t.Errorf("%s: %.1f Mbit/s, want about %.0f", tc.name, got/1e6, rate/1e6)
		}
		if !tc.limited && got < 2*rate {
			t.Errorf("%s: %.1f Mbit/s, want far more than %.0f", tc.name, got/1e6, rate/1e6)
		}
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if left := ours(t, n.names); len(left) > 0 {
		t.Errorf("left behind: %q", left)
	}
}

// Two networks at once in one process get different names; Close kills
// what runs in a host.
func TestNetemTwoNetworksAndClose(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	a, err := New(ctx, []HostSpec{{}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := New(ctx, []HostSpec{{Up: "1gbit", Down: "1gbit"}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if a.Namespace(0) == b.Namespace(0) {
		t.Fatalf("both networks use %s", a.Namespace(0))
	}
	sleep := b.Command(ctx, 0, "sleep", "60")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	ended := exits(sleep)
	for _, n := range []*Network{a, b} {
		if err := n.Close(); err != nil {
			t.Error(err)
		}
		if left := ours(t, n.names); len(left) > 0 {
			t.Errorf("left behind: %q", left)
		}
	}
	ended(t, "a process in a host survived Close")
}

// exits waits for a started command in the background; the function it
// returns fails the test with what, and kills the command, unless it ended
// within 10 s.
func exits(cmd *exec.Cmd) func(t *testing.T, what string) {
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	return func(t *testing.T, what string) {
		t.Helper()
		select {
		case <-waited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			t.Error(what)
		}
	}
}

// nsPids are the processes in namespace ns.
func nsPids(t *testing.T, ns string) []int {
	t.Helper()
	out, err := exec.Command("ip", "netns", "pids", ns).Output()
	if err != nil {
		t.Fatalf("ip netns pids %s: %v", ns, err)
	}
	return parsePids(string(out))
}

// A network whose owner died (here: made by hand under the name of a
// process that has exited) goes at the next New, with what ran in it.
func TestNetemSweepsLeftovers(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	stale := namesFor(dead.Process.Pid, 0)
	for _, args := range [][]string{
		{"ip", "netns", "add", stale.namespace(0)},
		{"ip", "link", "add", stale.veth(0), "type", "veth", "peer", "name", "eth0", "netns", stale.namespace(0)},
		{"ip", "link", "add", stale.bridge(), "type", "bridge"},
	} {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%q: %v: %s", args, err, out)
		}
	}
	t.Cleanup(func() {
		for _, args := range teardownPlan(stale, 1) {
			exec.Command(args.args[0], args.args[1:]...).Run()
		}
	})
	orphan := exec.Command("ip", "netns", "exec", stale.namespace(0), "sleep", "60")
	if err := orphan.Start(); err != nil {
		t.Fatal(err)
	}
	ended := exits(orphan)
	// ip netns exec enters the namespace after it starts: a sweep before
	// that would not see it there.
	for deadline := time.Now().Add(10 * time.Second); !slices.Contains(nsPids(t, stale.namespace(0)), orphan.Process.Pid); {
		if time.Now().After(deadline) {
			t.Fatalf("the process never showed in %s", stale.namespace(0))
		}
		time.Sleep(10 * time.Millisecond)
	}

	n, err := New(ctx, []HostSpec{{}})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if left := ours(t, stale); len(left) > 0 {
		t.Errorf("leftovers of a dead process survived New: %q", left)
	}
	ended(t, "a process in a leftover namespace survived the sweep")
}

// Bad specs fail before anything is made, root or not.
func TestNetemNewRejectsBadSpecs(t *testing.T) {
	for _, tc := range []struct {
		name  string
		hosts []HostSpec
	}{
		{"no hosts", nil},
		{"bad rate", []HostSpec{{Up: "lots"}}},
		{"too many", make([]HostSpec, MaxHosts+1)},
	} {
		if n, err := New(context.Background(), tc.hosts); err == nil {
			n.Close()
			t.Errorf("%s: New succeeded", tc.name)
		}
	}
}

// SetRate reshapes a running host: host 0 starts at 200 Mbit/s and drops
// to 20 Mbit/s in the middle of a transfer, which must still complete (a
// tbf changed in place would keep a packet too large for its new bucket
// queued for ever); then it is freed. Loose bounds, as in
// TestNetemShapesLinks: a functional check, not a speed assertion.
func TestNetemSetRate(t *testing.T) {
	needRoot(t)
	const rate = 20e6
	ctx := context.Background()
	n, err := New(ctx, []HostSpec{{Up: "200mbit", Down: "200mbit"}, {}})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	changed := make(chan error, 1)
	go func() {
		time.Sleep(300 * time.Millisecond)
		changed <- n.SetRate(ctx, 0, HostSpec{Up: "20mbit", Down: "20mbit"})
	}()
	// About 0.3 s at 200 Mbit/s, then some 2 s at 20.
	got := transfer(t, n, 0, 1, 12<<20)
	if err := <-changed; err != nil {
		t.Fatal(err)
	}
	t.Logf("through the drop: %.1f Mbit/s", got/1e6)
	const size = 1 << 20 // about 0.8 s at 10 Mbit/s
	for _, dir := range [][2]int{{0, 1}, {1, 0}} {
		got := transfer(t, n, dir[0], dir[1], size)
		t.Logf("limited, %d to %d: %.1f Mbit/s", dir[0], dir[1], got/1e6)
		if got > 2*rate {
			t.Errorf("%d to %d after SetRate(20mbit): %.1f Mbit/s", dir[0], dir[1], got/1e6)
		}
	}
	if err := n.SetRate(ctx, 0, HostSpec{}); err != nil {
		t.Fatal(err)
	}
	// Twice: removing what is gone already is not an error.
	if err := n.SetRate(ctx, 0, HostSpec{}); err != nil {
		t.Fatal(err)
	}
	if got := transfer(t, n, 1, 0, size); got < 2*rate {
		t.Errorf("after SetRate back to unlimited: %.1f Mbit/s", got/1e6)
	}
	if got := n.Host(0); got != (HostSpec{}) {
		t.Errorf("Host(0) = %v", got)
	}
}

// What ip prints when the object to delete is missing, or vanished between
// its look-up and the delete, counts as gone; anything else is a failure.
func TestGone(t *testing.T) {
	tests := []struct {
		stderr string
		gone   bool
	}{
		{`Cannot find device "fpt1av0"`, true},
		{"RTNETLINK answers: No such device", true},
		{"Cannot remove namespace file \"/run/netns/fpt1n0\": No such file or directory", true},
		{"Error: Peer netns reference is invalid. does not exist", true},
		{"RTNETLINK answers: Operation not permitted", false},
		{"", false},
	}
	for _, tt := range tests {
		err := &cmdError{args: []string{"ip", "link", "del", "x"}, err: errors.New("exit status 2"), stderr: tt.stderr}
		if got := gone(err); got != tt.gone {
			t.Errorf("gone(%q) = %v, want %v", tt.stderr, got, tt.gone)
		}
	}
	if gone(errors.New("not a command error")) {
		t.Error("a plain error counted as gone")
	}
}

// One TCP connection from a host with a per-flow cap runs near the cap,
// well below the link's rate, which a connection from an uncapped host of
// the same rate reaches. A functional check that the HTB and its filters
// catch the flow, not a speed assertion: the cap is low enough that a
// machine loaded many times over its cores (160 Mbit/s through veths at a
// load of 24 on 2 cores) still moves an uncapped flow well above it.
func TestNetemFlowCap(t *testing.T) {
	needRoot(t)
	const flowCap = 10e6
	n, err := New(context.Background(), []HostSpec{{Up: "1gbit", Down: "1gbit", FlowCap: "10mbit"}, {Up: "1gbit", Down: "1gbit"}, {}})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	const size = 1 << 20 // about 0.8 s at 10 Mbit/s
	capped := transfer(t, n, 0, 2, size)
	free := transfer(t, n, 1, 2, size)
	t.Logf("one flow from the capped host: %.1f Mbit/s; from the uncapped one: %.1f Mbit/s", capped/1e6, free/1e6)
	if capped > 2*flowCap {
		t.Errorf("one flow from the capped host: %.1f Mbit/s, want about %.0f", capped/1e6, flowCap/1e6)
	}
	if free < 3*flowCap {
		t.Errorf("one flow from the uncapped host: %.1f Mbit/s, want far more than %.0f", free/1e6, flowCap/1e6)
	}
}
