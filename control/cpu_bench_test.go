package control

import (
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/zeromq/goczmq"

	"github.com/fptps/fpt/node"
)

// cpuSpacing is the gap between the messages of a spaced stream: a small
// step's reports and grants, each arriving at a loop that went idle.
const cpuSpacing = 500 * time.Microsecond

// processCPU is the CPU time of the whole process so far (user and system,
// every thread: both planes' loops, their consumers and libzmq's I/O
// threads), which is what the control plane takes from a node's data path.
func processCPU(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// measureCPU runs body (which moves n messages and returns once they are
// all delivered) and reports the process's CPU per message as cpu-us/msg.
func measureCPU(b *testing.B, n int, body func()) {
	b.ResetTimer()
	start := processCPU(b)
	body()
	used := processCPU(b) - start
	b.StopTimer()
	b.ReportMetric(float64(used.Microseconds())/float64(n), "cpu-us/msg")
}

// BenchmarkCPUPerMessage measures the CPU a control message costs, both
// ends together (two planes in one process), next to bare ZeroMQ moving
// the same payload over the same loopback TCP: spaced is a one-way stream
// with a message every cpuSpacing, burst the same back to back, pingpong
// a request and its answer (counted as two messages).
func BenchmarkCPUPerMessage(b *testing.B) {
	for _, c := range []struct {
		name string
		run  func(*testing.B)
	}{
		{"spaced/plane", func(b *testing.B) { benchPlaneStream(b, cpuSpacing) }},
		{"spaced/raw", func(b *testing.B) { benchRawStream(b, cpuSpacing) }},
		{"burst/plane", func(b *testing.B) { benchPlaneStream(b, 0) }},
		{"burst/raw", func(b *testing.B) { benchRawStream(b, 0) }},
		{"pingpong/plane", benchPlanePingPongCPU},
		{"pingpong/raw", benchRawPingPongCPU},
	} {
		b.Run(c.name, c.run)
	}
}

// paced sends n messages through send, the i-th not before start+i*gap.
func paced(n int, gap time.Duration, send func()) {
	start := time.Now()
	for i := range n {
		if gap > 0 {
			if d := time.Until(start.Add(time.Duration(i) * gap)); d > 0 {
				time.Sleep(d)
			}
		}
		send()
	}
}

func benchPlaneStream(b *testing.B, gap time.Duration) {
	src, dst := listen(b, 0, nil), listen(b, 0, nil)
	to := endpoint(dst)
	m := &Message{Command: Heartbeat, Sender: node.WorkerID(0)}
	if err := src.Send(to, m); err != nil { // connects
		b.Fatal(err)
	}
	recv(b, dst)
	n := b.N
	measureCPU(b, n, func() {
		done := make(chan struct{})
		go func() {
			defer close(done)
			for range n {
				<-dst.Incoming()
			}
		}()
		paced(n, gap, func() {
			if err := src.Send(to, m); err != nil {
				b.Error(err)
			}
		})
		<-done
	})
}

// rawPair is a bare goczmq DEALER connected to a ROUTER on loopback TCP,
// past its first message.
func rawPair(b *testing.B) (router, dealer *goczmq.Sock, payload []byte) {
	listen(b, 0, nil) // initialises czmq the way the planes do
	router, err := goczmq.NewRouter("tcp://127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(router.Destroy)
	dealer, err = goczmq.NewDealer(router.LastEndpoint())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(dealer.Destroy)
	payload = mustMarshal(b, &Message{Command: Heartbeat, Sender: node.WorkerID(0)})
	runtime.LockOSThread() // errno is per thread
	defer runtime.UnlockOSThread()
	rawSend(b, dealer, nil, payload)
	rawRecv(b, router, 2)
	return router, dealer, payload
}

// rawRecv reads one message of frames frames, blocking, and returns its
// first frame. The Go runtime's signals cut blocking calls short (EINTR):
// those are retried, as the plane does.
func rawRecv(b *testing.B, s *goczmq.Sock, frames int) []byte {
	var first []byte
	for got := 0; got < frames; {
		f, _, err := s.RecvFrame()
		if err == nil {
			if got == 0 {
				first = f
			}
			got++
		} else if e := zmqErrno(); e != syscall.EINTR {
			b.Error(zmqError(e))
			return nil
		}
	}
	return first
}

// rawSend sends [id,] payload, blocking, retrying EINTR.
func rawSend(b *testing.B, s *goczmq.Sock, id, payload []byte) {
	if id != nil {
		for s.SendFrame(id, goczmq.FlagMore) != nil {
			if e := zmqErrno(); e != syscall.EINTR {
				b.Error(zmqError(e))
				return
			}
		}
	}
	for s.SendFrame(payload, goczmq.FlagNone) != nil {
		if e := zmqErrno(); e != syscall.EINTR {
			b.Error(zmqError(e))
			return
		}
	}
}

func benchRawStream(b *testing.B, gap time.Duration) {
	router, dealer, payload := rawPair(b)
	n := b.N
	measureCPU(b, n, func() {
		done := make(chan struct{})
		go func() {
			defer close(done)
			runtime.LockOSThread() // errno is per thread
			defer runtime.UnlockOSThread()
			for range n {
				rawRecv(b, router, 2)
			}
		}()
		runtime.LockOSThread()
		paced(n, gap, func() { rawSend(b, dealer, nil, payload) })
		runtime.UnlockOSThread()
		<-done
	})
}

func benchPlanePingPongCPU(b *testing.B) {
	x, y := listen(b, 0, nil), listen(b, 0, nil)
	toX, toY := endpoint(x), endpoint(y)
	ping := &Message{Command: Heartbeat}
	pong := &Message{Command: HeartbeatAck}
	done := answer(y, toX, pong)
	if err := x.Send(toY, ping); err != nil { // connects both ways
		b.Fatal(err)
	}
	recv(b, x)
	n := b.N
	measureCPU(b, 2*n, func() {
		for range n {
			if err := x.Send(toY, ping); err != nil {
				b.Fatal(err)
			}
			<-x.Incoming()
		}
	})
	y.Close()
	<-done
}

func benchRawPingPongCPU(b *testing.B) {
	router, dealer, payload := rawPair(b)
	n := b.N
	measureCPU(b, 2*n, func() {
		done := make(chan struct{})
		go func() {
			defer close(done)
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			for range n {
				id := rawRecv(b, router, 2)
				rawSend(b, router, id, payload)
			}
		}()
		runtime.LockOSThread()
		for range n {
			rawSend(b, dealer, nil, payload)
			rawRecv(b, dealer, 1)
		}
		runtime.UnlockOSThread()
		<-done
	})
}
