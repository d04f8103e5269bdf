package scheduler

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/fptps/fpt/config"
	"github.com/fptps/fpt/control"
	"github.com/fptps/fpt/lb"
	"github.com/fptps/fpt/localagg"
	"github.com/fptps/fpt/node"
)

// noteHost records the host a registering node names in its AddNode's
// Text (its FPT_HOST_ID), by the connection it came over.
func (c *core) noteHost(m *control.Message) {
	host := namedIn(m)
	if host == "" {
		return
	}
	if c.hostIDs == nil {
		c.hostIDs = map[string]string{}
	}
	c.hostIDs[m.Origin] = host
}

// namedIn is the host an AddNode names (its Text). An empty or oversized
// one is ignored: the node's address names its host then.
func namedIn(m *control.Message) string {
	if len(m.Text) > config.MaxHostIDLen {
		return ""
	}
	return m.Text
}

// namedHost is the host node info named (FPT_HOST_ID; "" for none): in
// its registration at the job's start, or in the one it joined by.
func (c *core) namedHost(info node.Info) string {
	if h, ok := c.joinerHosts[info.ID]; ok {
		return h
	}
	return c.hostIDs[c.reg.originOf(info)]
}

// noteJoiner records the host worker or server info, joining the running
// job, named in its AddNode m: every node of the job learns it (the
// joiner from its table, the members from NodeJoined), so that a joining
// worker joins its host's group from its first iteration on, at every
// node alike.
func (c *core) noteJoiner(info node.Info, m *control.Message) {
	host := namedIn(m)
	if c.joinerHosts == nil {
		c.joinerHosts = map[node.ID]string{}
	}
	c.joinerHosts[info.ID] = host
	if c.hostOf == nil {
		return
	}
	if host == "" {
		host = info.Host
	}
	c.hostOf[info.ID] = host
}

// formGroups forms the workers' local groups from the table: by the host
// each named, else by address. It logs them; a failure (which the table's
// checks make impossible) only leaves the job without groups.
func (c *core) formGroups() {
	members := make([]localagg.Member, 0, len(c.table))
	c.hostOf = make(map[node.ID]string, len(c.table))
	for _, info := range c.table {
		host := c.namedHost(info)
		if host == "" {
			// No name: the address names the host.
			host = info.Host
		}
		members = append(members, localagg.Member{ID: info.ID, Host: host})
		c.hostOf[info.ID] = host
	}
	groups, err := localagg.Groups(members)
	if err != nil {
		c.log.Warn("no local groups", "err", err)
		return
	}
	c.groups = groups
	c.showGroups(groups)
	sizes := make([]string, len(groups))
	for i, n := range localagg.Sizes(groups) {
		sizes[i] = strconv.Itoa(n)
	}
	c.log.Info("local groups", "hosts", len(groups), "workers_per_host", strings.Join(sizes, ","),
		"local_aggregation", c.cfg.LocalAggregation, "sums_locally", c.sumsLocally())
}

// showGroups puts the workers' groups on the status page and the metrics.
func (c *core) showGroups(groups []localagg.Group) {
	shown := map[node.ID]string{}
	for _, g := range groups {
		for _, w := range g.Workers {
			shown[w] = fmt.Sprintf("%s (%d workers)", g.Host, len(g.Workers))
			if len(g.Workers) == 1 {
				shown[w] = g.Host + " (alone)"
			}
		}
	}
	c.obs.rec.Groups(shown)
	c.obs.Metrics.LocalGroups(groups)
}

// joinerGrouped shows the groups of the workers once worker info, which
// joined the running job, is in its host's: as every node forms them
// from the decision that admits it (localagg.GroupsOver). Whether the
// workers sum stays what the job decided at its start (c.groups).
func (c *core) joinerGrouped(info node.Info) {
	if c.hostOf == nil || !c.sumsLocally() {
		return
	}
	var ws []node.ID
	for _, n := range c.table {
		if n.Role == node.Worker {
			ws = append(ws, n.ID)
		}
	}
	groups, err := localagg.GroupsOver(ws, func(id node.ID) string { return c.hostOf[id] })
	if err != nil {
		c.log.Warn("no local groups after a join", "err", err)
		return
	}
	c.showGroups(groups)
	g := localagg.GroupOf(groups, info.ID)
	c.log.Info("joining worker in its host's local group", "node", info, "host", g.Host, "group", g.Workers)
}

// namedHosts lists the host each node of the table named (FPT_HOST_ID),
// in the table's order: every member forms the same groups from it.
func (c *core) namedHosts() []string {
	hosts := make([]string, len(c.table))
	for i, info := range c.table {
		hosts[i] = c.namedHost(info)
	}
	return hosts
}

// sumsLocally reports whether the workers sum on their hosts, as every
// node decides it from the table (cluster.Member.SumsLocally).
func (c *core) sumsLocally() bool {
	return c.cfg.SumsLocally(localagg.Sizes(c.groups))
}

// lbHosts places the servers and workers on their hosts for the LB, which
// balances by host when the workers sum on their hosts (nil otherwise:
// by node).
func (c *core) lbHosts() *lb.Hosts {
	if !c.sumsLocally() || c.hostOf == nil {
		return nil
	}
	h := &lb.Hosts{Of: make(map[node.ID]int, len(c.table)), Local: true}
	index := map[string]int{}
	c.lbHostIndex = index
	for _, info := range c.table {
		if info.Role != node.Server && info.Role != node.Worker {
			continue
		}
		named := c.hostOf[info.ID]
		name := localagg.HostName(named) // where its link is
		if name != named {
			// No shared memory: it sums alone on its host.
			if h.Alone == nil {
				h.Alone = map[node.ID]bool{}
			}
			h.Alone[info.ID] = true
		}
		i, ok := index[name]
		if !ok {
			i = len(index)
			index[name] = i
		}
		h.Of[info.ID] = i
	}
	return h
}

// placeJoiner tells the LB, when it balances by host, the host of worker
// info, which joined the running job: a host of the job's, or a new one.
// It sums in its host's group, unless it had no shared memory.
func (c *core) placeJoiner(info node.Info) {
	if c.lbHostIndex == nil {
		return
	}
	named := c.hostOf[info.ID]
	if named == "" {
		named = info.Host
	}
	name := localagg.HostName(named)
	i, ok := c.lbHostIndex[name]
	if !ok {
		i = len(c.lbHostIndex)
		c.lbHostIndex[name] = i
	}
	c.lb.PlaceOnHost(info.ID, i, name != named)
}

// joinedGroups is what a node joining the running job is told of the
// local groups: whether the workers sum on their hosts, as every member
// decided it from the table the job started with, and the hosts the
// nodes of the table it gets named, from which it forms the groups the
// members formed (a retry re-forms them from its decision's workers, as
// the members do).
func (c *core) joinedGroups() localagg.Joined {
	return localagg.Joined{Sums: c.sumsLocally(), Hosts: c.namedHosts()}
}
