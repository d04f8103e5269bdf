package worker

// The core's count of the iterations whose every sum is here, which the LB
// hears of under retries, and their re-summing after a lost worker.

// sumIn records that t's sum of iteration iter is complete here, and
// reports (began) when that completes an iteration for every tensor:
// with retries on, the LB hears of completions rather than pushes, so
// that its Done means that every worker has the sums.
func (c *core) sumIn(t *tensor, iter uint64) effects {
	if !c.retryMode || iter < t.sumsIn {
		return effects{} // only retries need to know
	}
	if iter != t.sumsIn {
		if t.sumsAhead == nil {
			t.sumsAhead = make(map[uint64]bool)
		}
		t.sumsAhead[iter] = true
		return effects{}
	}
	c.untally(t)
	t.sumsIn++
	for t.sumsAhead[t.sumsIn] {
		delete(t.sumsAhead, t.sumsIn)
		t.sumsIn++
	}
	c.tally(t)
	return c.reportSums()
}

// reportSums reports (began) the iterations whose every sum is now here,
// if that is more than reported.
func (c *core) reportSums() effects {
	n, any := c.sums.min()
	if !any || n <= c.sumsIn {
		return effects{}
	}
	c.sumsIn = n
	return effects{began: &iterationBegan{iter: n, modelBytes: c.modelBytes, version: c.retryVersion()}}
}

// sumAgainFrom forgets that the sums of iterations from on are here: after
// a lost worker they are summed again, and the LB must hear of them anew
// (under the retry's version). Empty tensors' sums stay complete.
func (c *core) sumAgainFrom(from uint64) effects {
	for t := range c.allTensors() {
		for it := range t.sumsAhead {
			if it >= from {
				delete(t.sumsAhead, it)
			}
		}
		if t.sumsIn <= from {
			continue
		}
		c.untally(t)
		t.sumsIn = from
		for {
			r := c.results[resultKey{t.key, t.sumsIn}]
			if r == nil || !r.complete {
				break
			}
			t.sumsIn++
		}
		c.tally(t)
	}
	c.sumsIn = min(c.sumsIn, from)
	return c.reportSums()
}
