package cluster_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fptps/fpt/internal/memcluster"
	"github.com/fptps/fpt/node"
)

// Heartbeats on in-memory clusters, fast: a node the scheduler stops
// hearing, and a node that stops hearing the scheduler, each end the whole
// cluster with an error that says which and why, and no member waits on.
func TestHeartbeatFailures(t *testing.T) {
	tests := []struct {
		name string
		// cut silences a control route of c.
		cut  func(c *memcluster.Cluster)
		want []string // in every worker's error
	}{
		{"the scheduler stops hearing a server", func(c *memcluster.Cluster) {
			c.Control.Hold(c.ControlPort(node.ServerID(0)), c.ControlPort(node.SchedulerID))
		}, []string{node.ServerID(0).String(), "no heartbeat"}},
		{"a worker stops hearing the scheduler", func(c *memcluster.Cluster) {
			c.Control.Hold(c.ControlPort(node.SchedulerID), c.ControlPort(node.WorkerID(1)))
		}, []string{"scheduler", "unreachable"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := memcluster.Start(context.Background(), memcluster.Options{Servers: 2, Workers: 2, Env: map[string]string{
				"PS_HEARTBEAT_INTERVAL": "0.02", "PS_HEARTBEAT_TIMEOUT": "0.2",
			}})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			tt.cut(c)
			for _, w := range c.Workers {
				m := w.Node()
				select {
				case <-m.Done():
				case <-time.After(time.Minute):
					t.Fatalf("worker %d still running a minute after the cut", w.Rank())
				}
				t.Logf("worker %d: %v", w.Rank(), m.Err())
				for _, s := range tt.want {
					if !strings.Contains(m.Err().Error(), s) {
						t.Errorf("worker %d failed with %v; want it to say %q", w.Rank(), m.Err(), s)
					}
				}
			}
		})
	}
}
