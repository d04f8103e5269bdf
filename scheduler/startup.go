package scheduler

import (
	"fmt"

	"github.com/fptps/fpt/control"
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
