// Package classic places ps-lite's classic keys (Push, Pull, PushPull) on
// the servers and moves them when the servers change.
//
// A Layout is the ordered list of servers the key space is cut over, in
// equal ranges as ps-lite cuts it, with a version the scheduler raises at
// every change (a server joins: it is appended; a server is lost: it is
// removed). Ranges (ranges.go) is a server's side of a change: it hands
// the keys it no longer owns to their new owners, holds requests for the
// keys it gains until every previous owner has handed them over, and
// answers a request sent under an older layout with the key's owner. It is
// pure: the server shell (package server) does the I/O.
package classic

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/fptps/fpt/node"
)

// Layout is a version of the classic key ranges: key k belongs to
// Servers[ServerFor(k, len(Servers))].
type Layout struct {
	Version uint32
	Servers []node.ID
}

// ServerFor is the index of the server owning key when the key space is
// cut into servers equal ranges (ps-lite's range slicing).
func ServerFor(key uint64, servers int) int {
	span := math.MaxUint64 / uint64(servers)
	return int(min(key/span, uint64(servers-1)))
}

// Initial is the layout a job starts with: its servers in id order,
// version 0.
func Initial(servers []node.ID) Layout {
	s := slices.Clone(servers)
	slices.Sort(s)
	return Layout{Servers: s}
}

// Owner is the server key belongs to; 0 for a layout without servers.
func (l Layout) Owner(key uint64) node.ID {
	if len(l.Servers) == 0 {
		return 0
	}
	return l.Servers[ServerFor(key, len(l.Servers))]
}

// Index is id's position in the layout (its classic rank), or -1.
func (l Layout) Index(id node.ID) int { return slices.Index(l.Servers, id) }

// Range is the keys [from, to) server id owns; to == 0 means no upper
// bound (the last range reaches the largest key). ok is false when id
// owns none.
func (l Layout) Range(id node.ID) (from, to uint64, ok bool) {
	i := l.Index(id)
	if i < 0 {
		return 0, 0, false
	}
	span := math.MaxUint64 / uint64(len(l.Servers))
	from = uint64(i) * span
	if i < len(l.Servers)-1 {
		to = from + span
	}
	return from, to, true
}

// Span is the part of [from, to) server id owns (to == 0: no upper
// bound, for both); ok is false when that part is empty.
func (l Layout) Span(id node.ID, from, to uint64) (lo, hi uint64, ok bool) {
	a, b, mine := l.Range(id)
	if !mine {
		return 0, 0, false
	}
	lo = max(from, a)
	switch {
	case to == 0:
		hi = b
	case b == 0:
		hi = to
	default:
		hi = min(to, b)
	}
	return lo, hi, hi == 0 || lo < hi
}

// Overlaps reports whether server id owns any key of [from, to).
func (l Layout) Overlaps(id node.ID, from, to uint64) bool {
	_, _, ok := l.Span(id, from, to)
	return ok
}

// With is the next version with id appended (a server joined).
func (l Layout) With(id node.ID) Layout {
	return Layout{Version: l.Version + 1, Servers: append(slices.Clone(l.Servers), id)}
}

// Without is the next version without id (a server was lost).
func (l Layout) Without(id node.ID) Layout {
	return Layout{Version: l.Version + 1, Servers: slices.DeleteFunc(slices.Clone(l.Servers), func(s node.ID) bool { return s == id })}
}

// AppendBinary appends l's encoding (version, count, ids: little-endian
// uint32s), as the scheduler's Layout message and a joining node's table
// carry it.
func (l Layout) AppendBinary(b []byte) []byte {
	b = binary.LittleEndian.AppendUint32(b, l.Version)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(l.Servers)))
	for _, id := range l.Servers {
		b = binary.LittleEndian.AppendUint32(b, uint32(id))
	}
	return b
}

// ParseLayout reads AppendBinary's encoding, which must be all of b; every
// id must be a server's, once.
func ParseLayout(b []byte) (Layout, error) {
	if len(b) < 8 {
		return Layout{}, fmt.Errorf("classic: layout of %d bytes, want at least 8", len(b))
	}
	le := binary.LittleEndian
	l := Layout{Version: le.Uint32(b)}
	n := le.Uint32(b[4:])
	if uint64(len(b)-8) != 4*uint64(n) {
		return Layout{}, fmt.Errorf("classic: layout of %d servers in %d bytes", n, len(b))
	}
	l.Servers = make([]node.ID, n)
	for i := range l.Servers {
		id := node.ID(le.Uint32(b[8+4*i:]))
		if r, ok := id.Role(); !ok || r != node.Server {
			return Layout{}, fmt.Errorf("classic: layout names %d, not a server", id)
		}
		if slices.Contains(l.Servers[:i], id) {
			return Layout{}, fmt.Errorf("classic: layout names server %s twice", id)
		}
		l.Servers[i] = id
	}
	return l, nil
}

func (l Layout) String() string { return fmt.Sprintf("v%d%v", l.Version, l.Servers) }
