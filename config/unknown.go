package config

import (
	"slices"
	"strings"
)

// maxSuggestDistance is the largest edit distance at which a known name is
// offered as the one meant: a typo or two, not an unrelated name.
const maxSuggestDistance = 3

// Unknown names every variable of environ ("KEY=VALUE" entries, as
// os.Environ gives them) that looks like fpt's or ps-lite's (FPT_*, PS_*,
// DMLC_*) but is not in Known, each with the nearest known name when one
// is close: "unknown variable FPT_PARTITON_BYTES; did you mean
// FPT_PARTITION_BYTES?". The warnings come sorted by name.
func Unknown(environ []string) []string {
	known := Names(NodeVar, LauncherVar, ToolVar, TestVar)
	var warnings []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !hasPrefix(name) || slices.Contains(known, name) {
			continue
		}
		w := "unknown variable " + name
		if near, d := nearest(name, known); d <= maxSuggestDistance {
			w += "; did you mean " + near + "?"
		}
		warnings = append(warnings, w)
	}
	slices.Sort(warnings)
	return slices.Compact(warnings)
}

// hasPrefix tells whether name is in a family of variables fpt owns or
// shares with ps-lite: a name there that Known does not list is most
// likely a typo.
func hasPrefix(name string) bool {
	for _, p := range [...]string{"FPT_", "PS_", "DMLC_"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// nearest is the candidate closest to name by edit distance (the first in
// candidates' order on a tie), and that distance.
func nearest(name string, candidates []string) (string, int) {
	best, bestD := "", -1
	for _, c := range candidates {
		if d := distance(name, c); bestD < 0 || d < bestD {
			best, bestD = c, d
		}
	}
	return best, bestD
}

// distance is the Levenshtein distance between a and b: the fewest
// single-byte insertions, deletions and substitutions that turn one into
// the other.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			sub := prev[j-1]
			if a[i-1] != b[j-1] {
				sub++
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, sub)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
