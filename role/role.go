// Package role wires what a server and a worker both run beside their own
// logic: the node's aggregator role (package aggregator), its customers
// (package customer: the messages ps-lite's C++ API is built on) and, with
// the LB on, its LB agent (package lbagent). Both nodes build, start and stop
// them the same way; this is the one place that does it.
package role

import (
	"context"
	"fmt"

	"github.com/fptps/fpt/aggregator"
	"github.com/fptps/fpt/cluster"
	"github.com/fptps/fpt/customer"
	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/lbagent"
	"github.com/fptps/fpt/node"
)

// Base is a server's or worker's aggregator, customers and LB agent.
type Base struct {
	node      *cluster.Member
	Agg       *aggregator.Aggregator
	Customers *customer.Set
	Agent     *lbagent.Agent // nil when the LB is off
}

// New makes n's aggregator and, when n's configuration turns the LB on,
// its agent. Call it before Start: the agent installs n's control handler,
// which must be there when directives begin to arrive. deliver and apply
// are a worker's (its own copy of the sums it aggregates, the directives
// it follows); a server passes nil for both.
//
// With FPT_ON_SERVER_LOSS=retry or FPT_ON_WORKER_LOSS=continue the agent
// runs even with the LB off (a retry rides on its grants). Every
// directive goes to the aggregator (a retry drops the partial sums it
// supersedes; a decision naming workers changes whose pushes the sums add
// up: aggregator.Follow). A server leaving the job fails this node if its
// customers depend on the servers it had; left hears of every node that
// leaves (cluster.Member.OnLeft).
func New(n *cluster.Member, deliver aggregator.Deliver, apply lbagent.Apply, left func(id node.ID, graceful bool) error) *Base {
	b := &Base{node: n, Agg: aggregator.New(n, deliver), Customers: customer.New(n)}
	cfg := n.Config()
	if cfg.Grants() {
		b.Agent = lbagent.New(n, func(d lb.Directive) error {
			b.Agg.Follow(d)
			if apply != nil {
				return apply(d)
			}
			return nil
		})
	}
	n.OnLeft(func(id node.ID, graceful bool) error {
		if r, _ := id.Role(); r == node.Server && b.Customers.Used() {
			return fmt.Errorf("role: server %s left the job, and ps-lite's KVWorker and KVServer cannot go on without it (FPT_ON_SERVER_LOSS=retry covers FPTPush and FPTPull only)", id)
		}
		if left != nil {
			return left(id, graceful)
		}
		return nil
	})
	return b
}

// Start joins the cluster with h as the node's frame handler and, once it
// has, starts the agent measuring.
func (b *Base) Start(ctx context.Context, h cluster.Handler) error {
	if err := b.node.Start(ctx, h); err != nil {
		return err
	}
	b.Agg.Started()
	if b.Agent != nil {
		b.Agent.Start()
	}
	return nil
}

// Close stops the agent and the customers (waiting for their handlers to
// return); it is idempotent.
func (b *Base) Close() {
	if b.Agent != nil {
		b.Agent.Close()
	}
	b.Customers.Close()
}
