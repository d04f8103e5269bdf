package scheduler

import (
	"context"
	"fmt"
	"time"

	"github.com/fptps/fpt/control"
	"github.com/fptps/fpt/node"
)

// startFailure is the scheduler's error when a node reports, while the
// cluster assembles, that it cannot start (its port is taken, its table is
// bad): the scheduler gives up at once and tells the registered nodes,
// rather than letting everyone wait out FPT_START_TIMEOUT. The node has no
// id yet; Nodes[0], when present, names it by role and address.
func startFailure(m *control.Message) error {
	name := m.Sender.String()
	if len(m.Nodes) == 1 {
		name = m.Nodes[0].String()
	}
	return &startFailedError{fmt.Errorf("scheduler: %s %s", name, m.Text)}
}

// startFailedError marks the scheduler's error when a node could not start.
type startFailedError struct{ error }

func (e *startFailedError) Unwrap() error { return e.error }

// lateGrace is how long a scheduler that gave up on a start-up failure
// still answers registrations: nodes launched beside the one that failed
// may register just after its notice, and would otherwise wait out their
// FPT_START_TIMEOUT for a table that never comes.
const lateGrace = 5 * time.Second

// refuseLate answers every registration for lateGrace with the failure.
func (sh *shell) refuseLate(ctx context.Context, err error) {
	t := time.NewTimer(lateGrace)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			return
		case m, ok := <-sh.plane.Incoming():
			if !ok {
				return
			}
			if m.Command == control.AddNode && len(m.Nodes) == 1 {
				_ = sh.plane.Send(m.Nodes[0].ControlEndpoint(), &control.Message{Command: control.NodeFailed, Sender: node.SchedulerID, Target: node.SchedulerID, Text: err.Error()})
			}
		}
	}
}

// culprit is the node a NodeFailed names: its Target, or, from a node that
// failed before it knew its id (a node table it rejected), the table's
// entry at the address in Nodes[0].
func culprit(m *control.Message, table []node.Info) node.ID {
	if m.Target != 0 || len(m.Nodes) != 1 {
		return m.Target
	}
	for _, info := range table {
		if info.Host == m.Nodes[0].Host && info.ControlPort == m.Nodes[0].ControlPort {
			return info.ID
		}
	}
	return 0
}
