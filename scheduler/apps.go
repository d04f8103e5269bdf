package scheduler

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/control"
	"github.com/fptps/fpt/node"
	"github.com/fptps/fpt/van"
)

// Apps is the scheduler as a node with customers (ps-lite's scheduler is
// a node like the others: a SimpleApp on it sends to and receives from
// any group). It is what a customer.Set needs of its node
// (customer.Node), and customer.ControlApps: the scheduler has no data
// plane, so its customers' messages travel over the control plane, as
// control.App messages, to and from the members' control endpoints.
// Serve feeds it (Observers.Apps); it knows the members once the node
// table is out, and ends with Serve.
type Apps struct {
	cfg config.Config
	log *slog.Logger

	mu      sync.Mutex
	self    node.Info
	byID    map[node.ID]node.Info
	plane   control.Transport
	deliver func(from node.ID, priority int32, payload []byte)
	err     error

	ready  chan struct{} // closed when the node table is out
	failed chan struct{} // closed with err set: the scheduler failed
	closed chan struct{} // closed when Serve has returned
	once   sync.Once
}

// NewApps prepares the scheduler's customer port for cfg's scheduler.
func NewApps(cfg config.Config, log *slog.Logger) *Apps {
	if log == nil {
		log = slog.Default()
	}
	return &Apps{cfg: cfg, log: log, self: node.Info{ID: node.SchedulerID, Role: node.Scheduler, Host: cfg.RootURI, ControlPort: cfg.RootPort},
		ready: make(chan struct{}), failed: make(chan struct{}), closed: make(chan struct{})}
}

// started takes the node table and the plane to send on.
func (a *Apps) started(table []node.Info, plane control.Transport) {
	if a == nil {
		return
	}
	byID := make(map[node.ID]node.Info, len(table))
	for _, info := range table {
		byID[info.ID] = info
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.byID, a.plane = byID, plane
	if info, ok := byID[node.SchedulerID]; ok {
		a.self = info
	}
	close(a.ready)
}

// received takes a member's message for the scheduler's customers.
func (a *Apps) received(m *control.Message) {
	if a == nil {
		return
	}
	a.mu.Lock()
	deliver := a.deliver
	a.mu.Unlock()
	if deliver == nil {
		a.log.Warn("app message for the scheduler, which has no customers, dropped", "from", m.Sender)
		return
	}
	deliver(m.Sender, int32(uint32(m.Seq)), m.Body)
}

// end records how Serve ended: err (nil: the cluster terminated).
func (a *Apps) end(err error) {
	if a == nil {
		return
	}
	a.once.Do(func() {
		a.mu.Lock()
		a.plane = nil
		a.mu.Unlock()
		if err != nil {
			a.Fail(err)
		}
		close(a.closed)
	})
}

// Self is the scheduler's node.
func (a *Apps) Self() node.Info {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.self
}

// Info describes node id of the table. The scheduler's start returns
// before every node registered (ps-lite's waits): before the table, Info
// waits for it, so that a customer's first send goes once the members
// are known.
func (a *Apps) Info(id node.ID) (node.Info, bool) {
	select {
	case <-a.ready:
	case <-a.closed:
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	info, ok := a.byID[id]
	return info, ok
}

// Config is the scheduler's configuration.
func (a *Apps) Config() config.Config { return a.cfg }

// Logger is the scheduler's logger.
func (a *Apps) Logger() *slog.Logger { return a.log }

// Van is nil: the scheduler has no data plane (SendApp carries its
// messages).
func (a *Apps) Van() van.Transport { return nil }

// Done is closed when the scheduler failed.
func (a *Apps) Done() <-chan struct{} { return a.failed }

// Closed is closed once Serve has returned.
func (a *Apps) Closed() <-chan struct{} { return a.closed }

// Err is why the scheduler failed, or nil.
func (a *Apps) Err() error {
	select {
	case <-a.failed:
		return a.err
	default:
		return nil
	}
}

// Fail records the scheduler's customers' failure (a message for a
// customer that never came): they are told, and the scheduler logs it.
func (a *Apps) Fail(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	select {
	case <-a.failed:
		return
	default:
	}
	a.err = err
	close(a.failed)
	a.log.Error("scheduler's customers failed", "err", err)
}

// SendApp sends an app message to member to over the control plane.
func (a *Apps) SendApp(to node.ID, priority int32, payload []byte) error {
	a.mu.Lock()
	info, ok := a.byID[to]
	plane := a.plane
	a.mu.Unlock()
	switch {
	case plane == nil:
		return errors.New("scheduler: app message while the cluster is not running")
	case !ok || to == node.SchedulerID:
		return fmt.Errorf("scheduler: app message for %s, no member", to)
	case len(payload) > control.MaxMessageLen-1024:
		return fmt.Errorf("scheduler: app message of %d bytes: the control plane carries at most %d", len(payload), control.MaxMessageLen-1024)
	}
	return plane.Send(info.ControlEndpoint(), &control.Message{Command: control.App, Sender: node.SchedulerID, Target: to, Seq: uint64(uint32(priority)), Body: payload})
}

// OnApp installs deliver, which takes the members' messages for the
// scheduler's customers.
func (a *Apps) OnApp(deliver func(from node.ID, priority int32, payload []byte)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.deliver = deliver
}
