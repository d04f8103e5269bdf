package control

import (
	"log/slog"
	"sync"
	"time"
)

// rejectLogEvery bounds how often refusals are logged: a flood of forged
// messages must not become a flood of log lines.
const rejectLogEvery = 5 * time.Second

// Rejecter counts refused connections and messages and logs them at a
// bounded rate: at most one line per rejectLogEvery, saying how many were
// refused since the last one. It is safe for concurrent use; the scheduler
// and cluster.Member use it for the messages they refuse.
type Rejecter struct {
	log   *slog.Logger
	count func(reason string)

	mu         sync.Mutex
	last       time.Time
	suppressed int
}

// NewRejecter returns a Rejecter that logs to log and calls count (if not
// nil) for every refusal.
func NewRejecter(log *slog.Logger, count func(reason string)) *Rejecter {
	if log == nil {
		log = slog.Default()
	}
	return &Rejecter{log: log, count: count}
}

// Count records one refusal for reason (a short fixed word) without
// logging it, for refusals logged elsewhere.
func (r *Rejecter) Count(reason string) {
	if r != nil && r.count != nil {
		r.count(reason)
	}
}

// Reject records one refusal for reason and logs it, with args, unless a
// refusal was logged less than rejectLogEvery ago.
func (r *Rejecter) Reject(reason string, args ...any) {
	if r == nil {
		return
	}
	if r.count != nil {
		r.count(reason)
	}
	r.mu.Lock()
	now := time.Now()
	if now.Sub(r.last) < rejectLogEvery {
		r.suppressed++
		r.mu.Unlock()
		return
	}
	r.last = now
	n := r.suppressed
	r.suppressed = 0
	r.mu.Unlock()
	r.log.Warn("control: refused", append([]any{"reason", reason, "refused_since_last_log", n}, args...)...)
}
