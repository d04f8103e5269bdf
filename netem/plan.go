package netem

import (
	"bytes"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

const (
	// MaxHosts is the most hosts a Network has: addresses 198.18.0.1 to
	// 198.18.0.254.
	MaxHosts = 254
	// iface is every host's interface, the same everywhere so that one
	// command line fits every host.
	iface = "eth0"
	// prefixLen is the network's mask: the whole benchmarking range
	// 198.18.0.0/15 (RFC 2544), which nothing real routes.
	prefixLen = 15
	// ifNameMax is IFNAMSIZ less the terminating NUL.
	ifNameMax = 15
	// maxSlots is how many networks one process can hold at once, one
	// letter each.
	maxSlots = 26
)

// addr is host i's address.
func addr(i int) string { return "198.18.0." + strconv.Itoa(i+1) }

// names are a network's object names. They all start with "fpt", the
// owning process's pid and a letter (the slot) telling that process's
// networks apart, so that a later process can tell leftovers of a dead
// one from a live network.
type names struct{ prefix string }

func namesFor(pid, slot int) names {
	return names{prefix: "fpt" + strconv.Itoa(pid) + string(rune('a'+slot))}
}

func (n names) bridge() string         { return n.prefix + "b" }
func (n names) namespace(i int) string { return n.prefix + "h" + strconv.Itoa(i) }

// veth is the root side of host i's veth pair, enslaved to the bridge; the
// other side is iface inside the host's namespace.
func (n names) veth(i int) string { return n.prefix + "v" + strconv.Itoa(i) }

// leftoverRe matches every name the package gives; the group is the pid.
var leftoverRe = regexp.MustCompile(`^fpt([0-9]+)[a-z][bhv][0-9]*$`)

// ownerPid returns the pid in a name the package gave, or false for any
// other name.
func ownerPid(name string) (int, bool) {
	m := leftoverRe.FindStringSubmatch(name)
	if m == nil {
		return 0, false
	}
	pid, err := strconv.Atoi(m[1])
	return pid, err == nil && pid > 0
}

// step is one command of a plan: what it does, in words for errors, its
// argument vector (args[0] is "ip" or "tc"), and what it reads on its
// standard input (tc -batch's commands; "" for none).
type step struct {
	what  string
	args  []string
	stdin string
}

// setupPlan lists the commands that build a network of len(hosts) hosts.
// The first one creates the bridge, which claims the names: it fails if
// another network holds them. tbf shapes egress only, so a host's upload
// is shaped on its own interface and its download on the root side of its
// veth, which sends into the host.
func setupPlan(n names, hosts []HostSpec) ([]step, error) {
	if len(hosts) < 1 || len(hosts) > MaxHosts {
		return nil, fmt.Errorf("netem: %d hosts (want 1 to %d)", len(hosts), MaxHosts)
	}
	if name := n.veth(len(hosts) - 1); len(name) > ifNameMax {
		return nil, fmt.Errorf("netem: interface name %s is longer than %d bytes", name, ifNameMax)
	}
	br := n.bridge()
	plan := []step{
		{what: "add bridge " + br, args: []string{"ip", "link", "add", br, "type", "bridge"}},
		{what: "bring up bridge " + br, args: []string{"ip", "link", "set", br, "up"}},
	}
	for i, h := range hosts {
		up, down, flowCap, err := hostRates(h)
		if err != nil {
			return nil, fmt.Errorf("netem: host %d: %w", i, err)
		}
		ns, veth := n.namespace(i), n.veth(i)
		plan = append(plan,
			step{what: "add namespace " + ns, args: []string{"ip", "netns", "add", ns}},
			step{what: "add veth pair " + veth + " to " + ns, args: []string{"ip", "link", "add", veth, "type", "veth", "peer", "name", iface, "netns", ns}},
			step{what: "attach " + veth + " to " + br, args: []string{"ip", "link", "set", veth, "master", br}},
			step{what: "bring up " + veth, args: []string{"ip", "link", "set", veth, "up"}},
			step{what: "address " + iface + " in " + ns, args: []string{"ip", "-n", ns, "addr", "add", addr(i) + "/" + strconv.Itoa(prefixLen), "dev", iface}},
			step{what: "bring up " + iface + " in " + ns, args: []string{"ip", "-n", ns, "link", "set", iface, "up"}},
			step{what: "bring up lo in " + ns, args: []string{"ip", "-n", ns, "link", "set", "lo", "up"}},
		)
		plan = append(plan, uploadPlan(ns, h, up, flowCap)...)
		if down > 0 {
			plan = append(plan, step{what: "shape download of " + ns + " to " + h.Down,
				args: append([]string{"tc", "qdisc", "add", "dev", veth, "root"}, tbfArgs(down)...)})
		}
	}
	return plan, nil
}

// uploadPlan shapes host namespace ns's upload: a tbf at up, or with a
// flow cap the HTB of flowCapPlan; nothing when up is 0.
func uploadPlan(ns string, h HostSpec, up, flowCap uint64) []step {
	switch {
	case up == 0:
		return nil
	case flowCap > 0:
		return []step{flowCapPlan([]string{"tc", "-n", ns}, iface, "shape upload of "+ns+" to "+h.Up+", "+h.FlowCap+" a flow", up, flowCap)}
	}
	return []step{{what: "shape upload of " + ns + " to " + h.Up,
		args: append([]string{"tc", "-n", ns, "qdisc", "add", "dev", iface, "root"}, tbfArgs(up)...)}}
}

// ratePlan lists the commands that reshape host i of a network to h, on
// the devices setupPlan shapes. Each side's root qdisc is deleted (the
// executor ignores a delete that finds none: the side was unlimited) and,
// for a limited side, a new tbf added. Not "tc qdisc change" or "replace":
// those keep the queued packets, and a packet queued under a larger burst
// (a 64 KiB GSO segment, say) that no longer fits the new one is never
// sent, stalling the link for good. Deleting drops what was queued, as a
// real link that slows down would; TCP sends it again.
func ratePlan(n names, i int, h HostSpec) ([]step, error) {
	up, down, flowCap, err := hostRates(h)
	if err != nil {
		return nil, fmt.Errorf("netem: host %d: %w", i, err)
	}
	ns, veth := n.namespace(i), n.veth(i)
	plan := []step{{what: "unshape upload of " + ns, args: []string{"tc", "-n", ns, "qdisc", "del", "dev", iface, "root"}}}
	plan = append(plan, uploadPlan(ns, h, up, flowCap)...)
	plan = append(plan, step{what: "unshape download of " + ns, args: []string{"tc", "qdisc", "del", "dev", veth, "root"}})
	if down > 0 {
		plan = append(plan, step{what: "shape download of " + ns + " to " + h.Down,
			args: append([]string{"tc", "qdisc", "add", "dev", veth, "root"}, tbfArgs(down)...)})
	}
	return plan, nil
}

// hostRates returns a host's rates in bits per second, 0 for unlimited.
func hostRates(h HostSpec) (up, down, flowCap uint64, err error) {
	if h.Up != "" {
		if up, err = parseRate(h.Up); err != nil {
			return 0, 0, 0, fmt.Errorf("upload: %w", err)
		}
	}
	if h.Down != "" {
		if down, err = parseRate(h.Down); err != nil {
			return 0, 0, 0, fmt.Errorf("download: %w", err)
		}
	}
	if h.FlowCap != "" {
		if flowCap, err = parseRate(h.FlowCap); err != nil {
			return 0, 0, 0, fmt.Errorf("flow cap: %w", err)
		}
		if up == 0 || flowCap > up {
			return 0, 0, 0, fmt.Errorf("flow cap %s needs an upload rate at least as high (upload %q)", h.FlowCap, h.Up)
		}
	}
	return up, down, flowCap, nil
}

// teardownPlan lists the commands that remove a network of k hosts,
// whatever part of it exists: the executor ignores objects already gone.
// Deleting a namespace deletes the veth inside it and so the pair, unless a
// process still holds the namespace; deleting the root side is then what
// removes the pair.
func teardownPlan(n names, k int) []step {
	var plan []step
	for i := range k {
		plan = append(plan, step{what: "delete namespace " + n.namespace(i), args: []string{"ip", "netns", "del", n.namespace(i)}})
	}
	for i := range k {
		plan = append(plan, step{what: "delete veth " + n.veth(i), args: []string{"ip", "link", "del", n.veth(i)}})
	}
	return append(plan, step{what: "delete bridge " + n.bridge(), args: []string{"ip", "link", "del", n.bridge()}})
}

// parseNetnsList returns the names in "ip netns list" output, whose lines
// are "NAME" or "NAME (id: N)".
func parseNetnsList(out string) []string {
	var list []string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			list = append(list, f[0])
		}
	}
	return list
}

// parseLinkList returns the interface names in "ip -o link show" output,
// whose lines are "N: NAME[@PEER]: <FLAGS> ...".
func parseLinkList(out string) []string {
	var list []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		list = append(list, name)
	}
	return list
}

// parsePids returns the pids in "ip netns pids" output, one a line.
func parsePids(out string) []int {
	var pids []int
	for _, f := range strings.Fields(out) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
			pids = append(pids, pid)
		}
	}
	return pids
}

// leftovers picks, out of existing names, those a dead process of this
// package left behind.
func leftovers(existing []string, alive func(pid int) bool) []string {
	var stale []string
	for _, name := range existing {
		if pid, ok := ownerPid(name); ok && !alive(pid) {
			stale = append(stale, name)
		}
	}
	return stale
}

// zombie tells whether /proc/PID/stat content is a zombie's: the state
// follows the command name, which is in parentheses and may hold any byte.
func zombie(stat []byte) bool {
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}
