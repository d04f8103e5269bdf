package localagg

import (
	"encoding/binary"
	"fmt"
)

// AppendHosts encodes the host each node of a node table named (FPT_HOST_ID;
// "" for none), in the table's order, after the table's stamp: a count,
// then a length-prefixed name each.
func AppendHosts(b []byte, hosts []string) []byte {
	b = binary.AppendUvarint(b, uint64(len(hosts)))
	for _, h := range hosts {
		b = binary.AppendUvarint(b, uint64(len(h)))
		b = append(b, h...)
	}
	return b
}

// ParseHosts decodes AppendHosts' encoding of a table of n nodes at the
// start of b, and returns the bytes after it; empty b (a scheduler that
// sent none) gives n empty names. It checks every length against the
// bytes present and the limit before it allocates.
func ParseHosts(b []byte, n int, maxLen int) (hosts []string, rest []byte, err error) {
	hosts = make([]string, n)
	if len(b) == 0 {
		return hosts, nil, nil
	}
	count, k := binary.Uvarint(b)
	if k <= 0 || count != uint64(n) {
		return nil, nil, fmt.Errorf("localagg: node table names hosts of %d nodes, the table has %d", count, n)
	}
	b = b[k:]
	for i := range hosts {
		l, k := binary.Uvarint(b)
		if k <= 0 || l > uint64(maxLen) || l > uint64(len(b)-k) {
			return nil, nil, fmt.Errorf("localagg: node table: host of node %d malformed", i)
		}
		hosts[i] = string(b[k : k+int(l)])
		b = b[k+int(l):]
	}
	return hosts, b, nil
}
