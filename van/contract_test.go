package van_test

import (
	"testing"

	"github.com/fptps/fpt/van"
	"github.com/fptps/fpt/van/vantest"
)

// The real vans keep the contract that the in-memory one is held to.
func TestContract(t *testing.T) {
	for _, kind := range []string{van.KindEpoll, van.KindNetConn} {
		t.Run(kind, func(t *testing.T) {
			vantest.Run(t, func() vantest.Listen {
				return func(cfg van.Config) (van.Transport, error) { return van.New(kind, cfg) }
			})
		})
	}
}
