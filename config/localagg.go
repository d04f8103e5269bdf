package config

import "fmt"

// MaxHostIDLen bounds FPT_HOST_ID: it travels in the registration, whose
// text the scheduler bounds too.
const MaxHostIDLen = 255

// LocalAggregation is whether a host's workers sum their contributions on
// the host before the network (FPT_LOCAL_AGGREGATION).
type LocalAggregation int

const (
	// LocalAggregationOff sends every worker's contribution over the
	// network (the default).
	LocalAggregationOff LocalAggregation = iota
	// LocalAggregationAuto lets fpt decide. The local sum is not on the
	// data path yet, so it decides off; groups are still formed and shown.
	LocalAggregationAuto
)

func (l LocalAggregation) String() string {
	switch l {
	case LocalAggregationOff:
		return "off"
	case LocalAggregationAuto:
		return "auto"
	}
	return fmt.Sprintf("LocalAggregation(%d)", int(l))
}

// Host is the name of the host the node runs on, as its local group knows
// it: FPT_HOST_ID, else the address other nodes reach it at.
func (c *Config) Host() string {
	if c.HostID != "" {
		return c.HostID
	}
	return c.NodeHost
}
