package van_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/van"
	"github.com/fptps/fpt/van/internal/wiretest"
	"github.com/fptps/fpt/van/vantest"
)

// gateCollector is a vantest.Collector whose first frame waits for open
// to be closed: the receiver stops reading meanwhile, so what the peer
// sends queues up in the socket.
type gateCollector struct {
	*vantest.Collector
	open chan struct{}
	once sync.Once
}

func (g *gateCollector) HandleFrame(h *frame.Header, p []byte, inPlace bool) {
	g.once.Do(func() { <-g.open })
	g.Collector.HandleFrame(h, p, inPlace)
}

// TestEpollReadsPerFrame: frames queued up in the socket cost the epoll van
// about one read each, the payload's read bringing in the next header,
// where reading each header on its own takes two reads per frame.
func TestEpollReadsPerFrame(t *testing.T) {
	const frames, size = 64, 1000 // 68 KB in all: within the socket's buffers
	a, _ := newVan(t, van.KindEpoll, 8, nil)
	g := &gateCollector{Collector: vantest.NewCollector(), open: make(chan struct{})}
	b, _ := newVan(t, van.KindEpoll, 9, func(c *van.Config) { c.Handler = g })
	vantest.Connect(t, a, 8, b, 9)
	for i := range frames {
		p := make([]byte, size)
		wiretest.Fill(p, uint64(i))
		if err := a.Send(&frame.Message{Header: wiretest.PushHeader(8, 9, uint64(i), size), Payload: p}); err != nil {
			t.Fatal(err)
		}
	}
	// Every frame is in the socket (the Hello, then the data frames),
	// and the receiver has read at most the first two.
	vantest.Eventually(t, func() error {
		if st := a.Stats(); len(st) != 1 || st[0].SentFrames != frames+1 {
			return fmt.Errorf("sender's stats %+v, want %d frames written", st, frames+1)
		}
		return nil
	})
	close(g.open)
	for i, f := range g.WaitFrames(t, frames) {
		if at := wiretest.Check(f.Payload, uint64(i)); at >= 0 || len(f.Payload) != size {
			t.Fatalf("frame %d: %d bytes, content differs at byte %d", i, len(f.Payload), at)
		}
	}
	st := b.Stats()
	if len(st) != 1 {
		t.Fatalf("receiver's stats %+v", st)
	}
	// One read per frame and a few for how the bytes arrived before the
	// gate; reading headers apart would take 2*frames.
	t.Logf("%d reads for %d frames", st[0].ReadCalls, frames)
	if limit := uint64(frames + frames/4); st[0].ReadCalls > limit || st[0].ReadCalls == 0 {
		t.Errorf("%d reads for %d frames, want at most %d", st[0].ReadCalls, frames, limit)
	}
}
