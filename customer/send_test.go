package customer_test

import (
	"bytes"
	"errors"
	"log/slog"
	"testing"
	"unsafe"

	"github.com/fptps/fpt/appmsg"
	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/customer"
	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/van"
)

// fakeNode is a worker whose van hands each frame it is sent to sent.
type fakeNode struct {
	done, closed chan struct{}
	van          *fakeVan
}

func newFakeNode() *fakeNode {
	return &fakeNode{done: make(chan struct{}), closed: make(chan struct{}), van: &fakeVan{sent: make(chan *frame.Message, 1)}}
}

func (n *fakeNode) Self() node.Info { return node.Info{ID: w0, Role: node.Worker} }
func (n *fakeNode) Info(id node.ID) (node.Info, bool) {
	r, ok := id.Role()
	return node.Info{ID: id, Role: r}, ok
}
func (n *fakeNode) Config() config.Config {
	return config.Config{MaxFrameBytes: config.DefaultMaxFrameBytes}
}
func (n *fakeNode) Logger() *slog.Logger    { return slog.New(slog.DiscardHandler) }
func (n *fakeNode) Van() van.Transport      { return n.van }
func (n *fakeNode) Done() <-chan struct{}   { return n.done }
func (n *fakeNode) Closed() <-chan struct{} { return n.closed }
func (n *fakeNode) Err() error              { return nil }
func (n *fakeNode) Fail(error)              {}

// fakeVan implements Send only.
type fakeVan struct {
	van.Transport
	sent chan *frame.Message
}

func (v *fakeVan) Send(m *frame.Message) error {
	v.sent <- m
	return nil
}

// Send gathers: the segments go to the van as the frame's More, the
// caller's own memory behind the encoded head (no copy), and Send returns
// only once the van is done with them (Done), with Done's error.
func TestSendGathers(t *testing.T) {
	n := newFakeNode()
	set := customer.New(n)
	defer set.Close()
	keys, vals := []byte{1, 2, 3, 4, 5, 6, 7, 8}, bytes.Repeat([]byte{7}, 1<<20)
	segs := [][]byte{keys, vals}
	meta := appmsg.Meta{App: 3, Customer: 1, Timestamp: 9, Recipient: uint32(s0), Flags: appmsg.Request | appmsg.Push}
	for _, tc := range []struct {
		name    string
		written error // what the van's Done reports
	}{
		{"written", nil},
		{"not written", errors.New("the peer is gone")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := make(chan error, 1)
			go func() { res <- set.Send(&meta, segs) }()
			m := <-n.van.sent
			if len(m.More) != len(segs) {
				t.Fatalf("the frame has %d more parts, want the %d segments", len(m.More), len(segs))
			}
			for i := range segs {
				if unsafe.SliceData(m.More[i]) != unsafe.SliceData(segs[i]) || len(m.More[i]) != len(segs[i]) {
					t.Fatalf("part %d is a copy, not the caller's segment", i)
				}
			}
			var whole []byte
			whole = append(whole, m.Payload...)
			for _, p := range m.More {
				whole = append(whole, p...)
			}
			if got, want := m.Len(), len(whole); uint64(got) != appmsg.Size(segs) || got != want {
				t.Fatalf("frame of %d bytes, want %d", got, appmsg.Size(segs))
			}
			dec, err := appmsg.Decode(whole)
			if err != nil {
				t.Fatal(err)
			}
			if dec.Meta.App != meta.App || dec.Meta.Timestamp != meta.Timestamp || !bytes.Equal(dec.Segments[1], vals) {
				t.Fatalf("decoded %+v, want the message sent", dec.Meta)
			}
			m.Done(tc.written)
			err = <-res
			if (err == nil) != (tc.written == nil) {
				t.Fatalf("Send returned %v after Done(%v)", err, tc.written)
			}
		})
	}
}
