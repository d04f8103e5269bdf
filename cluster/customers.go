package cluster

import (
	"fmt"
	"sync"

	"github.com/fptps/fpt/control"
)

// Customers are a worker process's further customers: ps-lite lets
// several threads of one worker process each call Start(customer_id) and
// own a KVWorker, and counts each as one of DMLC_NUM_WORKER workers. The
// process is one node (one id, one rank, one connection per peer); each
// customer after its first registers with the scheduler beside it
// (AddNode, Seq the customer id + 1), and the cluster starts once the
// registrations, customers included, make DMLC_NUM_WORKER. Add may come
// before the node registered (it waits for its own AddNode) or while it
// waits for its table, not after.
type Customers struct {
	mu    sync.Mutex
	ids   []int
	send  func(id int) error // set while the node waits for its table
	after bool               // the table came: too late
}

// Add registers customer id as a further worker of this process.
func (c *Customers) Add(id int) error {
	if id < 0 {
		return fmt.Errorf("cluster: customer %d: ids are not negative", id)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.after {
		return fmt.Errorf("cluster: customer %d started after the cluster did: DMLC_NUM_WORKER was met without it (every worker customer must start while the cluster assembles)", id)
	}
	for _, have := range c.ids {
		if have == id {
			return fmt.Errorf("cluster: customer %d started twice", id)
		}
	}
	c.ids = append(c.ids, id)
	if c.send != nil {
		return c.send(id)
	}
	return nil
}

// attach sends the customers added so far, and later ones as they come,
// with send: the node has registered.
func (c *Customers) attach(send func(id int) error) error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.send = send
	for _, id := range c.ids {
		if err := send(id); err != nil {
			return err
		}
	}
	return nil
}

// detach ends the registrations: the table came (or the start failed).
func (c *Customers) detach() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.send, c.after = nil, true
}

// SetCustomers gives a worker the customers beyond its first that
// register beside it (ps-lite's several worker customers per process).
// Call it before Start.
func (n *Member) SetCustomers(c *Customers) { n.customers = c }

// customerMessage is the registration of customer id of the node self.
func customerMessage(m *control.Message, id int) *control.Message {
	return &control.Message{Command: control.AddNode, Nodes: m.Nodes, Seq: uint64(id) + 1}
}
