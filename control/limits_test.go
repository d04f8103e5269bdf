package control

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// limitsChildEnv makes this test binary, re-run, the node of
// TestStrangersCannotExhaustDescriptors; its value is the RLIMIT_NOFILE.
const limitsChildEnv = "CONTROL_TEST_LIMITS_CHILD"

// TestLimitsChild is that node: a plane with a secret under a low limit on
// open files, which prints its port, serves until its stdin closes, then
// closes, ends the ZeroMQ context and prints what it refused.
func TestLimitsChild(t *testing.T) {
	v, ok := os.LookupEnv(limitsChildEnv)
	if !ok {
		t.Skip("TestStrangersCannotExhaustDescriptors's child")
	}
	limit, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: limit, Max: limit}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	refused := map[string]int{}
	p, err := Listen(Config{BindHost: "127.0.0.1", Secret: testSecret, OnReject: func(r string) {
		mu.Lock()
		refused[r]++
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("port %d\n", p.Port())
	io.Copy(io.Discard, os.Stdin)
	// The ZAP wake-up at the end makes a socket: with every descriptor
	// taken it used to abort the process.
	if err := p.Close(); err != nil {
		fmt.Println("close:", err)
	}
	Shutdown()
	mu.Lock()
	fmt.Printf("refused busy=%d handshake=%d\n", refused["busy"], refused["handshake"])
	mu.Unlock()
	os.Exit(0)
}

// TestStrangersCannotExhaustDescriptors: strangers opening many
// connections that send half a greeting and then nothing neither hold the
// node's descriptors past the handshake interval nor take more than the
// bound on unauthenticated connections, the node (in a child process,
// under a limit of 256 open files) closes and exits cleanly afterwards,
// and the refusals are counted and logged.
func TestStrangersCannotExhaustDescriptors(t *testing.T) {
	if testing.Short() {
		t.Skip("opens 600 connections and waits out the handshake interval")
	}
	const strangers = 600
	cmd := exec.Command(os.Args[0], "-test.run=^TestLimitsChild$")
	cmd.Env = append(os.Environ(), limitsChildEnv+"=256")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	out := bufio.NewScanner(stdout)
	var port int
	if !out.Scan() {
		t.Fatalf("child said nothing: %s", stderr.String())
	}
	if _, err := fmt.Sscanf(out.Text(), "port %d", &port); err != nil {
		t.Fatalf("child said %q: %v", out.Text(), err)
	}
	fds := func() int {
		d, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", cmd.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		return len(d)
	}
	base := fds()

	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	// A ZMTP 3 signature and version, then nothing: libzmq waits for
	// the rest of the greeting.
	partial := []byte{0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 3}
	for range strangers {
		c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			t.Fatal(err)
		}
		c.Write(partial)
		conns = append(conns, c)
	}
	// The cap: well before the handshake interval ends, the node holds
	// no more than the bound (it cuts the excess as the events arrive).
	bound := base + maxUnauthenticated + 16
	for deadline := time.Now().Add(handshakeIvl / 2); fds() > bound; {
		if time.Now().After(deadline) {
			t.Fatalf("the node holds %d descriptors after %d half greetings (%d before): want at most %d", fds(), strangers, base, bound)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Every stranger's connection is gone within the handshake interval
	// (a generous deadline: this waits for libzmq's timer, it times nothing).
	for deadline := time.Now().Add(handshakeIvl + 10*time.Second); fds() > base+4; {
		if time.Now().After(deadline) {
			t.Fatalf("the node still holds %d descriptors (%d before the strangers) %s after they stopped sending", fds(), base, handshakeIvl+10*time.Second)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The last few may still be closing: hang up on them, and let their
	// ends be counted before the child reports.
	for _, c := range conns {
		c.Close()
	}
	for deadline := time.Now().Add(10 * time.Second); fds() > base && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // the monitor's last events, behind the fds
	stdin.Close()
	var last string
	for out.Scan() {
		last = out.Text()
	}
	err = cmd.Wait()
	if err != nil {
		t.Fatalf("child: %v (it must exit 0)\n%s", err, stderr.String())
	}
	var busy, handshake int
	if _, err := fmt.Sscanf(last, "refused busy=%d handshake=%d", &busy, &handshake); err != nil {
		t.Fatalf("child's last line %q: %v", last, err)
	}
	if busy == 0 || handshake == 0 || busy+handshake != strangers {
		t.Errorf("refused busy=%d handshake=%d; want both counted, %d in all", busy, handshake, strangers)
	}
	if !strings.Contains(stderr.String(), "control: refused") {
		t.Errorf("no refusal logged: %s", stderr.String())
	}
}
