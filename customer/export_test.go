package customer

import "time"

// SetHeldWarnings spaces the warnings of s's waits for a customer not
// registered yet (heldNext) for a test; waits that start later use them.
func SetHeldWarnings(s *Set, after, every time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.warnAfter, s.warnEvery = after, every
}
