// Package peerstat counts what moves between a van and each of its peers,
// for the TCP vans (package van) and the in-memory one (van/memvan) alike.
package peerstat

import (
	"slices"
	"sync/atomic"
	"time"

	"github.com/fptps/fpt/node"
)

// Counters are one peer's statistics; they outlive its connections.
type Counters struct {
	SentBytes, ReceivedBytes, SentFrames, ReceivedFrames atomic.Uint64
	ReceivedInPlace, ReceivedCopied                      atomic.Uint64 // payload bytes
	ReadCalls, WriteCalls                                atomic.Uint64 // system calls that moved bytes
	SentBusy, ReceivedBusy                               atomic.Int64  // nanoseconds
	Channels                                             atomic.Int32  // connections of the latest
}

// Snapshot is one peer's counters at a moment. It has the fields of
// van.PeerStats (documented there), which converts from it.
type Snapshot struct {
	Peer                 node.ID
	SentBytes            uint64
	ReceivedBytes        uint64
	SentFrames           uint64
	ReceivedFrames       uint64
	ReceivedInPlaceBytes uint64
	ReceivedCopiedBytes  uint64
	ReadCalls            uint64
	WriteCalls           uint64
	SentBusy             time.Duration
	ReceivedBusy         time.Duration
	Channels             int
}

// Table is the counters of every peer a van has had. It is not safe for
// concurrent use (the van guards it with its peer table's lock); the
// Counters it hands out are.
type Table map[node.ID]*Counters

// Of is peer's counters, created at its first connection.
func (t Table) Of(peer node.ID) *Counters {
	c := t[peer]
	if c == nil {
		c = new(Counters)
		t[peer] = c
	}
	return c
}

// Snapshots is every peer's counters, in id order.
func (t Table) Snapshots() []Snapshot {
	out := make([]Snapshot, 0, len(t))
	for id, c := range t {
		out = append(out, Snapshot{
			Peer:                 id,
			SentBytes:            c.SentBytes.Load(),
			ReceivedBytes:        c.ReceivedBytes.Load(),
			SentFrames:           c.SentFrames.Load(),
			ReceivedFrames:       c.ReceivedFrames.Load(),
			ReceivedInPlaceBytes: c.ReceivedInPlace.Load(),
			ReceivedCopiedBytes:  c.ReceivedCopied.Load(),
			ReadCalls:            c.ReadCalls.Load(),
			WriteCalls:           c.WriteCalls.Load(),
			SentBusy:             time.Duration(c.SentBusy.Load()),
			ReceivedBusy:         time.Duration(c.ReceivedBusy.Load()),
			Channels:             int(c.Channels.Load()),
		})
	}
	slices.SortFunc(out, func(a, b Snapshot) int { return int(int64(a.Peer) - int64(b.Peer)) })
	return out
}
