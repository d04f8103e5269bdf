package worker

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strings"
	"testing"

	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/localagg"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/van"
)

// testLeader is the leader's side of a group of the given workers (no
// segment or socket: arrive needs neither), whose sends go to send.
func testLeader(t *testing.T, workers []node.ID, cfg *config.Config, send func(*frame.Message) error, fail func(error)) *localAgg {
	t.Helper()
	core := declaredCore(t, workers)
	l := &localAgg{log: slog.New(slog.NewTextHandler(io.Discard, nil)), self: workers[0], group: localagg.Group{Host: "a", Workers: workers},
		fail: fail, send: send, survives: cfg.Survives, dropped: map[node.ID]bool{}, until: math.MaxUint64,
		core: core, first: map[localagg.Slot]frame.Header{}, sums: map[localagg.Slot][]byte{}, readers: map[int]readers{}}
	l.initConds()
	return l
}

// TestLocalHostSumToLostAggregator: a host sum whose aggregator is lost
// (its send fails at once, or its frame is dropped with the connection)
// is left to the retry the loss brings where the job outlives a lost
// worker (FPT_ON_WORKER_LOSS=continue or wait): the leader neither fails
// nor stops sending the others; under fail it is the leader's error,
// naming the host sum.
func TestLocalHostSumToLostAggregator(t *testing.T) {
	leader, member, lost := node.WorkerID(0), node.WorkerID(1), node.WorkerID(2)
	workers := []node.ID{leader, member, lost}
	for _, tt := range []struct {
		name   string
		loss   config.WorkerLoss
		atOnce bool // the send fails at once (no connection); else its Done gets the error
		fails  bool
	}{
		{"continue, send fails", config.WorkerLossContinue, true, false},
		{"wait, send fails", config.WorkerLossWait, true, false},
		{"wait, frame dropped", config.WorkerLossWait, false, false},
		{"fail, send fails", config.WorkerLossFail, true, true},
		{"fail, frame dropped", config.WorkerLossFail, false, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := &config.Config{WorkerLoss: tt.loss}
			var sent []frame.Header
			var failed []error
			send := func(m *frame.Message) error {
				if node.ID(m.Header.Recipient) != lost {
					sent = append(sent, m.Header)
					m.Done(nil)
					return nil
				}
				err := fmt.Errorf("van: send to node %d: %w", lost, van.ErrNoPeer)
				if tt.atOnce {
					return err
				}
				m.Done(err)
				return nil
			}
			l := testLeader(t, workers, cfg, send, func(err error) { failed = append(failed, err) })
			// Partition 0 is the lost member's to aggregate, 1 the live
			// member's; every member's contribution arrives for both.
			var errs []error
			for part, to := range []node.ID{lost, member} {
				for m := range workers {
					h := frame.Header{Type: frame.Push, DType: frame.Float32, Sender: uint32(workers[m]), Recipient: uint32(to),
						Key: 7, Iteration: 3, Partition: uint32(part), Total: 8, Length: 8}
					if err := l.arrive(m, &h, bytes.Repeat([]byte{0, 0, 128, 63}, 2)); err != nil { // 1.0, 1.0
						errs = append(errs, err)
					}
				}
			}
			all := errors.Join(append(errs, failed...)...)
			if tt.fails {
				if all == nil || !errors.Is(all, van.ErrNoPeer) || !strings.Contains(all.Error(), "host sum") {
					t.Fatalf("errors %v, want the host sum's, for lack of a connection", all)
				}
			} else if all != nil {
				t.Fatalf("the leader failed: %v", all)
			}
			// The live member's host sum is sent whatever became of the
			// lost one's.
			if len(sent) != 1 || node.ID(sent[0].Recipient) != member || sent[0].Flags&frame.FlagHostSum == 0 {
				t.Fatalf("sent %v, want the host sum of partition 1 to %s", sent, member)
			}
		})
	}
}

// declaredCore is a group core of workers, each having declared key 0.
func declaredCore(t *testing.T, workers []node.ID) *localagg.Core {
	t.Helper()
	core, err := localagg.NewCore(workers, 1<<30, localagg.LossFail)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range workers {
		if err := core.Declared(w, 0); err != nil {
			t.Fatal(err)
		}
	}
	return core
}

// handOut publishes a sum to the group before it writes the worker's own
// landing (nothing there when publish runs), and writes none where the sum
// was read in place or publishing failed.
func TestHandOutGroupFirst(t *testing.T) {
	sum := bytes.Repeat([]byte{7}, 1<<10)
	h := &frame.Header{Type: frame.Result, Key: 3, Length: uint64(len(sum))}
	for _, tc := range []struct {
		name    string
		inPlace bool
		fails   bool
		wantOwn byte // what the landing holds after
	}{
		{name: "copied", wantOwn: 7},
		{name: "read in place", inPlace: true, wantOwn: 0},
		{name: "publish fails", fails: true, wantOwn: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			landing := make([]byte, len(sum))
			own := landing
			if tc.inPlace {
				own = nil
			}
			sent := false
			publish := func(ph *frame.Header, data []byte) error {
				sent = true
				if ph != h || !bytes.Equal(data, sum) {
					t.Errorf("published %s with %d bytes, want the sum's header and bytes", ph, len(data))
				}
				if bytes.ContainsFunc(landing, func(r rune) bool { return r != 0 }) {
					t.Error("the worker's own landing was written before its group was handed the sum")
				}
				if tc.fails {
					return errors.New("segment gone")
				}
				return nil
			}
			err := handOut(h, sum, own, publish)
			if (err != nil) != tc.fails || !sent {
				t.Fatalf("handOut: %v, published %v", err, sent)
			}
			if !bytes.Equal(landing, bytes.Repeat([]byte{tc.wantOwn}, len(sum))) {
				t.Fatalf("the landing holds %v..., want %d", landing[:4], tc.wantOwn)
			}
		})
	}
}
