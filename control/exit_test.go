package control

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

const exitChildEnv = "CONTROL_TEST_EXIT_CHILD"

// TestExitChild is TestExitWithOpenPlanes's child: two planes with a
// secret, one sending to the other (a peer's DEALER and its monitor, made
// after Listen), then an exit with neither plane closed nor Shutdown
// called.
func TestExitChild(t *testing.T) {
	if os.Getenv(exitChildEnv) == "" {
		t.Skip("TestExitWithOpenPlanes's child")
	}
	a, err := Listen(Config{BindHost: "127.0.0.1", Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Listen(Config{BindHost: "127.0.0.1", Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Send(endpoint(b), &Message{Command: Heartbeat, Sender: 7}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-b.Incoming():
	case <-time.After(10 * time.Second):
		t.Fatal("no message between the planes")
	}
	os.Exit(0)
}

// A process that exits with planes open still exits. czmq's exit handler
// ends the ZeroMQ context, which blocks until every socket of it is
// closed: it closes the sockets it tracks, so every socket fpt makes must
// be one it tracks, and no plane's thread may be using one meanwhile (the
// exit gate: without it the child hung in about 2 exits of 5 on a loaded
// machine, in zmq_ctx_term). The handler runs where the process ends through libc's
// exit: a C program that returns from main, and a Go program built with
// the race detector, as the suite runs this test.
func TestExitWithOpenPlanes(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestExitChild$")
	cmd.Env = append(os.Environ(), exitChildEnv+"=1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the child failed: %v", err)
		}
	case <-time.After(60 * time.Second): // a hang guard, not a speed bound
		cmd.Process.Kill()
		<-done
		t.Fatal("the child did not exit within 60 s of its planes' last message: ZeroMQ's context end is blocked on a socket czmq does not know")
	}
}
