package cluster

import (
	"maps"

	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/localagg"
	"github.com/fptps/fpt/node"
)

// readHosts takes the hosts the table's nodes named (after the stamp of
// a NodeTable's body; none from a scheduler that sent none), in the
// order of nodes, the table as sent, and returns the bytes after them.
func readHosts(nodes []node.Info, b []byte) (map[node.ID]string, []byte, error) {
	hosts, rest, err := localagg.ParseHosts(b, len(nodes), config.MaxHostIDLen)
	if err != nil {
		return nil, nil, err
	}
	return hostsByID(nodes, hosts), rest, nil
}

// hostsByID maps the hosts named, in the order of nodes, to their ids.
func hostsByID(nodes []node.Info, hosts []string) map[node.ID]string {
	named := make(map[node.ID]string, len(nodes))
	for i, info := range nodes {
		if hosts[i] != "" {
			named[info.ID] = hosts[i]
		}
	}
	return named
}

// joinGroups takes what the scheduler tells a joining node of the local
// groups, b after its table's layout (localagg.AppendJoined; none from a
// scheduler that tells none), into t: the hosts the nodes named, from
// which it forms the groups every member formed, and whether they sum.
func (t *topology) joinGroups(nodes []node.Info, b []byte) error {
	j, told, err := localagg.ParseJoined(b, len(nodes), config.MaxHostIDLen)
	if err != nil || !told {
		return err
	}
	t.hosts = hostsByID(nodes, j.Hosts)
	j.Hosts = nil
	t.joined = &j
	return nil
}

// joinerHost is hosts with the host a node joining the running job named
// (FPT_HOST_ID, in the scheduler's NodeJoined; "" for none: its address
// names it), for its local group: a copy where it adds one. An oversized
// name is ignored, as the scheduler ignores it.
func joinerHost(hosts map[node.ID]string, id node.ID, named string) map[node.ID]string {
	if named == "" || len(named) > config.MaxHostIDLen {
		return hosts
	}
	out := make(map[node.ID]string, len(hosts)+1)
	maps.Copy(out, hosts)
	out[id] = named
	return out
}

// HostOf is the host node id runs on, for its local group: the one it
// named (FPT_HOST_ID), else its address; "" for a node not in the table.
func (n *Member) HostOf(id node.ID) string {
	t := n.topo.Load()
	if t == nil {
		return ""
	}
	if h, ok := t.hosts[id]; ok {
		return h
	}
	if info, ok := t.byID[id]; ok {
		return info.Host
	}
	return ""
}

// LocalGroups are the workers' local groups (package localagg), from the
// hosts of the node table.
func (n *Member) LocalGroups() ([]localagg.Group, error) {
	var ms []localagg.Member
	for _, id := range n.Workers() {
		ms = append(ms, localagg.Member{ID: id, Host: n.HostOf(id)})
	}
	return localagg.Groups(ms)
}

// SumsLocally reports whether the workers sum on their hosts
// (config.Config.SumsLocally: FPT_LOCAL_AGGREGATION=on, or auto with a host
// of several workers), from the groups of the node table, so that every
// node decides alike.
func (n *Member) SumsLocally() bool {
	if t := n.topo.Load(); t != nil && t.joined != nil {
		// Joined a running job: as the members decided it at the start.
		return t.joined.Sums
	}
	groups, err := n.LocalGroups()
	if err != nil {
		groups = nil // on still sums, and fails naming the error
	}
	cfg := n.Config()
	return cfg.SumsLocally(localagg.Sizes(groups))
}

// maxCheckMembers bounds the group a worker's shared-memory check
// reserves for: every worker of a large job cannot share one host, and
// each worker's check reserves (and zeroes) its segment at once.
const maxCheckMembers = 16

// checkMembers is the group a worker of a job of workers workers checks
// its shared memory for: all of them, at least two, at most
// maxCheckMembers.
func checkMembers(workers int) int { return min(max(workers, 2), maxCheckMembers) }

// hostNamed is the host a registering node names (FPT_HOST_ID; empty:
// its address names it). A worker that may sum locally and cannot make a
// group's segment where they live (a missing, unwritable or full
// FPT_LOCAL_AGGREGATION_DIR) names its host with localagg.NoSharedMemory:
// it is then alone in its group, on the network path, and the others of
// its host sum without it. The check reserves the segment of the largest
// group the host may form (checkMembers): one that held a group of two
// but not the host's own group (a container's 64 MB /dev/shm and four
// workers) failed the job at the group's start. Memory another process
// takes after the check is still an error there.
func (n *Member) hostNamed(self node.Info) string {
	cfg := n.cfg
	if cfg.Role != node.Worker || cfg.LocalAggregation == config.LocalAggregationOff {
		return cfg.HostID
	}
	dir := cfg.SegmentDir()
	err := localagg.Check(dir, localagg.GroupLayout(checkMembers(cfg.NumWorkers), cfg.PartitionBytes))
	if err == nil {
		return cfg.HostID
	}
	host := cfg.HostID
	if host == "" {
		host = self.Host
	}
	n.log.Warn("local aggregation: no shared memory for a group's segment here, so this worker sums alone, over the network", "dir", dir, "err", err)
	return host + localagg.NoSharedMemory
}
