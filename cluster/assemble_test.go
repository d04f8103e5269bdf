package cluster_test

import (
	"context"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fptps/fpt/cluster"
	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/control"
)

// A node that registered with a scheduler which then dies while the
// cluster is assembling (the other nodes not all registered yet) fails
// within about PS_HEARTBEAT_TIMEOUT, naming the scheduler, rather than
// waiting out FPT_START_TIMEOUT: over the real control plane, whose
// connections show no end.
func TestSchedulerGoneWhileAssembling(t *testing.T) {
	sched, err := control.Listen(control.Config{BindHost: "127.0.0.1", Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	schedAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(sched.Port()))
	env := map[string]string{
		"DMLC_ROLE": "worker", "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": strconv.Itoa(sched.Port()),
		"DMLC_NODE_HOST": "127.0.0.1", "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "1",
		"PS_HEARTBEAT_INTERVAL": "0.05", "PS_HEARTBEAT_TIMEOUT": "0.5", "FPT_START_TIMEOUT": "30",
	}
	cfg, err := config.FromEnv(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	planes := cluster.Network(cfg, nil)
	probe := planes.Probe
	answered := make(chan struct{})
	var once sync.Once
	planes.Probe = func(ctx context.Context, endpoint string) error {
		err := probe(ctx, endpoint)
		if err == nil {
			once.Do(func() { close(answered) })
		}
		return err
	}
	m := cluster.New(cfg, discard(), planes)
	defer m.Close()
	started := make(chan error, 1)
	go func() { started <- m.Start(context.Background(), nopHandler{}) }()

	// The worker registers, alone of the job, and finds the scheduler up.
	select {
	case msg := <-sched.Incoming():
		if msg.Command != control.AddNode {
			t.Fatalf("the scheduler got %s; want AddNode", msg.Command)
		}
	case <-time.After(time.Minute):
		t.Fatal("no registration within a minute")
	}
	select {
	case <-answered:
	case <-time.After(time.Minute):
		t.Fatal("the scheduler's port answered no probe within a minute")
	}
	sched.Close() // the scheduler dies

	select {
	case err := <-started:
		want := "the scheduler at " + schedAddr + " stopped answering while the cluster was assembling"
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Start returned %v; want an error saying %q", err, want)
		}
		t.Log(err)
	case <-time.After(2 * time.Minute):
		t.Fatal("Start still waiting 2 minutes after the scheduler died")
	}
}
