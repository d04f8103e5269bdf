package control

import (
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zeromq/goczmq"

	"github.com/fptps/fpt/auth"
	"github.com/fptps/fpt/node"
)

const testSecret = "0123456789abcdef-control-test"

func listenSecret(tb testing.TB, secret string, onReject func(string)) *Plane {
	tb.Helper()
	p, err := Listen(Config{BindHost: "127.0.0.1", Logger: quietLogger(), Secret: secret, OnReject: onReject})
	if err != nil {
		tb.Fatalf("Listen: %v", err)
	}
	tb.Cleanup(func() { p.Close() })
	return p
}

// TestCurveHandshake: planes sharing the secret talk both ways, and a
// message's Origin is the same for every message of one sending plane and
// differs between planes.
func TestCurveHandshake(t *testing.T) {
	a, b, c := listenSecret(t, testSecret, nil), listenSecret(t, testSecret, nil), listenSecret(t, testSecret, nil)
	origins := map[*Plane]string{}
	for range 2 {
		for _, from := range []*Plane{a, c} {
			if err := from.Send(endpoint(b), &Message{Command: Heartbeat, Sender: 7}); err != nil {
				t.Fatal(err)
			}
			m := recv(t, b)
			if m.Command != Heartbeat || m.Origin == "" {
				t.Fatalf("got %v from %q, want a Heartbeat with an Origin", m.Command, m.Origin)
			}
			if o, seen := origins[from]; seen && o != m.Origin {
				t.Errorf("one plane's messages came with Origins %q and %q", o, m.Origin)
			}
			origins[from] = m.Origin
		}
	}
	if origins[a] == origins[c] {
		t.Error("two planes have the same Origin")
	}
	if err := b.Send(endpoint(a), &Message{Command: HeartbeatAck}); err != nil {
		t.Fatal(err)
	}
	if m := recv(t, a); m.Command != HeartbeatAck || m.Origin == "" {
		t.Errorf("got %v from %q", m.Command, m.Origin)
	}
}

// TestCurveRefusesStrangers: a plane without the secret, one with another
// secret, and a raw DEALER with a made-up client key (but the right server
// key) deliver nothing to a plane with the secret; a member's message
// sent afterwards is the first thing to arrive.
func TestCurveRefusesStrangers(t *testing.T) {
	var rejected atomic.Int64
	target := listenSecret(t, testSecret, func(string) { rejected.Add(1) })
	member := listenSecret(t, testSecret, nil)
	none := listen(t, 0, nil)
	wrong := listenSecret(t, "another-secret-of-16+bytes", nil)
	for _, p := range []*Plane{none, wrong} {
		if err := p.Send(endpoint(target), &Message{Command: Terminate, Sender: node.SchedulerID}); err != nil {
			t.Fatal(err)
		}
	}
	// A client with the server's public key but a key pair of its own.
	keys, err := auth.DeriveCurve(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	forged, err := auth.DeriveCurve("an attacker's own 16+ byte secret")
	if err != nil {
		t.Fatal(err)
	}
	raw := goczmq.NewSock(goczmq.Dealer)
	defer raw.Destroy()
	raw.SetCurveServerkey(keys.Server.Public)
	raw.SetCurvePublickey(forged.Client.Public)
	raw.SetCurveSecretkey(forged.Client.Secret)
	raw.SetLinger(0)
	if err := raw.Connect(endpoint(target)); err != nil {
		t.Fatal(err)
	}
	b, _ := (&Message{Command: NodeFailed, Sender: node.SchedulerID, Target: 9}).MarshalBinary()
	raw.SendFrame(b, goczmq.FlagDontWait)

	// Wait until the forged client's handshake was refused by the ZAP
	// handler (a deadlock guard, not a timing assertion), then give the
	// others a moment to have failed too.
	for deadline := time.Now().Add(waitTime); rejected.Load() == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the ZAP handler never refused the forged client key")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	if err := member.Send(endpoint(target), &Message{Command: Heartbeat, Sender: 5}); err != nil {
		t.Fatal(err)
	}
	if m := recv(t, target); m.Command != Heartbeat || m.Sender != 5 {
		t.Fatalf("first delivery is %v from %v; want the member's Heartbeat", m.Command, m.Sender)
	}
	select {
	case m := <-target.Incoming():
		t.Fatalf("a stranger's %v arrived", m.Command)
	case <-time.After(300 * time.Millisecond):
	}
}

// The ZAP handler sleeps while no connection arrives (each wake-up of its
// locked thread takes a processor from the data plane: polling every 20 ms
// cost 3 % of goodput), and stops when woken, not on its poll timeout.
func TestZAPHandlerIdle(t *testing.T) {
	before := zap.timeouts.Load()
	a := listenSecret(t, testSecret, nil)
	b := listenSecret(t, testSecret, nil)
	if err := a.Send("tcp://127.0.0.1:"+strconv.Itoa(b.Port()), &Message{Command: Heartbeat, Sender: node.WorkerID(0)}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-b.Incoming():
	case <-time.After(10 * time.Second):
		t.Fatal("no message over CURVE")
	}
	time.Sleep(300 * time.Millisecond)
	a.Close()
	b.Close() // the last plane with a secret: the handler stops
	if n := zap.timeouts.Load() - before; n != 0 {
		t.Errorf("the ZAP handler woke %d times on its poll timeout; want 0 (it waits for requests, and is woken to stop)", n)
	}
}

// lockedBuffer is a log sink safe for the plane's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (w *lockedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *lockedBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// TestWrongSecretSaysSo: a node whose secret differs says, itself, that its
// handshake failed and names the secret (as one cause of a hang-up until
// busyBound has passed: TestShakeLog); the node refusing it counts the
// refusal as "auth" and logs it.
func TestWrongSecretSaysSo(t *testing.T) {
	var targetLog, wrongLog lockedBuffer
	var auth atomic.Int64
	target, err := Listen(Config{BindHost: "127.0.0.1", Secret: testSecret,
		Logger: slog.New(slog.NewTextHandler(&targetLog, nil)),
		OnReject: func(r string) {
			if r == "auth" {
				auth.Add(1)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	wrong, err := Listen(Config{BindHost: "127.0.0.1", Secret: "another-secret-of-16+bytes",
		Logger: slog.New(slog.NewTextHandler(&wrongLog, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer wrong.Close()
	if err := wrong.Send(endpoint(target), &Message{Command: AddNode}); err != nil {
		t.Fatal(err)
	}
	// A deadlock guard, not a timing assertion.
	for deadline := time.Now().Add(waitTime); ; time.Sleep(20 * time.Millisecond) {
		said := strings.Contains(wrongLog.String(), "during the handshake") &&
			strings.Contains(wrongLog.String(), "FPT_CLUSTER_SECRET") &&
			strings.Contains(wrongLog.String(), "authentication")
		if said && auth.Load() > 0 && strings.Contains(targetLog.String(), "control: refused") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("refused node logged %q; refusing node counted %d auth refusals and logged %q", wrongLog.String(), auth.Load(), targetLog.String())
		}
	}
}
