package cluster_test

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fptps/fpt/cluster"
	"github.com/fptps/fpt/control"
	"github.com/fptps/fpt/control/memplane"
	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/van"
	"github.com/fptps/fpt/worker"
)

// stuckHandler stops its van's receiver (and so its reading) at the first
// frame until release is closed.
type stuckHandler struct {
	nopHandler
	release <-chan struct{}
}

func (h stuckHandler) HandleFrame(*frame.Header, []byte, bool) { <-h.release }

// A failed member closes at once although a peer stopped reading with
// its send pool full: a draining close would wait the van's IOTimeout
// (30 s) first, and CI saw nodes of a failed job outlive their test that
// way. Also as a worker's role (worker.Start), whose watch closes the
// data plane as soon as the node fails.
func TestFailedMemberClosesWithoutDraining(t *testing.T) {
	for _, tc := range []struct {
		name  string
		start func(ctx context.Context, m *cluster.Member) error
	}{
		{"member", func(ctx context.Context, m *cluster.Member) error { return m.Start(ctx, nopHandler{}) }},
		{"worker", func(ctx context.Context, m *cluster.Member) error { _, err := worker.Start(ctx, m); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) { failedCloses(t, tc.start) })
	}
}

func failedCloses(t *testing.T, start func(ctx context.Context, m *cluster.Member) error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ctl := memplane.NewNetwork()
	planes := cluster.Planes{
		Control: func(port int, log *slog.Logger) (control.Transport, error) { return ctl.Listen(port, log) },
		Data:    func(cfg van.Config) (van.Transport, error) { return van.New("epoll", cfg) },
	}
	cfgFor, _ := startScheduler(ctx, t, ctl, nil)
	release := make(chan struct{})
	server := cluster.New(cfgFor("server"), discard(), planes)
	wm := cluster.New(cfgFor("worker"), discard(), planes)
	starts := make(chan error, 2)
	go func() { starts <- server.Start(ctx, stuckHandler{release: release}) }()
	go func() { starts <- start(ctx, wm) }()
	defer func() {
		close(release)
		server.Close()
		wm.Close()
	}()
	for range 2 {
		if err := <-starts; err != nil {
			t.Fatal(err)
		}
	}

	// 64 MiB for a server that reads one frame, more than the sockets hold.
	var done atomic.Int32
	to := server.Self().ID
	payload := make([]byte, 1<<20) // a partition's bytes, the most a push frame may carry
	const frames = 64
	for i := range frames {
		h := frame.Header{Type: frame.Push, DType: frame.Float32, Recipient: uint32(to), Key: uint64(i), Total: uint64(len(payload)), Length: uint64(len(payload))}
		if err := wm.Van().Send(&frame.Message{Header: h, Payload: payload, Done: func(error) { done.Add(1) }}); err != nil {
			t.Fatal(err)
		}
	}
	wm.Fail(errors.New("test: the worker fails"))
	time.Sleep(50 * time.Millisecond) // a worker's watch wakes on the failure, and closes the van
	closed := make(chan struct{})
	go func() {
		wm.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(20 * time.Second):
		t.Fatal("a failed worker's Close still waits after 20 s for a server that does not read")
	}
	if done.Load() != frames {
		t.Fatalf("%d of %d frames' Done called after Close", done.Load(), frames)
	}
}
