package localagg

import "fmt"

// Joined is what a node joining a running job is told of the workers'
// local groups, at the end of its node table: every member decided
// them from the table the job started with, which the joiner never saw.
type Joined struct {
	// Sums: the workers sum on their hosts (config.Config.SumsLocally, as
	// the scheduler and every member decided it at the start).
	Sums bool
	// Hosts are the hosts the table's nodes named (FPT_HOST_ID; "" for
	// none), in the table's order, as AppendHosts encodes them.
	Hosts []string
}

// AppendJoined encodes j: a byte for Sums, then the hosts.
func AppendJoined(b []byte, j Joined) []byte {
	sums := byte(0)
	if j.Sums {
		sums = 1
	}
	return AppendHosts(append(b, sums), j.Hosts)
}

// ParseJoined decodes AppendJoined's encoding for a table of n nodes, the
// whole of b. Empty b (a scheduler that sent none) gives ok false: the
// joiner decides from its table alone.
func ParseJoined(b []byte, n int, maxLen int) (j Joined, ok bool, err error) {
	if len(b) == 0 {
		return Joined{}, false, nil
	}
	if b[0] > 1 {
		return Joined{}, false, fmt.Errorf("localagg: joining node table: local groups malformed (%d bytes)", len(b))
	}
	j.Sums = b[0] == 1
	hosts, rest, err := ParseHosts(b[1:], n, maxLen)
	if err != nil {
		return Joined{}, false, err
	}
	if len(rest) != 0 {
		return Joined{}, false, fmt.Errorf("localagg: joining node table: %d bytes after the hosts", len(rest))
	}
	j.Hosts = hosts
	return j, true, nil
}
