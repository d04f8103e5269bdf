package worker

// MappedSegments counts the local groups' segments the worker has mapped.
func (w *Worker) MappedSegments() int {
	g := w.lagg.Load()
	if g == nil {
		return 0
	}
	return g.mapped()
}
