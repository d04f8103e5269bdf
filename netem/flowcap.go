package netem

import (
	"fmt"
	"strconv"
	"strings"
)

// A per-flow cap emulates a network where one TCP flow cannot fill the
// link (a provider's per-flow limit, one ECMP path of many): each
// connection gets at most HostSpec.FlowCap of the host's upload, while
// several together get up to Up. fq's maxrate does that on kernels that
// have sch_fq; this one is built from what every kernel with tbf has,
// HTB and the u32 classifier, so that it runs where fq does not: an HTB
// class per bucket of flows, each capped at FlowCap under one parent at
// the link's rate, and u32 hashing a TCP segment to its bucket by the low
// bits of its connection's ephemeral port (the source port if it is 32768
// or above, else the destination port). Two connections share a cap only
// if their ephemeral ports agree modulo flowBuckets, which
// ports handed out one after the other do not. So that the rule picks the
// right port, the nodes of a capped network listen below 32768.

// flowBuckets is the classes a capped upload has: a power of two, at most
// 256 (u32's largest hash table); each costs three tc commands to set up.
const flowBuckets = 64

// ephemeralFrom is where the kernel's ephemeral ports start
// (net.ipv4.ip_local_port_range is 32768 to 60999 by default).
const ephemeralFrom = 32768

// flowCapPlan is the command that shapes device dev (tc's leading
// arguments in tcArgs: "tc" or "tc -n NS") to up bits per second with
// each TCP connection capped at flowCap: one tc reading its 2+3*flowBuckets
// commands from its standard input (-batch), rather than a process each.
func flowCapPlan(tcArgs []string, dev, what string, up, flowCap uint64) step {
	var lines []string
	tc := func(args ...string) { lines = append(lines, strings.Join(args, " ")) }
	rate := func(bits uint64) string { return strconv.FormatUint(bits, 10) + "bit" }
	tc("qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "2")
	tc("class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate", rate(up), "ceil", rate(up))
	// What is not TCP (ARP, ICMP) is not capped.
	tc("class", "add", "dev", dev, "parent", "1:1", "classid", "1:2", "htb", "rate", rate(up/100), "ceil", rate(up))
	// The source port's table, then the destination port's.
	tc("filter", "add", "dev", dev, "parent", "1:", "prio", "1", "handle", "2:", "protocol", "ip", "u32", "divisor", strconv.Itoa(flowBuckets))
	tc("filter", "add", "dev", dev, "parent", "1:", "prio", "1", "handle", "3:", "protocol", "ip", "u32", "divisor", strconv.Itoa(flowBuckets))
	for b := range flowBuckets {
		class := "1:" + strconv.FormatInt(int64(0x100+b), 16)
		tc("class", "add", "dev", dev, "parent", "1:1", "classid", class, "htb", "rate", rate(max(flowCap/100, 8000)), "ceil", rate(flowCap))
		for _, ht := range []string{"2", "3"} {
			bucket := ht + ":" + strconv.FormatInt(int64(b), 16) + ":"
			tc("filter", "add", "dev", dev, "parent", "1:", "prio", "1", "protocol", "ip", "u32", "ht", bucket, "match", "u8", "0", "0", "flowid", class)
		}
	}
	mask := strconv.FormatInt(flowBuckets-1, 16)
	// The IP header has no options (Linux's TCP sets none): the ports
	// are at byte 20, source first.
	tc("filter", "add", "dev", dev, "parent", "1:", "prio", "1", "protocol", "ip", "u32", "ht", "800::",
		"match", "ip", "protocol", "6", "0xff", "match", "u16", fmt.Sprintf("%#x", ephemeralFrom), fmt.Sprintf("%#x", ephemeralFrom), "at", "20",
		"hashkey", "mask", "0x00"+mask+"0000", "at", "20", "link", "2:")
	tc("filter", "add", "dev", dev, "parent", "1:", "prio", "1", "protocol", "ip", "u32", "ht", "800::",
		"match", "ip", "protocol", "6", "0xff",
		"hashkey", "mask", "0x000000"+mask, "at", "20", "link", "3:")
	return step{what: what + " (HTB, " + strconv.Itoa(flowBuckets) + " flow classes)",
		args:  append(append([]string(nil), tcArgs...), "-batch", "-"),
		stdin: strings.Join(lines, "\n") + "\n"}
}
