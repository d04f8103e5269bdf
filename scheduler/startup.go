package scheduler

import (
	"fmt"

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
	return fmt.Errorf("scheduler: %s %s", name, m.Text)
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
