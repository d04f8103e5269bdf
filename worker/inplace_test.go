package worker_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/internal/metricstest"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/trainer"
	"github.com/fptps/fpt/van/vantest"
	"github.com/fptps/fpt/worker"
)

// payload is what one node's van counted of tensor payload: received bytes
// by where they were read to, and sent bytes (frame headers excluded).
type payload struct {
	inPlace, copied, sent uint64
	fromWorkers           uint64 // received from workers (aggregated by this node)
}

func (p payload) String() string {
	return fmt.Sprintf("received in place %d, copied %d (%d from workers); sent %d", p.inPlace, p.copied, p.fromWorkers, p.sent)
}

func (p *payload) add(q payload) {
	p.inPlace += q.inPlace
	p.copied += q.copied
	p.sent += q.sent
	p.fromWorkers += q.fromWorkers
}

// workerPayload reads a worker's figures from its van (Transport.Stats).
func workerPayload(w *worker.Worker) payload {
	var p payload
	for _, st := range w.Node().Van().Stats() {
		p.inPlace += st.ReceivedInPlaceBytes
		p.copied += st.ReceivedCopiedBytes
		p.sent += st.SentBytes - frame.HeaderSize*st.SentFrames
		if r, _ := st.Peer.Role(); r == node.Worker {
			p.fromWorkers += st.ReceivedInPlaceBytes + st.ReceivedCopiedBytes
		}
	}
	return p
}

// serverPayload reads a server's figures from its /metrics.
func serverPayload(t *testing.T, addr string) payload {
	t.Helper()
	mfs, err := metricstest.Scrape(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	// Sums by name, by name and path, and by name and peer role.
	sums := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			v := m.GetCounter().GetValue()
			sums[mf.GetName()] += v
			for _, l := range m.GetLabel() {
				if l.GetName() == "path" || l.GetName() == "peer_role" {
					sums[mf.GetName()+"/"+l.GetValue()] += v
				}
			}
		}
	}
	const recv = "fpt_van_received_payload_bytes_total"
	return payload{
		inPlace:     uint64(sums[recv+"/in_place"]),
		copied:      uint64(sums[recv+"/copied"]),
		sent:        uint64(sums["fpt_van_sent_bytes_total"] - frame.HeaderSize*sums["fpt_van_sent_frames_total"]),
		fromWorkers: uint64(sums[recv+"/worker"]),
	}
}

// TestFPTPayloadReadInPlace: in a real cluster (ZeroMQ control plane,
// loopback van), every tensor byte of FPTPush and FPTPull traffic that
// crosses the network is read straight into the buffer of the code that
// receives it (the aggregator's sum buffer, the worker's FPTPull or staging
// buffer): no node's van copies any, with the LB off and on. Each node's
// role handler is a van.Sink; this fails if the cluster's adapter hides it.
func TestFPTPayloadReadInPlace(t *testing.T) {
	const servers, workers = 2, 2
	o := trainer.Options{Iterations: 12, Tensors: 5, MinBytes: 12, MaxBytes: 600 << 10, DType: frame.Float32, Quiet: true}
	var model uint64
	for _, n := range o.Sizes() {
		model += uint64(n * o.DType.Size())
	}
	for _, tt := range []struct{ lb, van string }{{"off", "epoll"}, {"on", "epoll"}, {"off", "netconn"}} {
		lb := tt.lb
		t.Run("lb-"+lb+"-"+tt.van, func(t *testing.T) {
			// With the LB on, probing every 2 balanced iterations moves
			// some aggregation onto the workers (grants two iterations
			// ahead: short iterations probe then).
			c := mustStart(t, servers, workers, map[string]string{"FPT_LB": lb, "FPT_VAN": tt.van, "FPT_LB_PROBE_EVERY": "2", "FPT_LB_AHEAD": "0", "FPT_PARTITION_BYTES": "65536"})
			c.train(t, o) // FPT only (no classic rounds), every value checked
			var total payload
			var last string
			vantest.Eventually(t, func() error {
				total, last = payload{}, ""
				for i, srv := range c.servers {
					p := serverPayload(t, srv.MetricsAddr())
					last += fmt.Sprintf("\n  server %d: %v", i, p)
					total.add(p)
				}
				for _, w := range c.workers {
					p := workerPayload(w)
					last += fmt.Sprintf("\n  worker %d: %v", w.Rank(), p)
					total.add(p)
				}
				// Every byte sent was received; the senders count a frame
				// once written, which may trail its receipt a little.
				if total.sent != total.inPlace+total.copied {
					return fmt.Errorf("sent %d payload bytes, received %d:%s", total.sent, total.inPlace+total.copied, last)
				}
				return nil
			})
			t.Logf("payload bytes per node:%s", last)
			if total.copied != 0 || total.inPlace == 0 {
				t.Errorf("FPT payload read in place %d bytes, copied %d; want all in place:%s", total.inPlace, total.copied, last)
			}
			if lb == "on" {
				// Pushes to a worker (the LB made it an aggregator) took
				// the worker's Sink too.
				var toWorkers uint64
				for _, w := range c.workers {
					toWorkers += workerPayload(w).fromWorkers
				}
				if toWorkers == 0 {
					t.Errorf("no worker aggregated: the LB-on case did not test workers' pushes:%s", last)
				}
			}
			if lb == "off" {
				// Iteration 0 (init): worker 0 pushes, every worker gets
				// the result; then every worker pushes and pulls.
				want := model*(1+workers) + uint64(o.Iterations)*2*workers*model
				if total.inPlace != want {
					t.Errorf("%d payload bytes read in place, want %d (the whole model's traffic):%s", total.inPlace, want, last)
				}
			}
			mustFinish(t, c)
		})
	}
}

