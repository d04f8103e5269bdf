package worker

// The core's kept Init values: a pull with no push outstanding returns
// them, and the memory they lie in is unmapped once nothing refers to it.

import "fmt"

// keptInit is the memory one Init call's values are kept in, outside the
// Go heap (the shell maps and unmaps it). It is unmapped once no key
// refers to it and no pull is copying out of it: a copy from unmapped
// memory would crash the process, not merely read stale values.
type keptInit struct {
	mem     []byte
	keys    int // tensors whose initial lies in mem
	readers int // initialCopy's not yet copied
	freed   bool
}

// drop returns k's memory for the shell to unmap, once nothing uses it.
func (k *keptInit) drop() [][]byte {
	if k.keys > 0 || k.readers > 0 || k.freed {
		return nil
	}
	k.freed = true
	return [][]byte{k.mem}
}

// forgetInitial drops t's kept value.
func (t *tensor) forgetInitial() [][]byte {
	k := t.kept
	if k == nil {
		return nil
	}
	t.initial, t.kept = nil, nil
	k.keys--
	return k.drop()
}

// initialCopy is a key's value after Init, copied into a pull's buffer;
// the shell reports it with initialCopied.
type initialCopy struct {
	dst, src []byte
	kept     *keptInit
}

// pullInitial answers a pull with no push outstanding for some key: if
// every key was initialised and not pushed since, with the values Init
// left (copied by the shell, as initials); else it is the caller's error.
func (c *core) pullInitial(ts []*tensor, parts [][]byte, cl *call) (effects, error) {
	for _, t := range ts {
		switch {
		case t.pulled < t.pushed:
			return effects{}, fmt.Errorf("worker: FPTPull mixes key %d, pushed for iteration %d, with keys that have no push outstanding: %w", t.key, t.pulled, ErrPullBeforePush)
		case t.initial == nil:
			return effects{}, fmt.Errorf("worker: FPTPull of key %d for iteration %d before its FPTPush: %w", t.key, t.pulled, ErrPullBeforePush)
		}
	}
	req, err := c.newRequest(cl, 0)
	if err != nil {
		return effects{}, err
	}
	out := effects{req: req}
	for i, t := range ts {
		t.kept.readers++
		out.initials = append(out.initials, initialCopy{dst: parts[i], src: t.initial, kept: t.kept})
	}
	return out, nil
}

// initialCopied is the shell's report that it has copied out of the kept
// values.
func (c *core) initialCopied(copies []initialCopy) effects {
	var out effects
	for _, cp := range copies {
		cp.kept.readers--
		out.unmap = append(out.unmap, cp.kept.drop()...)
	}
	return out
}

// keepInitial records the keys' values after Init for pullInitial: mem (the
// shell's copy, which the core now owns until it hands it back in
// effects.unmap) is laid out as byteLens say.
func (c *core) keepInitial(keys []uint64, mem []byte, byteLens []int) effects {
	var out effects
	k := &keptInit{mem: mem}
	if c.err == nil {
		off := 0
		for i, key := range keys {
			// A push since Init (from another thread) makes the values stale.
			if t := c.tensors[key]; t != nil && uint64(byteLens[i]) == t.bytes && t.pushed == t.pulled {
				out.unmap = append(out.unmap, t.forgetInitial()...)
				t.initial = mem[off : off+byteLens[i] : off+byteLens[i]]
				t.kept = k
				k.keys++
			}
			off += byteLens[i]
		}
	}
	out.unmap = append(out.unmap, k.drop()...)
	return out
}
