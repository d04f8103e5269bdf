package launch_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/launch"
	"github.com/fptps/fpt/worker"
)

// probe GETs path at addr: the status and the body.
func probe(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// awaitProbe polls path at addr until it answers want.
func awaitProbe(t *testing.T, addr, path string, want int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + path)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == want {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s%s never answered %d (last: %v %v)", addr, path, want, resp, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// /healthz says the process is alive; /readyz that the node is a member of
// a running cluster: 503 while the scheduler and a server wait for the
// worker, 200 once the cluster runs, 503 again after it ended.
func TestProbes(t *testing.T) {
	port := freePort(t)
	schedAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	serverAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sched, err := launch.Start(ctx, nodeConfig(t, "scheduler", port, map[string]string{"FPT_METRICS_ADDR": schedAddr}), launch.Deps{Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer sched.Close()
	serverDone := make(chan error, 1)
	go func() {
		serverDone <- launch.Run(ctx, nodeConfig(t, "server", port, map[string]string{"FPT_METRICS_ADDR": serverAddr}), launch.Deps{Log: quiet}, nil)
	}()
	awaitProbe(t, serverAddr, "/healthz", http.StatusOK)
	for _, addr := range []string{schedAddr, serverAddr} {
		if code, body := probe(t, addr, "/readyz"); code != http.StatusServiceUnavailable {
			t.Errorf("%s/readyz before the worker started: %d %q, want 503", addr, code, body)
		}
		if code, body := probe(t, addr, "/healthz"); code != http.StatusOK {
			t.Errorf("%s/healthz: %d %q, want 200", addr, code, body)
		}
	}
	trained := make(chan struct{})
	release := make(chan struct{})
	workerDone := make(chan error, 1)
	go func() {
		workerDone <- launch.Run(ctx, nodeConfig(t, "worker", port, nil), launch.Deps{Log: quiet}, func(context.Context, *worker.Worker) error {
			close(trained)
			<-release
			return nil
		})
	}()
	<-trained
	awaitProbe(t, schedAddr, "/readyz", http.StatusOK)
	awaitProbe(t, serverAddr, "/readyz", http.StatusOK)
	if _, body := probe(t, serverAddr, "/metrics"); !strings.Contains(body, "fpt_") {
		t.Errorf("/metrics beside the probes serves no fpt metric")
	}
	// The end: the scheduler's readiness goes with the cluster.
	close(release)
	if err := <-workerDone; err != nil {
		t.Fatal(err)
	}
	if err := <-serverDone; err != nil {
		t.Fatal(err)
	}
	awaitProbe(t, schedAddr, "/readyz", http.StatusServiceUnavailable)
	if err := sched.Ready(); err == nil {
		t.Errorf("the scheduler is ready after the cluster ended")
	}
}
