package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"time"
)

// Start-up waits: a node started by a cluster engine may start before the
// scheduler's name resolves (a Kubernetes pod's headless-service name
// exists only once the pod runs) or before the scheduler listens. Such a
// node waits, trying again with backoff, until FPT_START_TIMEOUT.
const (
	// retryFirst and retryMax bound the delay between two tries: short at
	// first (the peer is usually seconds late), then no more often than
	// retryMax, so that a thousand waiting nodes do not flood the DNS.
	retryFirst = 100 * time.Millisecond
	retryMax   = 2 * time.Second
	// waitLogEvery is how often a wait is logged after its first failure.
	waitLogEvery = 30 * time.Second
)

// backoff is the schedule of a start-up wait: the delay before each next
// try, doubling from retryFirst to retryMax, and which failures are
// logged (the first, then one per waitLogEvery, with how many were not).
// It is pure: the caller passes the time.
type backoff struct {
	delay  time.Duration
	limit  logLimit
	misses int // failures so far
}

// failed takes a failed try at now and returns how long to wait before
// the next one, and whether to log this failure, with the failures since
// the last one logged.
func (b *backoff) failed(now time.Time) (delay time.Duration, log bool, unlogged int) {
	b.misses++
	switch {
	case b.delay == 0:
		b.delay = retryFirst
	case b.delay < retryMax:
		b.delay = min(2*b.delay, retryMax)
	}
	log, unlogged = b.limit.allow(now)
	return b.delay, log, unlogged
}

// logLimit lets a repeated log line through the first time, then once per
// waitLogEvery, counting the ones it held back.
type logLimit struct {
	last time.Time // zero: nothing logged yet
	held int
}

// allow reports whether a line at now is logged, and how many were held
// back since the last one.
func (l *logLimit) allow(now time.Time) (bool, int) {
	if !l.last.IsZero() && now.Sub(l.last) < waitLogEvery {
		l.held++
		return false, 0
	}
	held := l.held
	l.last, l.held = now, 0
	return true, held
}

// Lookup resolves a host name (net.DefaultResolver.LookupHost in
// production).
type Lookup func(ctx context.Context, host string) ([]string, error)

// AwaitResolve waits until host (the value of the variable name) resolves,
// trying again with backoff, and logging the first failure and then one
// per waitLogEvery, until timeout or ctx ends. An IP address returns at
// once. Past timeout the error names the variable and the host; it is a
// failure to start, not a configuration error, since the name may have
// come a moment later.
func AwaitResolve(ctx context.Context, name, host string, timeout time.Duration, log *slog.Logger, lookup Lookup) error {
	if host == "" || net.ParseIP(host) != nil {
		return nil
	}
	if lookup == nil {
		lookup = net.DefaultResolver.LookupHost
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var b backoff
	start := time.Now()
	for {
		addrs, err := lookup(ctx, host)
		if err == nil && len(addrs) > 0 {
			if b.misses > 0 {
				log.Info("the name resolves now", "var", name, "host", host, "after", time.Since(start).Round(time.Millisecond))
			}
			return nil
		}
		if err == nil {
			err = fmt.Errorf("lookup %s: no address", host)
		}
		delay, logIt, unlogged := b.failed(time.Now())
		if logIt {
			log.Warn("waiting for a name to resolve (FPT_START_TIMEOUT bounds the wait)", "var", name, "host", host,
				"err", err, "failures_since_last_log", unlogged, "timeout", timeout)
		}
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			if ctx.Err() == context.DeadlineExceeded {
				return fmt.Errorf("%s=%s: the name does not resolve after %s (FPT_START_TIMEOUT), %d tries: %w",
					name, host, timeout, b.misses, err)
			}
			return fmt.Errorf("%s=%s: interrupted while waiting for the name to resolve: %w", name, host, ctx.Err())
		}
	}
}
