package launch_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/internal/localcluster"
	"github.com/fptps/fpt/internal/metricstest"
	"github.com/fptps/fpt/launch"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/trainer"
	"github.com/fptps/fpt/worker"
)

// TestMetricsMatchTraining runs a cluster (scheduler, 2 servers, 2
// workers, each node through launch.Run with its own FPT_METRICS_ADDR),
// trains, and then scrapes every server and worker over HTTP while they
// are still up: the payload bytes the counters report (bytes minus a
// header per frame) are exactly what the trainer pushed and pulled, each
// server received what the workers sent it, and the latency histograms
// counted every push and pull.
func TestMetricsMatchTraining(t *testing.T) {
	const servers, workers = 2, 2
	o := trainer.Options{Iterations: 3, Tensors: 4, MinBytes: 4 << 10, MaxBytes: 3 << 20, DType: frame.Float32, Quiet: true}
	port, err := localcluster.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"DMLC_PS_ROOT_URI":  "127.0.0.1",
		"DMLC_PS_ROOT_PORT": strconv.Itoa(port),
		"DMLC_NUM_SERVER":   strconv.Itoa(servers),
		"DMLC_NUM_WORKER":   strconv.Itoa(workers),
		"FPT_START_TIMEOUT": "60",
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	var (
		mu         sync.Mutex
		addrs      = map[string]string{} // "server 0" etc. → metrics address
		summaries  = map[int]trainer.Summary{}
		serversIn  = map[string]metricstest.Families{}
		workersOut = map[int]metricstest.Families{}
		failed     []error // the nodes that ended with an error, as they end
	)
	// Each node serves its metrics on a port of the kernel's choosing
	// (a port picked ahead could be taken by another test's node before
	// this one binds it): launch.Start, then the address, then Node.Run.
	start := func(role, name string, train launch.Train) <-chan error {
		e := map[string]string{"DMLC_ROLE": role, "FPT_METRICS_ADDR": "127.0.0.1:0"}
		for k, v := range env {
			e[k] = v
		}
		cfg, err := config.FromEnv(func(k string) (string, bool) { v, ok := e[k]; return v, ok })
		if err != nil {
			t.Fatal(err)
		}
		run := func() error {
			n, err := launch.Start(ctx, cfg, launch.Deps{Log: log, Decisions: io.Discard})
			if err != nil {
				return err
			}
			mu.Lock()
			addrs[name] = n.MetricsAddr()
			mu.Unlock()
			return n.Run(ctx, train)
		}
		done := make(chan error, 1)
		go func() {
			err := run()
			if err != nil {
				mu.Lock()
				failed = append(failed, fmt.Errorf("%s: %w", name, err))
				mu.Unlock()
			}
			done <- err
		}()
		return done
	}
	var ends []<-chan error
	ends = append(ends, start("scheduler", "scheduler", nil))
	for i := range servers {
		ends = append(ends, start("server", fmt.Sprintf("server %d", i), nil))
	}
	var trained sync.WaitGroup
	trained.Add(workers)
	scraped := make(chan struct{})
	for i := range workers {
		ends = append(ends, start("worker", fmt.Sprintf("worker %d", i), func(ctx context.Context, w *worker.Worker) error {
			s, err := trainer.Run(ctx, w, o, io.Discard)
			if err != nil {
				trained.Done()
				return err
			}
			// Every node is still up until the final barrier: scrape now.
			if err := w.Barrier(ctx, node.WorkerGroup); err != nil {
				trained.Done()
				return err
			}
			mu.Lock()
			summaries[w.Rank()] = s
			addr := addrs[fmt.Sprintf("worker %d", i)]
			mu.Unlock()
			mfs, err := metricstest.Scrape(ctx, addr)
			if err != nil {
				trained.Done()
				return err
			}
			mu.Lock()
			workersOut[w.Rank()] = mfs
			mu.Unlock()
			trained.Done()
			<-scraped
			return nil
		}))
	}
	// A node that fails before its worker trains never counts down:
	// wait for the training or the test's deadline, not forever.
	allTrained := make(chan struct{})
	go func() { trained.Wait(); close(allTrained) }()
	select {
	case <-allTrained:
	case <-ctx.Done():
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("the workers did not train within the test's deadline; nodes failed: %v", failed)
	}
	for i := range servers {
		mfs, err := metricstest.Scrape(ctx, addrs[fmt.Sprintf("server %d", i)])
		if err != nil {
			t.Fatal(err)
		}
		serversIn[fmt.Sprintf("server %d", i)] = mfs
	}
	close(scraped)
	for _, end := range ends {
		if err := <-end; err != nil {
			t.Fatal(err)
		}
	}
	if len(summaries) != workers || len(workersOut) != workers {
		t.Fatalf("%d summaries and %d scrapes, want %d", len(summaries), len(workersOut), workers)
	}

	toServers := map[string]string{"peer_role": "server"}
	var sentToServers float64
	for rank, mfs := range workersOut {
		s := summaries[rank]
		// Worker 0 also pushes the init round; every worker pulls it.
		pushed := float64(s.ModelBytes) * float64(o.Iterations)
		if rank == 0 {
			pushed += float64(s.ModelBytes)
		}
		pulled := float64(s.ModelBytes) * float64(o.Iterations+1)
		sent := value(t, mfs, "fpt_van_sent_bytes_total", toServers)
		sentFrames := value(t, mfs, "fpt_van_sent_frames_total", toServers)
		if got := sent - frame.HeaderSize*sentFrames; got != pushed {
			t.Errorf("worker %d: %v payload bytes sent to servers, the trainer pushed %v", rank, got, pushed)
		}
		recv := value(t, mfs, "fpt_van_received_bytes_total", toServers)
		recvFrames := value(t, mfs, "fpt_van_received_frames_total", toServers)
		if got := recv - frame.HeaderSize*recvFrames; got != pulled {
			t.Errorf("worker %d: %v payload bytes received from servers, the trainer pulled %v", rank, got, pulled)
		}
		sentToServers += sent
		// One FPTPush for the init, one per tensor per iteration; one
		// FPTPull for the init and one per iteration.
		if n := value(t, mfs, "fpt_push_latency_seconds", nil); n != float64(1+o.Tensors*o.Iterations) {
			t.Errorf("worker %d: %v push latencies, want %d", rank, n, 1+o.Tensors*o.Iterations)
		}
		if n := value(t, mfs, "fpt_pull_latency_seconds", nil); n != float64(1+o.Iterations) {
			t.Errorf("worker %d: %v pull latencies, want %d", rank, n, 1+o.Iterations)
		}
		if b := value(t, mfs, "fpt_van_busy_seconds_total", map[string]string{"peer_role": "server", "direction": "sent"}); !(b > 0) {
			t.Errorf("worker %d: busy sending to servers %v s", rank, b)
		}
	}
	var recvByServers float64
	for _, mfs := range serversIn {
		recvByServers += value(t, mfs, "fpt_van_received_bytes_total", map[string]string{"peer_role": "worker"})
	}
	if recvByServers != sentToServers {
		t.Errorf("servers received %v bytes from workers, workers sent %v", recvByServers, sentToServers)
	}
}

// value is a series' value that must be in the scrape.
func value(t *testing.T, f metricstest.Families, name string, labels map[string]string) float64 {
	t.Helper()
	v, ok := f.Value(name, labels)
	if !ok {
		t.Fatalf("no %s%v in the scrape", name, labels)
	}
	return v
}
