package control

import (
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestShakeLog: what a DEALER's handshake outcomes log, for sequences of
// them: hang-ups are a busy peer's until busyBound (and a success after
// them says so), then blamed on the secret; refusals that name the key
// are blamed at once.
func TestShakeLog(t *testing.T) {
	type step struct {
		at    time.Duration // after t0
		ev    int           // evHandshakeSucceeded or a failure
		value uint32
		level slog.Level
		has   string // in the line's message; "" no line
	}
	const reset, pipe, eagain = 104, 32, 11
	tests := []struct {
		name  string
		curve bool
		steps []step
	}{
		{"busy, then through", true, []step{
			{0, evHandshakeFailedNoDetail, reset, slog.LevelWarn, "hung up during the handshake"},
			{100 * time.Millisecond, evHandshakeFailedNoDetail, pipe, 0, ""}, // rate-limited
			{3 * time.Second, evHandshakeSucceeded, 0, slog.LevelInfo, "the peer was busy"},
		}},
		{"hang-ups past busyBound: the secret", true, []step{
			{0, evHandshakeFailedNoDetail, reset, slog.LevelWarn, "hung up during the handshake"},
			{rejectLogEvery, evHandshakeFailedNoDetail, reset, slog.LevelWarn, "hung up during the handshake"},
			{busyBound, evHandshakeFailedNoDetail, reset, slog.LevelError, "FPT_CLUSTER_SECRET"},
		}},
		{"hang-ups past busyBound without a secret", false, []step{
			{0, evHandshakeFailedNoDetail, pipe, slog.LevelWarn, "hung up during the handshake"},
			{busyBound, evHandshakeFailedNoDetail, pipe, slog.LevelError, "is an fpt node listening there?"},
		}},
		{"key refused: the secret at once", true, []step{
			{0, evHandshakeFailedProtocol, protoCryptographic, slog.LevelError, "FPT_CLUSTER_SECRET"},
		}},
		{"silent peer: timed out", true, []step{
			{0, evHandshakeFailedNoDetail, eagain, slog.LevelError, "FPT_CLUSTER_SECRET"},
		}},
		{"through at once: nothing", true, []step{
			{0, evHandshakeSucceeded, 0, 0, ""},
		}},
	}
	t0 := time.Unix(1000, 0)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s shakeLog
			for i, st := range tt.steps {
				var line shakeLine
				if st.ev == evHandshakeSucceeded {
					line = s.succeeded("tcp://peer:1", t0.Add(st.at))
				} else {
					line = s.failed("tcp://peer:1", st.ev, st.value, handshakeFailure(st.ev, st.value, tt.curve), tt.curve, t0.Add(st.at))
				}
				if st.has == "" {
					if line.msg != "" {
						t.Fatalf("step %d: logged %v %q, want nothing", i, line.level, line.msg)
					}
					continue
				}
				if line.level != st.level || !strings.Contains(line.msg, st.has) {
					t.Fatalf("step %d: logged %v %q, want %v with %q", i, line.level, line.msg, st.level, st.has)
				}
			}
		})
	}
}

// TestBusyCutIsNotBlamedOnSecret: a member whose connection a plane cuts
// for being busy (maxUnauthenticated strangers in their handshake) logs
// no error blaming the secret: it says the peer hung up, gets through
// once the strangers have gone, and says the peer was busy.
func TestBusyCutIsNotBlamedOnSecret(t *testing.T) {
	var mu sync.Mutex
	busy := 0
	target, err := Listen(Config{BindHost: "127.0.0.1", Secret: testSecret, Logger: quietLogger(),
		OnReject: func(r string) {
			if r == "busy" {
				mu.Lock()
				busy++
				mu.Unlock()
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	busyCount := func() int {
		mu.Lock()
		defer mu.Unlock()
		return busy
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(target.Port()))
	var strangers []net.Conn
	defer func() {
		for _, c := range strangers {
			c.Close()
		}
	}()
	// flood fills the target's places with strangers that send half a
	// greeting and stall, until one is cut as busy (the handshakes that
	// succeeded lately free places too: a bound on the dials, not on
	// time).
	flood := func() {
		n := busyCount()
		for dials := 0; busyCount() == n; dials++ {
			if dials == 4*maxUnauthenticated {
				t.Fatalf("%d stalled connections and none cut as busy", dials)
			}
			c, err := net.DialTimeout("tcp", addr, waitTime)
			if err != nil {
				t.Fatal(err)
			}
			c.Write([]byte{0xff, 0, 0, 0})
			strangers = append(strangers, c)
			if dials >= maxUnauthenticated {
				// Past the bound: give the plane's monitor time to
				// take the acceptances before another.
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
	closeStrangers := func() {
		for _, c := range strangers {
			c.Close()
		}
		strangers = nil
	}
	// A member's connection is cut only if the target's monitor takes
	// its acceptance before the member is past its greeting: members
	// that get through are closed and another tries (a bound on the
	// tries, not on time).
	var memberLog *lockedBuffer
	var members []*Plane
	defer func() {
		for _, m := range members {
			m.Close()
		}
	}()
	arrived := false // the cut member's message, already
	said := "peer=" + endpoint(target)
	for try := 0; ; try++ {
		if try == 50 {
			t.Fatalf("%d members got through a full target uncut", try)
		}
		closeStrangers()
		flood()
		memberLog = &lockedBuffer{}
		member, err := Listen(Config{BindHost: "127.0.0.1", Secret: testSecret,
			Logger: slog.New(slog.NewTextHandler(memberLog, nil))})
		if err != nil {
			t.Fatal(err)
		}
		members = append(members, member)
		if err := member.Send(endpoint(target), &Message{Command: AddNode}); err != nil {
			t.Fatal(err)
		}
		cut, got := false, false
		for deadline := time.Now().Add(waitTime); !cut && !got; time.Sleep(10 * time.Millisecond) {
			select {
			case <-target.Incoming():
				got = true
			default:
			}
			cut = strings.Contains(memberLog.String(), said)
			if time.Now().After(deadline) {
				t.Fatalf("the member neither got through nor was cut; it logged %q", memberLog.String())
			}
		}
		if cut {
			arrived = got
			break
		}
	}
	if l := memberLog.String(); strings.Contains(l, "level=ERROR") || !strings.Contains(l, "hung up during the handshake") {
		t.Fatalf("the member cut as busy logged %q, want a warning that the peer hung up", l)
	}
	closeStrangers()
	if !arrived {
		if m := recv(t, target); m.Command != AddNode {
			t.Fatalf("target got %v, want AddNode", m.Command)
		}
	}
	for deadline := time.Now().Add(waitTime); !strings.Contains(memberLog.String(), "the peer was busy"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the member got through but did not say the peer was busy; it logged %q", memberLog.String())
		}
	}
	if strings.Contains(memberLog.String(), "level=ERROR") {
		t.Fatalf("the member cut as busy logged an error: %q", memberLog.String())
	}
}
