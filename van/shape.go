package van

import (
	"github.com/fptps/fpt/node"

	"math"
	"sync"
)

// minReadBudget is the least a connection may read per turn of the epoll
// loop, whatever its receive weight: the receive side never pauses a peer,
// since a peer whose data is not read stalls its single sender, and with it
// every flow of that peer, not just the one to this node.
const minReadBudget = 64 << 10

// recvShaper holds the receive weights of the epoll van: in every turn of
// the loop over the ready connections, each reads up to readBudget scaled
// by its source's weight relative to the largest, so that when the
// receiver is the bottleneck bytes are read in the ratio of the weights.
// It is work-conserving: a connection with less ready than its budget
// leaves the rest of the turn to the others.
type recvShaper struct {
	mu      sync.Mutex
	off     bool
	weights map[node.ID]float64 // peers without an entry have weight 1
	max     float64             // the largest weight, at least 1
}

func (s *recvShaper) setWeight(peer node.ID, w float64) {
	if !(w >= 0) { // negative or NaN
		w = 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if w == 1 {
		delete(s.weights, peer)
	} else {
		s.weights[peer] = min(w, math.MaxFloat32)
	}
	s.max = 1
	for _, v := range s.weights {
		s.max = max(s.max, v)
	}
}

func (s *recvShaper) setShaping(on bool) {
	s.mu.Lock()
	s.off = !on
	s.mu.Unlock()
}

// budget is what peer may read in one turn.
func (s *recvShaper) budget(peer node.ID) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.off || len(s.weights) == 0 {
		return readBudget
	}
	w, ok := s.weights[peer]
	if !ok {
		w = 1
	}
	return readBudgetFor(w, s.max)
}

// readBudgetFor scales readBudget by weight/maxWeight, within
// [minReadBudget, readBudget].
func readBudgetFor(weight, maxWeight float64) int {
	if !(maxWeight > 0) || weight >= maxWeight {
		return readBudget
	}
	b := int(float64(readBudget) * max(weight, 0) / maxWeight)
	return max(b, minReadBudget)
}
