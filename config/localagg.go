package config

import (
	"fmt"
	"slices"
)

// DefaultLocalAggregationDir is FPT_LOCAL_AGGREGATION_DIR's default:
// Linux's shared-memory file system.
const DefaultLocalAggregationDir = "/dev/shm"

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
	// LocalAggregationAuto sums on the host where that pays: when a host
	// runs several workers (SumsLocally).
	LocalAggregationAuto
	// LocalAggregationOn sums each host's contributions on the host.
	LocalAggregationOn
)

func (l LocalAggregation) String() string {
	switch l {
	case LocalAggregationOff:
		return "off"
	case LocalAggregationAuto:
		return "auto"
	case LocalAggregationOn:
		return "on"
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

// SegmentDir is where the local groups' segments live:
// FPT_LOCAL_AGGREGATION_DIR, or its default for a Config not read from
// the environment.
func (c *Config) SegmentDir() string {
	if c.LocalAggregationDir == "" {
		return DefaultLocalAggregationDir
	}
	return c.LocalAggregationDir
}

// SumsLocally says whether the workers sum on their hosts, given the
// number of workers on each host (every node knows them from the node
// table, so every node decides alike): always with on; with auto, when a
// host runs several workers (one alone saves nothing).
func (c *Config) SumsLocally(workersPerHost []int) bool {
	switch c.LocalAggregation {
	case LocalAggregationOn:
		return true
	case LocalAggregationAuto:
		return slices.ContainsFunc(workersPerHost, func(n int) bool { return n >= 2 })
	}
	return false
}
