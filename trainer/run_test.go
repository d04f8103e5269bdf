package trainer_test

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/launch"
	"github.com/fptps/fpt/localcluster"
	"github.com/fptps/fpt/trainer"
	"github.com/fptps/fpt/worker"
)

// TestRunSummary trains a small in-process cluster (scheduler, a server,
// two workers, each node through launch.Run) and checks each worker's
// summary: one time per iteration, all positive, adding up to Elapsed.
func TestRunSummary(t *testing.T) {
	const workers = 2
	o := trainer.Options{Iterations: 4, Tensors: 3, MinBytes: 4 << 10, MaxBytes: 256 << 10, DType: frame.Float32, Quiet: true}
	port, err := localcluster.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": strconv.Itoa(port),
		"DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": strconv.Itoa(workers), "FPT_START_TIMEOUT": "60",
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var (
		mu        sync.Mutex
		summaries []trainer.Summary
	)
	var ends []chan error
	start := func(role string, train launch.Train) {
		e := map[string]string{"DMLC_ROLE": role}
		for k, v := range env {
			e[k] = v
		}
		cfg, err := config.FromEnv(func(k string) (string, bool) { v, ok := e[k]; return v, ok })
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- launch.Run(ctx, cfg, log, train) }()
		ends = append(ends, done)
	}
	start("scheduler", nil)
	start("server", nil)
	for range workers {
		start("worker", func(ctx context.Context, w *worker.Worker) error {
			s, err := trainer.Run(ctx, w, o, io.Discard)
			mu.Lock()
			summaries = append(summaries, s)
			mu.Unlock()
			return err
		})
	}
	for _, end := range ends {
		if err := <-end; err != nil {
			t.Fatal(err)
		}
	}
	if len(summaries) != workers {
		t.Fatalf("%d summaries, want %d", len(summaries), workers)
	}
	for _, s := range summaries {
		if s.Iterations != o.Iterations || len(s.IterTimes) != o.Iterations {
			t.Errorf("worker %d: %d iterations, %d times; want %d", s.Rank, s.Iterations, len(s.IterTimes), o.Iterations)
		}
		var total time.Duration
		for i, d := range s.IterTimes {
			if d <= 0 {
				t.Errorf("worker %d: iteration %d took %v", s.Rank, i+1, d)
			}
			total += d
		}
		if total != s.Elapsed {
			t.Errorf("worker %d: iteration times add up to %v, Elapsed is %v", s.Rank, total, s.Elapsed)
		}
		if s.Values == 0 || s.GoodputGbps() <= 0 {
			t.Errorf("worker %d: summary %+v", s.Rank, s)
		}
	}
}
