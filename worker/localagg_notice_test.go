package worker

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/fptps/fpt/localagg"
	"github.com/fptps/fpt/node"
	"golang.org/x/sys/unix"
)

// noticeLeader is the leader's side of a group of n workers (its notice
// socket listening, its writer not started) and its members' sockets,
// listening, for the tests of notices; name tells their addresses apart.
func noticeLeader(t *testing.T, name string, n int) (*localAgg, []*net.UnixConn) {
	t.Helper()
	var workers []node.ID
	var addrs []*net.UnixAddr
	for i := range n {
		workers = append(workers, node.WorkerID(i))
		addrs = append(addrs, &net.UnixAddr{Name: fmt.Sprintf("@fpt-lagg-test-%s-%d-%d-%s", name, os.Getpid(), time.Now().UnixNano(), workers[i]), Net: "unixgram"})
	}
	var members []*net.UnixConn
	for _, a := range addrs[1:] {
		c, err := net.ListenUnixgram("unixgram", a)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		members = append(members, c)
	}
	l := &localAgg{log: slog.New(slog.NewTextHandler(io.Discard, nil)), self: workers[0], group: localagg.Group{Host: "a", Workers: workers},
		addrs: addrs, fail: func(err error) { t.Errorf("failed: %v", err) }}
	l.initConds()
	var err error
	if l.conn, err = net.ListenUnixgram("unixgram", addrs[0]); err != nil {
		t.Fatal(err)
	}
	return l, members
}

// readNotices is the notices of the next datagram c reads.
func readNotices(t *testing.T, c *net.UnixConn) [][]byte {
	t.Helper()
	buf := make([]byte, noticeLen*noticesPerDatagram)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := splitNotices(buf[:n])
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

// notice is a notice of kind to member to, about chunk.
func notice(to int, kind byte, chunk int) outNotice {
	n := outNotice{to: to}
	n.b[0], n.b[3] = kind, byte(chunk)
	return n
}

func TestPackNotices(t *testing.T) {
	many := make([]outNotice, noticesPerDatagram+2)
	for i := range many {
		many[i] = notice(1, noticeContrib, i%localChunks)
	}
	for _, tt := range []struct {
		name string
		out  []outNotice
		// want lists each datagram's member and notices (by index in out).
		want [][]int
	}{
		{"none", nil, nil},
		{"one", []outNotice{notice(1, noticeResult, 0)}, [][]int{{1, 0}}},
		{"one member's, in one datagram", []outNotice{notice(2, noticeConsumed, 3), notice(2, noticeResult, 4), notice(2, noticeConsumed, 5)},
			[][]int{{2, 0, 1, 2}}},
		{"each member's in order", []outNotice{notice(1, noticeResult, 0), notice(2, noticeResult, 0), notice(1, noticeConsumed, 7), notice(3, noticeResult, 0), notice(2, noticeConsumed, 1)},
			[][]int{{1, 0, 2}, {2, 1, 4}, {3, 3}}},
		{"at most noticesPerDatagram to a datagram", many, func() [][]int {
			full := []int{1}
			for i := range noticesPerDatagram {
				full = append(full, i)
			}
			return [][]int{full, {1, noticesPerDatagram, noticesPerDatagram + 1}}
		}()},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// Packed afresh, and into the storage of an earlier batch's
			// datagrams (the writer's), which must not show through.
			for _, into := range []string{"fresh", "reused"} {
				var ds []datagram
				if into == "reused" {
					ds = packNotices(nil, slices.Concat(many, []outNotice{notice(2, noticeHostSum, 1), notice(3, noticeRead, 2)}))
				}
				got := packNotices(ds, tt.out)
				if len(got) != len(tt.want) {
					t.Fatalf("%s: %d datagrams, want %d", into, len(got), len(tt.want))
				}
				for i, w := range tt.want {
					var b []byte
					for _, j := range w[1:] {
						b = append(b, tt.out[j].b[:]...)
					}
					if got[i].to != w[0] || !bytes.Equal(got[i].b, b) {
						t.Errorf("%s: datagram %d: to %d, %d bytes; want to %d, notices %v", into, i, got[i].to, len(got[i].b), w[0], w[1:])
					}
					ns, err := splitNotices(got[i].b)
					if err != nil || len(ns) != len(w)-1 {
						t.Errorf("%s: datagram %d splits into %d notices, %v; want %d", into, i, len(ns), err, len(w)-1)
					}
				}
			}
		})
	}
}

// The writer packs every batch into the storage of the one before: once
// that holds as many datagrams, packing allocates nothing.
func TestPackNoticesAllocatesNothingOnceWarm(t *testing.T) {
	out := []outNotice{notice(1, noticeResult, 0), notice(2, noticeResult, 0), notice(1, noticeConsumed, 7), notice(3, noticeHostSum, 2)}
	ds := packNotices(nil, out)
	if n := testing.AllocsPerRun(100, func() { ds = packNotices(ds, out) }); n != 0 {
		t.Errorf("%v allocations per batch, want 0", n)
	}
}

