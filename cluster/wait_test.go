package cluster

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/node"
)

// The backoff of a start-up wait: delays double from retryFirst to
// retryMax; the first failure is logged, then one per waitLogEvery with
// the count of those held back.
func TestBackoff(t *testing.T) {
	s := time.Second
	tests := []struct {
		at       time.Duration // since t0
		delay    time.Duration
		log      bool
		unlogged int
	}{
		{0, 100 * time.Millisecond, true, 0},
		{100 * time.Millisecond, 200 * time.Millisecond, false, 0},
		{300 * time.Millisecond, 400 * time.Millisecond, false, 0},
		{700 * time.Millisecond, 800 * time.Millisecond, false, 0},
		{1500 * time.Millisecond, 1600 * time.Millisecond, false, 0},
		{3100 * time.Millisecond, 2 * s, false, 0},
		{5100 * time.Millisecond, 2 * s, false, 0},
		{30 * s, 2 * s, true, 6},
		{32 * s, 2 * s, false, 0},
		{61 * s, 2 * s, true, 1},
	}
	var b backoff
	for i, tt := range tests {
		delay, log, unlogged := b.failed(t0.Add(tt.at))
		if delay != tt.delay || log != tt.log || unlogged != tt.unlogged {
			t.Errorf("failure %d at %s: delay %s, log %v (%d held back); want %s, %v (%d)", i, tt.at, delay, log, unlogged, tt.delay, tt.log, tt.unlogged)
		}
	}
	if b.misses != len(tests) {
		t.Errorf("%d failures counted, want %d", b.misses, len(tests))
	}
}

// A name that resolves only on the fourth try is waited for; one that
// never does fails after the timeout, naming the variable and the host,
// as a failure to start (exit 1), not a configuration error (exit 2).
func TestAwaitResolve(t *testing.T) {
	notFound := errors.New("no such host")
	tests := []struct {
		name    string
		host    string
		failFor int // tries that fail; -1: all
		timeout time.Duration
		err     string
		tries   int
	}{
		{"an IP address is not looked up", "10.0.0.9", -1, time.Second, "", 0},
		{"a name that resolves", "sched.job", 0, time.Second, "", 1},
		{"a name that resolves on the fourth try", "sched.job", 3, 5 * time.Second, "", 4},
		{"a name that never resolves", "sched.job", -1, 500 * time.Millisecond, "DMLC_PS_ROOT_URI=sched.job: the name does not resolve after 500ms", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tries := 0
			lookup := func(_ context.Context, host string) ([]string, error) {
				if host != tt.host {
					t.Errorf("looked up %q, want %q", host, tt.host)
				}
				tries++
				if tt.failFor < 0 || tries <= tt.failFor {
					return nil, notFound
				}
				return []string{"10.0.0.9"}, nil
			}
			var logs bytes.Buffer
			log := slog.New(slog.NewTextHandler(&logs, nil))
			err := AwaitResolve(context.Background(), "DMLC_PS_ROOT_URI", tt.host, tt.timeout, log, lookup)
			switch {
			case tt.err == "" && err != nil:
				t.Fatalf("failed: %v", err)
			case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
				t.Fatalf("error %v; want one with %q", err, tt.err)
			}
			var ve *config.VarError
			if errors.As(err, &ve) {
				t.Errorf("a name not resolving yet is a configuration error: %v", err)
			}
			if err != nil && !errors.Is(err, notFound) {
				t.Errorf("error %v does not wrap the lookup's", err)
			}
			if tt.tries > 0 && tries != tt.tries {
				t.Errorf("%d tries, want %d", tries, tt.tries)
			}
			// The first failure is logged, the next ones (within
			// waitLogEvery) are not.
			if n := strings.Count(logs.String(), "waiting for a name to resolve"); tries > 1 && n != 1 {
				t.Errorf("%d failures logged of %d, want 1:\n%s", n, tries-1, logs.String())
			}
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := AwaitResolve(ctx, "DMLC_NODE_HOST", "me.job", time.Minute, slog.New(slog.DiscardHandler),
		func(context.Context, string) ([]string, error) { return nil, notFound })
	if err == nil || !strings.Contains(err.Error(), "interrupted") {
		t.Errorf("a cancelled wait: %v; want interrupted", err)
	}
}

// A scheduler port that refuses the probes is logged the first time and
// then once per waitLogEvery; the start's timeout then says that nothing
// ever listened at the scheduler's address, and names it.
func TestCoreProbeRefused(t *testing.T) {
	cfg := testConfig()
	cfg.StartTimeout = time.Minute
	c := newCore(cfg)
	c.bound(node.Info{Role: node.Worker, Host: "10.0.0.1", ControlPort: 7000, DataPort: 7001})
	var logged []time.Duration
	for at := time.Duration(0); at < 70*time.Second; at += time.Second {
		if r := c.tick(t0.Add(at), 0); !r.probe || r.startErr != nil {
			t.Fatalf("tick at %s: probe %v, start error %v", at, r.probe, r.startErr)
		}
		r := c.probed(false, t0.Add(at+100*time.Millisecond))
		if len(r.notes) > 0 {
			if !strings.Contains(r.notes[0].msg, "does not take connections yet") {
				t.Errorf("note %q", r.notes[0].msg)
			}
			logged = append(logged, at)
		}
	}
	if want := []time.Duration{0, 30 * time.Second, 60 * time.Second}; !slices.Equal(logged, want) {
		t.Errorf("refusals logged at %v, want %v", logged, want)
	}
	err := c.startTimedOut(context.DeadlineExceeded)
	for _, want := range []string{"10.0.0.9:9000", "never took a connection", "70 tries refused"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("timeout error %q lacks %q", err, want)
		}
	}
	// Once the port answered, refusals are the "stopped answering"
	// check's, and the timeout is the table's.
	c.probed(true, t0.Add(71*time.Second))
	if r := c.probed(false, t0.Add(72*time.Second)); len(r.notes) != 0 {
		t.Errorf("a refusal after an answer logged %v", r.notes)
	}
	if err := c.startTimedOut(context.DeadlineExceeded); !strings.Contains(err.Error(), "no node table") {
		t.Errorf("timeout after an answer: %v", err)
	}
}
