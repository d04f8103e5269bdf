package worker

// forgetDecisions drops the LB decisions no cut can need any more, so that
// a long job's schedule stays as short as the iterations in flight (the LB
// issues a decision every few iterations while it probes). A push cuts its
// key's next iteration and a result frame is of an iteration the key has
// not pulled yet, or of one in c.results already cut; a retry re-cuts from
// Done on. The decision in force at one before the lowest of those stays
// (duty looks one iteration back). Until every key the job pushes is
// declared none goes: a key declared later starts at its init round and
// iteration 1, which every worker must cut alike. Broadcast keys have
// their init round only.
func (c *core) forgetDecisions() {
	if c.schedule == nil || c.perIter == 0 || len(c.tensors) < c.perIter {
		return
	}
	low := c.done
	for _, t := range c.tensors {
		if !t.once {
			low = min(low, t.pushed, t.pulled)
		}
	}
	if low > 1 {
		c.schedule.Forget(low - 1)
	}
}