func TestSplitNoticesRefusesTornDatagrams(t *testing.T) {
	for _, n := range []int{0, 1, noticeLen - 1, noticeLen + 1, 3*noticeLen - 7} {
		if _, err := splitNotices(make([]byte, n)); err == nil {
			t.Errorf("a %d-byte datagram split without an error", n)
		}
	}
}

// TestLocalNoticesPacked: the notices to a member that queue up while the
// writer is busy reach it in one datagram, not one each (every datagram
// costs both sides a system call and a wake-up, and a member's socket
// queues only a few), in the order queued.
func TestLocalNoticesPacked(t *testing.T) {
	const queued = 5
	l, members := noticeLeader(t, "packed", 2)
	member := members[0]
	// Queued while earlier ones go out.
	l.sending = true
	for c := range queued {
		if err := l.notify(1, noticeConsumed, c, nil); err != nil {
			t.Fatal(err)
		}
	}
	l.sending = false
	l.socks.Add(1)
	go l.writer()

	if err := member.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	ns := readNotices(t, member)
	if len(ns) != queued {
		t.Fatalf("the first datagram carried %d notices, want all %d queued", len(ns), queued)
	}
	for c, b := range ns {
		if b[0] != noticeConsumed || int(b[3]) != c {
			t.Errorf("notice %d: kind %d chunk %d, want kind %d chunk %d", c, b[0], b[3], noticeConsumed, c)
		}
	}
	l.close() // the writer is out: its count is final
	if l.datagrams != 1 {
		t.Errorf("the writer counted %d datagrams, want 1", l.datagrams)
	}
}

// TestLocalWriterWaitsForAFullMember: the writer sends over a socket
// connected to each member, so while a member that reads nothing has its
// queue full the writer waits for room there and is not woken to try
// again each time another member reads (from one unconnected socket it
// was, and most of its sends on a busy host failed so); close still ends
// that wait.
func TestLocalWriterWaitsForAFullMember(t *testing.T) {
	const early = 5 // datagrams member 2 reads once member 1 is full
	l, members := noticeLeader(t, "full", 3)
	l.socks.Add(1)
	go l.writer()
	// sendOne queues a notice to member m and reports whether the writer
	// sent it (it did not within a while: it waits for room).
	sendOne := func(m int) bool {
		l.mu.Lock()
		before := l.datagrams
		l.mu.Unlock()
		if err := l.notify(m, noticeConsumed, 0, nil); err != nil {
			t.Fatal(err)
		}
		for range 200 {
			l.mu.Lock()
			sent := l.datagrams
			l.mu.Unlock()
			if sent > before {
				return true
			}
			time.Sleep(time.Millisecond)
		}
		return false
	}
	for range early {
		if !sendOne(2) {
			t.Fatal("a notice to member 2 was not sent")
		}
	}
	filled := false
	for range 1000 {
		if !sendOne(1) {
			filled = true
			break
		}
	}
	if !filled {
		t.Fatal("member 1's queue never filled")
	}
	buf := make([]byte, noticeLen*noticesPerDatagram)
	for range early {
		if _, err := members[1].Read(buf); err != nil {
			t.Fatal(err)
		}
	}
	// Woken by member 2's reads, an unconnected writer tries member 1
	// again (and finds it full) soon after.
	time.Sleep(200 * time.Millisecond)
	l.mu.Lock()
	full := l.sendFull
	l.mu.Unlock()
	if full != 1 {
		t.Errorf("%d sends found member 1's queue full, want 1 (the one waiting for room)", full)
	}
	closed := make(chan struct{})
	go func() {
		l.close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("close did not end the writer waiting on a full member's queue")
	}
}

