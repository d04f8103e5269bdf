package control

import (
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// acceptedFDs maps the descriptors of this process's connections accepted
// on port to their peers' addresses ("127.0.0.1:port").
func acceptedFDs(port int) map[int]string {
	out := map[int]string{}
	for fd := 3; fd < 4096; fd++ {
		sa, err := syscall.Getsockname(fd)
		if err != nil {
			continue
		}
		local, ok := sa.(*syscall.SockaddrInet4)
		if !ok || local.Port != port {
			continue
		}
		pa, err := syscall.Getpeername(fd)
		if err != nil {
			continue // the listener
		}
		if peer, ok := pa.(*syscall.SockaddrInet4); ok {
			out[fd] = net.IP(peer.Addr[:]).String() + ":" + strconv.Itoa(peer.Port)
		}
	}
	return out
}

// TestReconnectKeepsOrigin: a DEALER whose connection is cut reconnects
// under the same routing id, so its messages keep their Origin (a
// scheduler would otherwise take a member cut by a burst of strangers for
// a stranger).
func TestReconnectKeepsOrigin(t *testing.T) {
	for _, secret := range []string{"", testSecret} {
		t.Run("secret="+strconv.FormatBool(secret != ""), func(t *testing.T) {
			a, b := listenSecret(t, secret, nil), listenSecret(t, secret, nil)
			if err := a.Send(endpoint(b), &Message{Command: Heartbeat, Text: "before"}); err != nil {
				t.Fatal(err)
			}
			first := recv(t, b)
			cut := 0
			for fd := range acceptedFDs(b.Port()) {
				if syscall.Shutdown(fd, syscall.SHUT_RDWR) == nil {
					cut++
				}
			}
			if cut == 0 {
				t.Fatal("found no accepted connection to cut")
			}
			// A message written before the DEALER sees the cut is lost with
			// the connection: send until one sent after it arrives.
			deadline := time.Now().Add(20 * time.Second)
			for n := 0; ; n++ {
				if time.Now().After(deadline) {
					t.Fatal("no message arrived after the cut")
				}
				text := "after-" + strconv.Itoa(n)
				if err := a.Send(endpoint(b), &Message{Command: Heartbeat, Text: text}); err != nil {
					t.Fatal(err)
				}
				select {
				case m := <-b.Incoming():
					if m.Origin != first.Origin {
						t.Fatalf("after a reconnection the Origin is %q, want %q as before", m.Origin, first.Origin)
					}
					return
				case <-time.After(200 * time.Millisecond):
				}
			}
		})
	}
}

// TestCutSparesMembers: the gate's cut, given a descriptor that now holds
// a member's connection (descriptors are reused between the monitor's
// event and the cut), leaves it alone, and still cuts a new connection
// that has sent no more than a greeting.
func TestCutSparesMembers(t *testing.T) {
	a, b := listenSecret(t, testSecret, nil), listenSecret(t, testSecret, nil)
	if err := a.Send(endpoint(b), &Message{Command: Heartbeat}); err != nil {
		t.Fatal(err)
	}
	first := recv(t, b)
	members := acceptedFDs(b.Port())
	if len(members) != 1 {
		t.Fatalf("accepted connections %v, want the member's one", members)
	}
	for fd := range members {
		if cutConnection(fd, b.Port()) {
			t.Errorf("a member's connection (fd %d) was cut", fd)
		}
	}

	conn, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(b.Port()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte{0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f}); err != nil {
		t.Fatal(err)
	}
	var stranger int
	for deadline := time.Now().Add(10 * time.Second); stranger == 0; {
		for fd, peer := range acceptedFDs(b.Port()) {
			if peer == conn.LocalAddr().String() {
				stranger = fd
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the new connection was not accepted")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !cutConnection(stranger, b.Port()) {
		t.Error("a new connection that sent half a greeting was not cut")
	}

	if err := a.Send(endpoint(b), &Message{Command: Heartbeat, Text: "still"}); err != nil {
		t.Fatal(err)
	}
	if m := recv(t, b); m.Text != "still" || m.Origin != first.Origin {
		t.Errorf("after the cuts the member's message is %q from %q, want \"still\" from %q", m.Text, m.Origin, first.Origin)
	}
}