// TestResultReadInPlaceWaitingAndStaged: a Result partition is read in
// place both when its FPTPull is already waiting (straight into the
// caller's buffer) and when it arrives before the pull (into the worker's
// staging buffer, copied to the caller's when the pull comes).
func TestResultReadInPlaceWaitingAndStaged(t *testing.T) {
	c := mustStart(t, 1, 2, map[string]string{"FPT_LB": "off", "FPT_PARTITION_BYTES": "65536"})
	defer mustFinish(t, c)
	const key, elems = 3, 300 << 8 // 300 KiB: five partitions
	const bytes = elems * 4
	ctx := context.Background()
	kvs := make([]*worker.KV[float32], len(c.workers))
	err := c.each(func(w *worker.Worker) error {
		kv := worker.NewKV[float32](w)
		kvs[w.Rank()] = kv
		if err := kv.Declare(key, elems, 0); err != nil {
			return err
		}
		return kv.Init(ctx, []uint64{key}, make([]float32, elems), nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	// grad[r][j] is worker r's contribution; the sum is 3j+1.
	grads := [2][]float32{make([]float32, elems), make([]float32, elems)}
	for j := range elems {
		grads[0][j], grads[1][j] = float32(j), float32(2*j+1)
	}
	waiting, staged := kvs[0], kvs[1]
	before := [2]payload{workerPayload(waiting.Worker()), workerPayload(staged.Worker())}

	// Worker 0 pulls before worker 1 has pushed: its pull waits, and the
	// sum's partitions land in its buffer.
	if _, err := waiting.FPTPush([]uint64{key}, grads[0], nil, 0, nil); err != nil {
		t.Fatal(err)
	}
	sums := [2][]float32{make([]float32, elems), make([]float32, elems)}
	waitTS, err := waiting.FPTPull([]uint64{key}, sums[0], nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Worker 1 pulls only once its van has received every partition: they
	// were staged.
	if _, err := staged.FPTPush([]uint64{key}, grads[1], nil, 0, nil); err != nil {
		t.Fatal(err)
	}
	vantest.Eventually(t, func() error {
		p := workerPayload(staged.Worker())
		if got := p.inPlace + p.copied - before[1].inPlace - before[1].copied; got != bytes {
			return fmt.Errorf("worker 1 received %d bytes of the result, want %d", got, bytes)
		}
		return nil
	})
	stagedTS, err := staged.FPTPull([]uint64{key}, sums[1], nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := waiting.Wait(waitTS); err != nil {
		t.Fatal(err)
	}
	if err := staged.Wait(stagedTS); err != nil {
		t.Fatal(err)
	}
	for r, name := range []string{"waiting", "staged"} {
		for j, v := range sums[r] {
			if v != float32(3*j+1) {
				t.Fatalf("%s pull: element %d is %v, want %d", name, j, v, 3*j+1)
			}
		}
		after := workerPayload(kvs[r].Worker())
		if in, cp := after.inPlace-before[r].inPlace, after.copied-before[r].copied; in != bytes || cp != 0 {
			t.Errorf("%s pull: result read in place %d bytes, copied %d; want %d in place", name, in, cp, bytes)
		}
	}
	if err := c.each(func(w *worker.Worker) error { return w.Barrier(ctx, node.WorkerGroup) }); err != nil {
		t.Fatal(err)
	}
}