// TestLocalNoticeSentByItsCaller: with nothing queued or going out, a
// notice leaves from notify itself, with no writer running; once the
// member's queue is full, notices wait for the writer, and every one
// reaches the member once, in the order made.
func TestLocalNoticeSentByItsCaller(t *testing.T) {
	l, members := noticeLeader(t, "direct", 2)
	member := members[0]
	if err := member.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	var got []int // the chunks of the notices read, in order
	read := func() {
		for _, b := range readNotices(t, member) {
			got = append(got, int(b[3]))
		}
	}

	if err := l.notify(1, noticeConsumed, 0, nil); err != nil {
		t.Fatal(err)
	}
	read()
	if !slices.Equal(got, []int{0}) || l.datagrams != 1 || len(l.outbox) != 0 {
		t.Fatalf("read %v, %d datagrams sent, %d queued; want notice 0 sent by notify", got, l.datagrams, len(l.outbox))
	}

	// Fill the member's queue from notify alone; the notices after the
	// first that did not fit queue behind it.
	const made = 40
	for c := 1; c < made; c++ {
		if err := l.notify(1, noticeConsumed, c%localChunks, nil); err != nil {
			t.Fatal(err)
		}
	}
	direct := l.datagrams - 1
	if len(l.outbox) == 0 {
		t.Fatalf("all %d notices went out at once; the member's queue never filled", made-1)
	}
	l.socks.Add(1)
	go l.writer()
	for len(got) < made {
		read()
	}
	l.close()
	want := make([]int, made)
	for c := range want {
		want[c] = c % localChunks
	}
	if !slices.Equal(got, want) {
		t.Fatalf("read %v, want %v", got, want)
	}
	t.Logf("%d notices sent by notify, the rest by the writer", direct)
}

// TestLocalFlushLeavesTheRestToWriter: what the notice loop held goes out
// packed where each member's queue has room; a member whose queue is full
// has its notices left to the writer, in the order made, and they reach
// it once it reads.
func TestLocalFlushLeavesTheRestToWriter(t *testing.T) {
	l, members := noticeLeader(t, "flush", 3)
	for _, m := range members {
		if err := m.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	// Member 1's queue full.
	fd, err := l.sockets.to(1, l.addrs[1])
	if err != nil {
		t.Fatal(err)
	}
	filler := notice(1, noticeConsumed, 15)
	fill := 0
	for ; ; fill++ {
		if _, err := unix.Write(fd, filler.b[:]); err != nil {
			break
		}
	}
	if !l.hold() {
		t.Fatal("hold: nothing was going out, yet the loop did not hold the notices")
	}
	for _, n := range []struct{ to, chunk int }{{2, 0}, {1, 1}, {2, 2}, {1, 3}} {
		if err := l.notify(n.to, noticeConsumed, n.chunk, nil); err != nil {
			t.Fatal(err)
		}
	}
	if l.datagrams != 0 || len(l.outbox) != 4 {
		t.Fatalf("%d datagrams sent, %d notices queued while held; want 0 and 4", l.datagrams, len(l.outbox))
	}
	l.flush()
	var chunks []int
	for _, b := range readNotices(t, members[1]) {
		chunks = append(chunks, int(b[3]))
	}
	if !slices.Equal(chunks, []int{0, 2}) {
		t.Errorf("member 2 read %v in its first datagram, want [0 2]", chunks)
	}
	l.mu.Lock()
	left := slices.Clone(l.outbox)
	sending, datagrams := l.sending, l.datagrams
	l.mu.Unlock()
	if sending || datagrams != 1 || len(left) != 2 || left[0].to != 1 || left[0].b[3] != 1 || left[1].b[3] != 3 {
		t.Fatalf("after the flush: sending %v, %d datagrams sent, left %d notices; want false, 1, member 1's chunks 1 and 3", sending, datagrams, len(left))
	}
	buf := make([]byte, noticeLen*noticesPerDatagram)
	for range fill {
		if _, err := members[0].Read(buf); err != nil {
			t.Fatal(err)
		}
	}
	l.socks.Add(1)
	go l.writer()
	chunks = chunks[:0]
	for len(chunks) < 2 {
		for _, b := range readNotices(t, members[0]) {
			chunks = append(chunks, int(b[3]))
		}
	}
	l.close()
	if !slices.Equal(chunks, []int{1, 3}) {
		t.Errorf("member 1 read %v once it had room, want [1 3]", chunks)
	}
}

// TestLocalHoldAllocatesNothingOnceWarm: the notice loop's holding and
// flushing a datagram's notices reuses its buffers (a step's hot path).
// The notices are queued as post queues them while held (notice itself
// allocates one: its header's encoding escapes).
func TestLocalHoldAllocatesNothingOnceWarm(t *testing.T) {
	l, members := noticeLeader(t, "holdalloc", 2)
	if err := members[0].SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, noticeLen*noticesPerDatagram)
	ns := []outNotice{notice(1, noticeConsumed, 0), notice(1, noticeConsumed, 1)}
	round := func() {
		if !l.hold() {
			t.Fatal("hold: nothing was going out, yet the loop did not hold the notices")
		}
		l.mu.Lock()
		l.outbox = append(l.outbox, ns...)
		l.mu.Unlock()
		l.flush()
		if n, err := members[0].Read(buf); err != nil || n != 2*noticeLen {
			t.Fatalf("the member read %d bytes, %v; want both notices in one datagram", n, err)
		}
	}
	round() // warm: the buffers grow once
	if n := testing.AllocsPerRun(100, round); n != 0 {
		t.Errorf("%.1f allocations a held datagram's notices, want 0", n)
	}
}
