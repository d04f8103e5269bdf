package worker

// least keeps the least of a changing multiset of counters (one per
// tensor: its iterations pushed, its sums in) without scanning them: how
// many members stand at each value, and the least value with any. A
// counter that moves is removed at its old value and added at its new.
//
// When the last member at the least value leaves, the next least is found
// by probing the values just above it, then (past as many probes as there
// are distinct values) by a pass over the distinct values: counters that
// move up one at a time, as pushes do, cost a probe or two.
type least struct {
	at  map[uint64]int // members per value; no zero counts
	low uint64         // the least key of at, when at has any
}

// add counts a member at v.
func (l *least) add(v uint64) {
	if l.at == nil {
		l.at = make(map[uint64]int)
	}
	if len(l.at) == 0 || v < l.low {
		l.low = v
	}
	l.at[v]++
}

// remove takes away a member counted at v (by add).
func (l *least) remove(v uint64) {
	n := l.at[v] - 1
	if n > 0 {
		l.at[v] = n
		return
	}
	delete(l.at, v)
	if v != l.low || len(l.at) == 0 {
		return
	}
	for probe := range len(l.at) {
		if l.at[v+1+uint64(probe)] > 0 {
			l.low = v + 1 + uint64(probe)
			return
		}
	}
	first := true
	for k := range l.at {
		if first || k < l.low {
			l.low, first = k, false
		}
	}
}

// min is the least value counted, and false when there is no member.
func (l *least) min() (uint64, bool) {
	if len(l.at) == 0 {
		return 0, false
	}
	return l.low, true
}
