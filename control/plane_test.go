package control

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fptps/fpt/internal/localcluster"
	"github.com/fptps/fpt/node"
	"github.com/zeromq/goczmq"
)

// waitTime bounds every wait in these tests; it is a deadlock guard, not a
// timing assertion, so it is generous.
const waitTime = 10 * time.Second

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

func listen(tb testing.TB, port int, log *slog.Logger) *Plane {
	tb.Helper()
	if log == nil {
		log = quietLogger()
	}
	p, err := Listen(Config{BindHost: "127.0.0.1", Port: port, Logger: log})
	if err != nil {
		tb.Fatalf("Listen: %v", err)
	}
	tb.Cleanup(func() { p.Close() })
	return p
}

func endpoint(p *Plane) string { return "tcp://127.0.0.1:" + strconv.Itoa(p.Port()) }

func recv(tb testing.TB, p *Plane) *Message {
	tb.Helper()
	select {
	case m, ok := <-p.Incoming():
		if !ok {
			tb.Fatal("Incoming closed")
		}
		return m
	case <-time.After(waitTime):
		tb.Fatal("no message arrived")
	}
	return nil
}

// waitGoroutines waits until the goroutine count is back to base.
func waitGoroutines(t *testing.T, base int) {
	t.Helper()
	deadline := time.Now().Add(waitTime)
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("%d goroutines, want %d:\n%s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestExchangeEveryCommand(t *testing.T) {
	a, b := listen(t, 0, nil), listen(t, 0, nil)
	if a.Port() == 0 || a.Port() == b.Port() {
		t.Fatalf("ports %d and %d", a.Port(), b.Port())
	}
	for name, m := range sampleMessages() {
		for _, dir := range []struct{ from, to *Plane }{{a, b}, {b, a}} {
			if err := dir.from.Send(endpoint(dir.to), m); err != nil {
				t.Fatalf("%s: Send: %v", name, err)
			}
			got := recv(t, dir.to)
			if got.Origin == "" {
				t.Errorf("%s: no Origin", name)
			}
			if got.Origin = ""; !reflect.DeepEqual(got, m) {
				t.Fatalf("%s: got %+v, want %+v", name, got, m)
			}
		}
	}
}

func TestConcurrentSenders(t *testing.T) {
	a, b := listen(t, 0, nil), listen(t, 0, nil)
	const senders, each = 16, 400
	var wg sync.WaitGroup
	for s := range senders {
		wg.Go(func() {
			for i := range each {
				m := &Message{Command: Heartbeat, Sender: node.ID(s), Seq: uint64(i)}
				if err := a.Send(endpoint(b), m); err != nil {
					t.Errorf("Send: %v", err)
					return
				}
			}
		})
	}
	// Traffic the other way at the same time, so both loops send and
	// receive at once.
	wg.Go(func() {
		for i := range each {
			if err := b.Send(endpoint(a), &Message{Command: HeartbeatAck, Seq: uint64(i)}); err != nil {
				t.Errorf("Send: %v", err)
				return
			}
		}
	})
	next := make([]uint64, senders)
	for range senders * each {
		m := recv(t, b)
		// One DEALER per endpoint: each sender's messages stay in order.
		if m.Seq != next[m.Sender] {
			t.Fatalf("sender %d: got seq %d, want %d", m.Sender, m.Seq, next[m.Sender])
		}
		next[m.Sender]++
	}
	for i := range each {
		if m := recv(t, a); m.Seq != uint64(i) {
			t.Fatalf("reverse: got seq %d, want %d", m.Seq, i)
		}
	}
	wg.Wait()
	select {
	case m := <-b.Incoming():
		t.Fatalf("unexpected extra message %+v", m)
	case <-time.After(50 * time.Millisecond):
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func TestSendBeforePeerBinds(t *testing.T) {
	a := listen(t, 0, nil)
	port := freePort(t)
	to := "tcp://127.0.0.1:" + strconv.Itoa(port)
	for i := range 3 {
		if err := a.Send(to, &Message{Command: Barrier, Seq: uint64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(200 * time.Millisecond)
	b := listen(t, port, nil)
	for i := range 3 {
		if m := recv(t, b); m.Command != Barrier || m.Seq != uint64(i) {
			t.Fatalf("got %+v, want barrier %d", m, i)
		}
	}
}

func TestMalformedDropped(t *testing.T) {
	var logs localcluster.Buffer
	b := listen(t, 0, slog.New(slog.NewTextHandler(&logs, nil)))
	a := listen(t, 0, nil)

	// A raw DEALER, as a buggy or foreign peer would use. goczmq sockets
	// are thread-bound like the plane's, so keep this goroutine on one.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	raw, err := goczmq.NewDealer(endpoint(b))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Destroy()
	valid := mustMarshal(t, &Message{Command: Heartbeat, Sender: 99})
	badFormat := append([]byte(nil), valid...)
	badFormat[0] = 0x42
	for _, parts := range [][][]byte{
		{[]byte("garbage")},
		{{}},
		{badFormat},
		{valid[:len(valid)-1]},
		{append(append([]byte(nil), valid...), 0)},
		{valid, valid}, // two payload frames
		{[]byte("x"), []byte("y"), []byte("z")},
		{valid},
	} {
		if err := raw.SendMessage(parts); err != nil {
			t.Fatal(err)
		}
	}
	if m := recv(t, b); m.Sender != 99 {
		t.Fatalf("got %+v, want the one valid message", m)
	}
	// The plane still works afterwards.
	if err := a.Send(endpoint(b), &Message{Command: Terminate}); err != nil {
		t.Fatal(err)
	}
	if m := recv(t, b); m.Command != Terminate {
		t.Fatalf("got %+v", m)
	}
	out := logs.String()
	if n := strings.Count(out, "level=WARN"); n != 7 {
		t.Fatalf("%d warnings, want 7:\n%s", n, out)
	}
	for _, want := range []string{"malformed", "unknown format byte", "trailing", "frames=3", "frames=4"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
}

func TestPortInUse(t *testing.T) {
	a := listen(t, 0, nil)
	_, err := Listen(Config{BindHost: "127.0.0.1", Port: a.Port(), Logger: quietLogger()})
	if err == nil {
		t.Fatal("second bind on the same port succeeded")
	}
	want := fmt.Sprintf("control: bind tcp://127.0.0.1:%d: address already in use", a.Port())
	if err.Error() != want {
		t.Fatalf("error %q, want %q", err, want)
	}
	if !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("error %v does not match EADDRINUSE", err)
	}
}

func TestListenRejects(t *testing.T) {
	for _, cfg := range []Config{
		{BindHost: "127.0.0.1", Port: -1},
		{BindHost: "127.0.0.1", Port: 65536},
		{BindHost: "fe80::1%eth0"},
		{BindHost: "no such host"},
		{BindHost: "203.0.113.77"}, // not an address of this machine
	} {
		cfg.Logger = quietLogger()
		if p, err := Listen(cfg); err == nil {
			p.Close()
			t.Errorf("Listen(%+v) succeeded", cfg)
		} else if !strings.HasPrefix(err.Error(), "control: ") {
			t.Errorf("Listen(%+v): error %q lacks context", cfg, err)
		}
	}
}

func TestListenHostNames(t *testing.T) {
	for _, host := range []string{"localhost", "lo", ""} {
		p, err := Listen(Config{BindHost: host, Logger: quietLogger()})
		if err != nil {
			t.Errorf("Listen(%q): %v", host, err)
			continue
		}
		if err := p.Send(endpoint(p), &Message{Command: Heartbeat}); err != nil {
			t.Fatal(err)
		}
		recv(t, p)
		p.Close()
	}
}

func TestSendRejects(t *testing.T) {
	a := listen(t, 0, nil)
	ok := &Message{Command: Heartbeat}
	for _, ep := range []string{"", "127.0.0.1:9000", "udp://127.0.0.1:9000", "tcp://127.0.0.1", "tcp://:9000", "tcp://127.0.0.1:0", "tcp://127.0.0.1:99999", "tcp://h%d:1"} {
		if err := a.Send(ep, ok); err == nil {
			t.Errorf("Send(%q) accepted", ep)
		}
	}
	if err := a.Send(endpoint(a), &Message{}); err == nil || !strings.Contains(err.Error(), "unknown command") {
		t.Errorf("Send of an invalid message: %v", err)
	}
	// A plane can talk to itself.
	if err := a.Send(endpoint(a), ok); err != nil {
		t.Fatal(err)
	}
	if m := recv(t, a); m.Command != Heartbeat {
		t.Fatalf("got %+v", m)
	}
}

func TestClose(t *testing.T) {
	base := runtime.NumGoroutine()
	a, err := Listen(Config{BindHost: "127.0.0.1", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	b := listen(t, 0, nil)
	if err := a.Send(endpoint(b), &Message{Command: Heartbeat}); err != nil {
		t.Fatal(err)
	}
	recv(t, b)
	if err := b.Send(endpoint(a), &Message{Command: HeartbeatAck}); err != nil {
		t.Fatal(err)
	}
	recv(t, a)
	for range 3 {
		if err := a.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
	}
	if _, ok := <-a.Incoming(); ok {
		t.Fatal("Incoming still open after Close")
	}
	if err := a.Send(endpoint(b), &Message{Command: Heartbeat}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Send after Close: %v", err)
	}
	// Closing a does not disturb b, and its port is free again.
	if err := b.Send(endpoint(b), &Message{Command: Heartbeat}); err != nil {
		t.Fatal(err)
	}
	recv(t, b)
	b.Close()
	waitGoroutines(t, base)
}

// Messages queued just before Close still go out.
func TestCloseFlushes(t *testing.T) {
	b := listen(t, 0, nil)
	a, err := Listen(Config{BindHost: "127.0.0.1", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	const n = 1000
	for i := range n {
		if err := a.Send(endpoint(b), &Message{Command: Barrier, Seq: uint64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if m := recv(t, b); m.Seq != uint64(i) {
			t.Fatalf("got seq %d, want %d", m.Seq, i)
		}
	}
}

// A consumer that never reads must not make Close hang.
func TestCloseWithStuckConsumer(t *testing.T) {
	base := runtime.NumGoroutine()
	a := listen(t, 0, nil)
	b, err := Listen(Config{BindHost: "127.0.0.1", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	for i := range incomingBuffer + 500 {
		if err := a.Send(endpoint(b), &Message{Command: Heartbeat, Seq: uint64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	// Wait until b's loop is blocked on the full channel.
	deadline := time.Now().Add(waitTime)
	for len(b.Incoming()) < incomingBuffer {
		if time.Now().After(deadline) {
			t.Fatalf("only %d messages buffered", len(b.Incoming()))
		}
		time.Sleep(time.Millisecond)
	}
	closed := make(chan error, 1)
	go func() { closed <- b.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(waitTime):
		t.Fatal("Close hangs while the consumer is stuck")
	}
	n := 0
	for range b.Incoming() {
		n++
	}
	if n != incomingBuffer {
		t.Fatalf("drained %d messages, want %d", n, incomingBuffer)
	}
	a.Close()
	waitGoroutines(t, base)
}

// Planes created and closed back to back, and several at once, catch races
// in socket creation and in czmq's lazy initialisation.
func TestManyPlanes(t *testing.T) {
	base := runtime.NumGoroutine()
	peer, err := Listen(Config{BindHost: "127.0.0.1", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		p, err := Listen(Config{BindHost: "127.0.0.1", Logger: quietLogger()})
		if err != nil {
			t.Fatalf("plane %d: %v", i, err)
		}
		if err := p.Send(endpoint(peer), &Message{Command: Heartbeat, Seq: uint64(i)}); err != nil {
			t.Fatal(err)
		}
		if m := recv(t, peer); m.Seq != uint64(i) {
			t.Fatalf("got %+v", m)
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			p, err := Listen(Config{BindHost: "127.0.0.1", Logger: quietLogger()})
			if err != nil {
				t.Errorf("concurrent plane %d: %v", i, err)
				return
			}
			defer p.Close()
			if err := p.Send(endpoint(peer), &Message{Command: Heartbeat, Seq: 100 + uint64(i)}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	for range 8 {
		recv(t, peer)
	}
	peer.Close()
	waitGoroutines(t, base)
}

func TestIPv6Loopback(t *testing.T) {
	if l, err := net.Listen("tcp", "[::1]:0"); err != nil {
		t.Skip("no IPv6 loopback:", err)
	} else {
		l.Close()
	}
	a, err := Listen(Config{BindHost: "::1", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ep := "tcp://[::1]:" + strconv.Itoa(a.Port())
	if err := a.Send(ep, &Message{Command: Heartbeat, Seq: 6}); err != nil {
		t.Fatal(err)
	}
	if m := recv(t, a); m.Seq != 6 {
		t.Fatalf("got %+v", m)
	}
}

// BenchmarkLatency measures one message's trip from Send on one plane to
// Incoming on another, one message in flight at a time.
func BenchmarkLatency(b *testing.B) {
	src, dst := listen(b, 0, nil), listen(b, 0, nil)
	to := endpoint(dst)
	m := &Message{Command: Heartbeat, Sender: node.WorkerID(0)}
	// Warm up: the first message also connects.
	if err := src.Send(to, m); err != nil {
		b.Fatal(err)
	}
	recv(b, dst)
	for b.Loop() {
		if err := src.Send(to, m); err != nil {
			b.Fatal(err)
		}
		<-dst.Incoming()
	}
}

// BenchmarkPingPong measures a request and its answer (two one-way trips),
// without a secret and with CURVE.
func BenchmarkPingPong(b *testing.B) {
	for _, mode := range []struct{ name, secret string }{{"plain", ""}, {"curve", testSecret}} {
		b.Run(mode.name, func(b *testing.B) { benchPingPong(b, mode.secret) })
	}
}

func benchPingPong(b *testing.B, secret string) {
	x, y := listenSecret(b, secret, nil), listenSecret(b, secret, nil)
	toX, toY := endpoint(x), endpoint(y)
	ping := &Message{Command: Heartbeat}
	pong := &Message{Command: HeartbeatAck}
	done := answer(y, toX, pong)
	for b.Loop() {
		if err := x.Send(toY, ping); err != nil {
			b.Fatal(err)
		}
		<-x.Incoming()
	}
	y.Close()
	<-done
}

// answer has p send reply to to for every message it receives, until its
// Incoming closes or a send fails; the channel closes then.
func answer(p *Plane, to string, reply *Message) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range p.Incoming() {
			if p.Send(to, reply) != nil {
				return
			}
		}
	}()
	return done
}

// BenchmarkConnect measures start-up: two planes listen and exchange a
// first message each way (connect, handshake, delivery), without a secret
// and with CURVE.
func BenchmarkConnect(b *testing.B) {
	for _, mode := range []struct{ name, secret string }{{"plain", ""}, {"curve", testSecret}} {
		b.Run(mode.name, func(b *testing.B) {
			for b.Loop() {
				x, err := Listen(Config{BindHost: "127.0.0.1", Logger: quietLogger(), Secret: mode.secret})
				if err != nil {
					b.Fatal(err)
				}
				y, err := Listen(Config{BindHost: "127.0.0.1", Logger: quietLogger(), Secret: mode.secret})
				if err != nil {
					b.Fatal(err)
				}
				_ = x.Send(endpoint(y), &Message{Command: Heartbeat})
				recv(b, y)
				_ = y.Send(endpoint(x), &Message{Command: HeartbeatAck})
				recv(b, x)
				x.Close()
				y.Close()
			}
		})
	}
}

// BenchmarkLatencyRawZMQ is the baseline for BenchmarkLatency: a bare
// goczmq DEALER to ROUTER trip over the same loopback TCP, on one thread,
// with no plane, codec, queue or channel in the way.
func BenchmarkLatencyRawZMQ(b *testing.B) {
	listen(b, 0, nil) // initialises czmq the way the planes do
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	router, err := goczmq.NewRouter("tcp://127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer router.Destroy()
	dealer, err := goczmq.NewDealer(router.LastEndpoint())
	if err != nil {
		b.Fatal(err)
	}
	defer dealer.Destroy()
	payload := mustMarshal(b, &Message{Command: Heartbeat, Sender: node.WorkerID(0)})
	for b.Loop() {
		if err := dealer.SendFrame(payload, goczmq.FlagNone); err != nil {
			b.Fatal(err)
		}
		// [identity, payload]; a blocking receive here is regularly cut
		// short by the Go runtime's signals (EINTR), exactly as the plane
		// expects, so retry those.
		for frames := 0; frames < 2; {
			_, _, err := router.RecvFrame()
			if err == nil {
				frames++
			} else if e := zmqErrno(); e != syscall.EINTR {
				b.Fatal(zmqError(e))
			}
		}
	}
}

// TestRoundReadsOnlyReadableSockets drives a loop by hand: once a peer's
// connection is up, a round that delivers one of its messages reads the
// ROUTER (two frames and the EAGAIN that ends the drain) and neither the
// monitor nor the wake-up eventfd, which its poll found idle; a Send
// costs the next round one eventfd read.
func TestRoundReadsOnlyReadableSockets(t *testing.T) {
	runtime.LockOSThread() // the loop's sockets belong to this thread
	defer runtime.UnlockOSThread()
	p := &Plane{
		log: quietLogger(), reject: NewRejecter(quietLogger(), nil),
		in: make(chan *Message, incomingBuffer), stop: make(chan struct{}), done: make(chan struct{}),
		wakeFD: -1,
	}
	l, err := p.open("127.0.0.1", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer l.destroy()
	src := listen(t, 0, nil)
	to := "tcp://127.0.0.1:" + strconv.Itoa(p.port)
	deliver := func() {
		t.Helper()
		if err := src.Send(to, &Message{Command: Heartbeat}); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(waitTime); len(p.in) == 0; {
			if time.Now().After(deadline) {
				t.Fatal("no message arrived")
			}
			l.round(100 * time.Millisecond)
		}
		<-p.in
	}
	deliver() // connects; the monitor reports the connection
	l.sweep = true
	l.round(0) // drains what the monitor still holds
	l.stats = loopStats{}
	deliver()
	if got := l.stats; got.monReads != 0 || got.wakeReads != 0 || got.routerReads < 3 {
		t.Errorf("delivering one message: %+v, want 0 monitor and 0 eventfd reads, 3+ ROUTER reads", got)
	}
	l.stats = loopStats{}
	if err := p.Send(endpoint(src), &Message{Command: HeartbeatAck}); err != nil {
		t.Fatal(err)
	}
	l.round(waitTime)
	if got := l.stats; got.wakeReads != 1 || got.monReads != 0 {
		t.Errorf("a round after Send: %+v, want 1 eventfd read and 0 monitor reads", got)
	}
	recv(t, src)
}
