// Package node defines the identities of an fpt cluster: roles, the ps-lite
// node-id scheme, groups for barriers, and the description of a node that the
// scheduler hands to everyone.
//
// Ids follow ps-lite on purpose, so that logs and tools read the same:
// the scheduler is 1, server rank r is 8+2r, worker rank r is 9+2r, and the
// groups 1 (scheduler), 2 (servers) and 4 (workers) combine as bit sets.
package node

import (
	"fmt"
	"net"
	"strconv"
)

// Role is what a node does in the cluster.
type Role uint8

// The three roles of ps-lite.
const (
	Scheduler Role = 1
	Server    Role = 2
	Worker    Role = 3
)

// ParseRole reads a role the way DMLC_ROLE spells it.
func ParseRole(s string) (Role, error) {
	switch s {
	case "scheduler":
		return Scheduler, nil
	case "server":
		return Server, nil
	case "worker":
		return Worker, nil
	}
	return 0, fmt.Errorf("unknown role %q (want scheduler, server or worker)", s)
}

func (r Role) String() string {
	switch r {
	case Scheduler:
		return "scheduler"
	case Server:
		return "server"
	case Worker:
		return "worker"
	}
	return "role(" + strconv.Itoa(int(r)) + ")"
}

// ID is a node id in ps-lite's numbering.
type ID uint32

// SchedulerID is the scheduler's id.
const SchedulerID ID = 1

// Group is a set of roles, used to address barriers and broadcasts.
type Group uint8

// ps-lite's groups; unions are their bitwise or.
const (
	SchedulerGroup Group = 1
	ServerGroup    Group = 2
	WorkerGroup    Group = 4
	AllGroup       Group = SchedulerGroup | ServerGroup | WorkerGroup
)

// ServerID is the id of server rank r.
func ServerID(rank int) ID { return ID(8 + 2*rank) }

// WorkerID is the id of worker rank r.
func WorkerID(rank int) ID { return ID(9 + 2*rank) }

// RankID is the id of the given rank of role r: a server's, else a
// worker's.
func RankID(r Role, rank int) ID {
	if r == Server {
		return ServerID(rank)
	}
	return WorkerID(rank)
}

// Role tells the role an id belongs to; ok is false for ids that name no
// node (0, 2..7, which ps-lite reserves for groups).
func (id ID) Role() (r Role, ok bool) {
	switch {
	case id == SchedulerID:
		return Scheduler, true
	case id >= 8 && id%2 == 0:
		return Server, true
	case id >= 9:
		return Worker, true
	}
	return 0, false
}

// Rank is the rank of a server or worker id, and 0 for the scheduler.
func (id ID) Rank() int {
	if id < 8 {
		return 0
	}
	return int(id-8) / 2
}

// InGroup reports whether the node with this id belongs to g.
func (id ID) InGroup(g Group) bool {
	r, ok := id.Role()
	if !ok {
		return false
	}
	return g&RoleGroup(r) != 0
}

func (id ID) String() string {
	r, ok := id.Role()
	if !ok {
		return "node(" + strconv.Itoa(int(id)) + ")"
	}
	if r == Scheduler {
		return "scheduler(1)"
	}
	return r.String() + strconv.Itoa(id.Rank()) + "(" + strconv.Itoa(int(id)) + ")"
}

// RoleGroup is the group that holds exactly the nodes of role r.
func RoleGroup(r Role) Group {
	switch r {
	case Scheduler:
		return SchedulerGroup
	case Server:
		return ServerGroup
	case Worker:
		return WorkerGroup
	}
	return 0
}

// Info describes one node: who it is and where its two planes listen.
// The data plane listens on ControlPort+1 (DataPort is carried explicitly so
// that a node may be told otherwise, e.g. in tests).
type Info struct {
	ID          ID
	Role        Role
	Host        string
	ControlPort int
	DataPort    int
}

// ControlEndpoint is the ZeroMQ endpoint of the node's control socket.
func (n Info) ControlEndpoint() string {
	return "tcp://" + net.JoinHostPort(n.Host, strconv.Itoa(n.ControlPort))
}

// DataAddr is the TCP address of the node's data plane.
func (n Info) DataAddr() string {
	return net.JoinHostPort(n.Host, strconv.Itoa(n.DataPort))
}

func (n Info) String() string {
	name := n.ID.String()
	if n.ID == 0 {
		name = n.Role.String()
	}
	return name + "@" + net.JoinHostPort(n.Host, strconv.Itoa(n.ControlPort))
}
