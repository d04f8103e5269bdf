package cluster_test

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/fptps/fpt/cluster"
	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/control"
	"github.com/fptps/fpt/control/memplane"
	"github.com/fptps/fpt/frame"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/scheduler"
	"github.com/fptps/fpt/van"
	"github.com/fptps/fpt/van/memvan"
)

// nopHandler takes no frames: these members move no data.
type nopHandler struct{}

func (nopHandler) HandleFrame(*frame.Header, []byte, bool) {}
func (nopHandler) PeerLost(node.ID, error)                 {}
func (nopHandler) PayloadBuffer(*frame.Header) []byte      { return nil }

// A role stuck in its control handler (a worker copying a 2 GiB result
// under its lock once was) holds up neither heartbeat answers nor
// barriers: with the handler blocked for many heartbeat timeouts, no
// member fails and a barrier still passes.
func TestBlockedRoleKeepsMembership(t *testing.T) {
	// A timeout of ten heartbeats: long enough that a loaded machine
	// running the race detector does not miss it, short enough that a
	// member whose heartbeats waited for the stuck handler (for the whole
	// test) fails several times over.
	const timeout = 500 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ctl, data := memplane.NewNetwork(), memvan.NewNetwork()
	planes := cluster.Planes{
		Control: func(port int, log *slog.Logger) (control.Transport, error) { return ctl.Listen(port, log) },
		Data:    func(cfg van.Config) (van.Transport, error) { return data.Listen(cfg) },
	}
	cfgFor, schedDone := startScheduler(ctx, t, ctl, map[string]string{
		"FPT_LB":                "on", // the scheduler directs every node at once
		"PS_HEARTBEAT_INTERVAL": "0.05",
		"PS_HEARTBEAT_TIMEOUT":  strconv.FormatFloat(timeout.Seconds(), 'f', -1, 64),
	})
	log := discard()

	release := make(chan struct{})
	handled := make(chan node.Role, 2)
	var members []*cluster.Member
	starts := make(chan error, 2)
	for _, role := range []string{"server", "worker"} {
		m := cluster.New(cfgFor(role), log, planes)
		m.OnControl(func(*control.Message) {
			handled <- m.Self().Role
			// Stuck until the test ends, or (if the node's own traffic
			// waits for it) long enough for the members to fail.
			select {
			case <-release:
			case <-time.After(30 * timeout):
			}
		})
		members = append(members, m)
		go func() { starts <- m.Start(ctx, nopHandler{}) }()
	}
	defer func() {
		close(release)
		for _, m := range members {
			m.Close()
		}
	}()
	for range members {
		if err := <-starts; err != nil {
			t.Fatal(err)
		}
	}
	for range members {
		select {
		case <-handled:
		case <-ctx.Done():
			t.Fatal("no control message reached the roles' handlers")
		}
	}

	// Both handlers are stuck now. Wait several heartbeat timeouts.
	select {
	case <-time.After(6 * timeout):
	case err := <-schedDone:
		t.Fatalf("the scheduler ended while the roles were busy: %v", err)
	}
	for _, m := range members {
		select {
		case <-m.Done():
			t.Fatalf("%s failed while its role was busy: %v", m.Self(), m.Err())
		default:
		}
	}
	errs := make(chan error, len(members))
	for _, m := range members {
		go func() { errs <- m.Barrier(ctx, node.AllGroup) }()
	}
	for range members {
		if err := <-errs; err != nil {
			t.Fatalf("barrier while the roles were busy: %v", err)
		}
	}
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// startScheduler serves a job of one server and one worker on ctl, its
// settings overridden by env; cfgFor gives a role's configuration.
func startScheduler(ctx context.Context, t *testing.T, ctl *memplane.Network, env map[string]string) (cfgFor func(role string) config.Config, done <-chan error) {
	t.Helper()
	all := map[string]string{
		"DMLC_PS_ROOT_URI":  "127.0.0.1",
		"DMLC_PS_ROOT_PORT": "9000",
		"DMLC_NODE_HOST":    "127.0.0.1",
		"DMLC_NUM_SERVER":   "1",
		"DMLC_NUM_WORKER":   "1",
		"FPT_START_TIMEOUT": "30",
	}
	for k, v := range env {
		all[k] = v
	}
	cfgFor = func(role string) config.Config {
		all["DMLC_ROLE"] = role
		cfg, err := config.FromEnv(func(k string) (string, bool) { v, ok := all[k]; return v, ok })
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	scfg := cfgFor("scheduler")
	plane, err := ctl.Listen(scfg.RootPort, discard())
	if err != nil {
		t.Fatal(err)
	}
	schedDone := make(chan error, 1)
	go func() { schedDone <- scheduler.Serve(ctx, plane, scfg, discard(), nil, nil, scheduler.Observers{}) }()
	return cfgFor, schedDone
}
