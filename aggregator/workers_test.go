package aggregator

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/fptps/fpt/cluster"
	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/control"
	"github.com/fptps/fpt/control/memplane"
	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/scheduler"
	"github.com/fptps/fpt/van"
	"github.com/fptps/fpt/van/memvan"
)

// result is a Result frame a worker received: its iteration and first
// float32 value.
type result struct {
	iter uint64
	val  float32
}

// recorder is a worker member's frame handler: it passes on the Result
// frames it receives.
type recorder chan result

func (r recorder) HandleFrame(h *frame.Header, payload []byte, _ bool) {
	if h.Type == frame.Result {
		r <- result{h.Iteration, math.Float32frombits(binary.LittleEndian.Uint32(payload))}
	}
}
func (recorder) PeerLost(node.ID, error)            {}
func (recorder) PayloadBuffer(*frame.Header) []byte { return nil }

// startMembers starts an in-memory cluster of the real scheduler, one
// server and the given workers, all bare members: the test drives the
// server's aggregator itself and reads what reaches each worker.
func startMembers(t *testing.T, ctx context.Context, workers int) (server *cluster.Member, results []recorder) {
	t.Helper()
	env := map[string]string{
		"DMLC_PS_ROOT_URI":  "127.0.0.1",
		"DMLC_PS_ROOT_PORT": "9000",
		"DMLC_NODE_HOST":    "127.0.0.1",
		"DMLC_NUM_SERVER":   "1",
		"DMLC_NUM_WORKER":   strconv.Itoa(workers),
		"FPT_START_TIMEOUT": "30",
	}
	cfgFor := func(role string) config.Config {
		env["DMLC_ROLE"] = role
		cfg, err := config.FromEnv(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	ctl, data := memplane.NewNetwork(), memvan.NewNetwork()
	planes := cluster.Planes{
		Control: func(port int, log *slog.Logger) (control.Transport, error) { return ctl.Listen(port, log) },
		Data:    func(cfg van.Config) (van.Transport, error) { return data.Listen(cfg) },
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	scfg := cfgFor("scheduler")
	plane, err := ctl.Listen(scfg.RootPort, log)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = scheduler.Serve(ctx, plane, scfg, log, nil, nil, scheduler.Observers{}) }()

	starts := make(chan error, 1+workers)
	server = cluster.New(cfgFor("server"), log, planes)
	go func() { starts <- server.Start(ctx, recorder(nil)) }()
	byStart := make([]*cluster.Member, workers)
	recs := make([]recorder, workers)
	for i := range workers {
		byStart[i] = cluster.New(cfgFor("worker"), log, planes)
		recs[i] = make(recorder, 16)
		go func() { starts <- byStart[i].Start(ctx, recs[i]) }()
	}
	t.Cleanup(func() {
		server.Close()
		for _, m := range byStart {
			m.Close()
		}
	})
	for range 1 + workers {
		if err := <-starts; err != nil {
			t.Fatal(err)
		}
	}
	// Ranks are assigned at registration: index the recorders by rank.
	results = make([]recorder, workers)
	for i, m := range byStart {
		results[m.Self().ID.Rank()] = recs[i]
	}
	return server, results
}

// TestFollowLostWorker: a 2-worker job loses w1, and a retry decision from
// iteration k on names w0 alone. From k on, a sum is w0's push alone and
// goes to w0 only: the partial sum of k holding w1's push is dropped and
// so is w1's late push of k, without an error. Iterations before k still
// add up both workers' pushes and go to both. w0's push of k comes before
// this node follows the retry (w0 heard of it first): it waits for it,
// rather than open a round of both workers.
func TestFollowLostWorker(t *testing.T) {
	const k = 5
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	server, results := startMembers(t, ctx, 2)
	a := New(server, nil)
	w0, w1 := node.WorkerID(0), node.WorkerID(1)
	push := func(from node.ID, iter uint64, version uint32) *frame.Header {
		return &frame.Header{Type: frame.Push, DType: frame.Float32, Sender: uint32(from),
			Key: 3, Partition: 1, Iteration: iter, Aux: version, Total: 64, Length: 4}
	}
	payload := func(val float32) []byte {
		return binary.LittleEndian.AppendUint32(nil, math.Float32bits(val))
	}
	steps := []struct {
		name    string
		do      func() error
		pending int // a.table.Pending() afterwards
	}{
		{"w1 pushes k", func() error { return a.HandlePush(push(w1, k, 0), payload(1000), false) }, 1},
		{"w0 pushes k-1", func() error { return a.HandlePush(push(w0, k-1, 0), payload(1), false) }, 2},
		{"w0 pushes k under the retry, before this node follows it", func() error {
			return a.HandlePush(push(w0, k, 1), payload(10), false)
		}, 2},
		{"retry from k over w0 alone: w0's push of k completes the sum", func() error {
			a.Follow(lb.Directive{Retry: true, Decision: &lb.Decision{Version: 1, Iteration: k,
				Aggregators: []node.ID{node.ServerID(0)}, Shares: []float64{1}, Workers: []node.ID{w0}}})
			return nil
		}, 1},
		{"w1's late push of k under the new version", func() error {
			h := push(w1, k, 1)
			buf := a.PayloadBuffer(h)
			copy(buf, payload(100))
			if err := a.HandlePush(h, buf, true); err != nil {
				return err
			}
			// Its buffer went back to the table.
			again := a.table.Buffer(len(buf))
			defer a.table.Recycle(again)
			if &again[0] != &buf[0] {
				return errors.New("the dropped push's buffer was not taken back")
			}
			return nil
		}, 1},
		{"w1 pushes k-1: the sum is complete", func() error { return a.HandlePush(push(w1, k-1, 0), payload(2), false) }, 0},
	}
	for _, st := range steps {
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if got := a.table.Pending(); got != st.pending {
			t.Fatalf("%s: %d partitions pending, want %d", st.name, got, st.pending)
		}
	}
	// Frames from the server reach each worker in the order they were
	// sent: had k's sum gone to w1 too, it would come before k-1's.
	want := [][]result{{{k, 10}, {k - 1, 3}}, {{k - 1, 3}}}
	for rank, rs := range want {
		for _, r := range rs {
			select {
			case got := <-results[rank]:
				if got != r {
					t.Fatalf("worker %d received the sum of iteration %d = %g, want iteration %d = %g", rank, got.iter, got.val, r.iter, r.val)
				}
			case <-ctx.Done():
				t.Fatalf("worker %d did not receive the sum of iteration %d", rank, r.iter)
			}
		}
	}

	// A node that is no worker of the iteration, and never was, is an
	// error, at k as before it.
	for _, from := range []node.ID{node.WorkerID(2), node.ServerID(0)} {
		for _, iter := range []uint64{k - 1, k} {
			if err := a.HandlePush(push(from, iter, 1), payload(1), false); err == nil {
				t.Errorf("push from %s of iteration %d accepted", from, iter)
			}
		}
	}
}
