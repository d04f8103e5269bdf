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

// A node whose every handshake with the scheduler's port fails says so
// within about PS_HEARTBEAT_TIMEOUT, naming the port and why, rather than
// waiting out FPT_START_TIMEOUT: a scheduler with another secret, or
// another program holding the port (one that answers a CURVE greeting
// with garbage and hangs up reports nothing: see control's dealerEvents).
func TestSchedulerPortRefusesHandshakes(t *testing.T) {
	const secret = "the-job-secret-of-16+bytes"
	tests := []struct {
		name   string
		secret string // the node's
		listen func(t *testing.T) int
		want   []string
	}{
		{"a scheduler with another secret", "another-secret-of-16+bytes", func(t *testing.T) int {
			sched, err := control.Listen(control.Config{BindHost: "127.0.0.1", Logger: discard(), Secret: secret})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { sched.Close() })
			return sched.Port()
		}, []string{"every handshake with it has failed", "FPT_CLUSTER_SECRET"}},
		{"another program on the port, without a secret", "", garbagePort, []string{"every handshake with it has failed", "not another program"}},
		{"a silent program on the port", secret, silentPort, []string{"every handshake with it has failed"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			port := tt.listen(t)
			env := map[string]string{
				"DMLC_ROLE": "worker", "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": strconv.Itoa(port),
				"DMLC_NODE_HOST": "127.0.0.1", "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "1",
				"PS_HEARTBEAT_INTERVAL": "0.05", "PS_HEARTBEAT_TIMEOUT": "0.5", "FPT_START_TIMEOUT": "60",
			}
			if tt.secret != "" {
				env["FPT_CLUSTER_SECRET"] = tt.secret
			}
			cfg, err := config.FromEnv(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
			if err != nil {
				t.Fatal(err)
			}
			m := cluster.New(cfg, discard(), cluster.Network(cfg, nil))
			defer m.Close()
			started := make(chan error, 1)
			go func() { started <- m.Start(context.Background(), nopHandler{}) }()
			select {
			case err := <-started:
				if err == nil {
					t.Fatal("Start succeeded")
				}
				for _, w := range append(tt.want, "127.0.0.1:"+strconv.Itoa(port)) {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("Start returned %v; want an error saying %q", err, w)
					}
				}
				t.Log(err)
			case <-time.After(50 * time.Second):
				t.Fatal("Start still waiting after 50 s (FPT_START_TIMEOUT is 60 s, PS_HEARTBEAT_TIMEOUT 0.5 s)")
			}
		})
	}
}

// garbagePort is a port held by a program that answers every connection
// with an HTTP error and hangs up.
func garbagePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"))
			c.Close()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

// silentPort is a port held by a program that takes every connection and
// never says a word.
func silentPort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	var mu sync.Mutex
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}
