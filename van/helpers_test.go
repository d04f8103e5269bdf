package van_test

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/van"
	"github.com/fptps/fpt/van/internal/wiretest"
	"github.com/fptps/fpt/van/vantest"
)

var kinds = []string{van.KindEpoll, van.KindNetConn}

// forKinds runs f as a subtest per kind of van.
func forKinds(t *testing.T, f func(t *testing.T, kind string)) {
	for _, k := range kinds {
		t.Run(k, func(t *testing.T) { f(t, k) })
	}
}

// listen starts vans of one kind.
func listen(kind string) vantest.Listen {
	return func(cfg van.Config) (van.Transport, error) { return van.New(kind, cfg) }
}

// newVan starts a van of the kind on a free loopback port (see
// vantest.NewVan); mod may adjust the config.
func newVan(t testing.TB, kind string, self node.ID, mod func(*van.Config)) (van.Transport, *vantest.Collector) {
	t.Helper()
	return vantest.NewVan(t, listen(kind), self, mod)
}

// rawPeer connects a plain socket to addr and, if from != 0, says Hello.
func rawPeer(t testing.TB, addr string, from, to node.ID) *net.TCPConn {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	if from != 0 {
		if _, err := nc.Write(wiretest.Encode(frame.Header{Type: frame.Hello, Sender: uint32(from), Recipient: uint32(to)}, nil)); err != nil {
			t.Fatal(err)
		}
	}
	return nc.(*net.TCPConn)
}

// waitClosed reads from nc until the van closes it.
func waitClosed(t testing.TB, nc net.Conn) {
	t.Helper()
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := io.Copy(io.Discard, nc)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("the van did not close the connection")
	}
}
