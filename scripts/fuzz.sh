#!/usr/bin/env bash
# Runs every fuzz target of the module, one after another, for a set time
# each, and copies the inputs the fuzzer found interesting into the
# package's testdata/fuzz/FuzzXxx/ corpus (which `go test` then replays as
# regression cases). A crasher is written there by `go test` itself and
# fails the script.
#
#   scripts/fuzz.sh            # FUZZTIME each (default 10m)
#   scripts/fuzz.sh 30s        # a quick run
#   FUZZ_MAX_NEW=50 scripts/fuzz.sh 60s   # cap the inputs kept per target
#   scripts/fuzz.sh 10m 'van|frame'       # only targets whose "dir name" matches
#   FUZZ_PARALLEL=1 scripts/fuzz.sh       # fuzzing workers per target (default: one per CPU)
set -euo pipefail
case "${1:-}" in
  -h|--help)
    cat <<'USAGE'
usage: scripts/fuzz.sh [FUZZTIME [REGEXP]]

Runs every fuzz target of the module ("func FuzzXxx" in a _test.go file), one
after another, for FUZZTIME each, and copies the inputs the fuzzer found
interesting into the package's testdata/fuzz/FuzzXxx/ corpus. A crasher fails
the script (go test writes it there). REGEXP keeps only the targets whose
"dir name" matches.

  scripts/fuzz.sh 30s                    # a quick run
  scripts/fuzz.sh 10m 'van|frame'        # only some targets

Environment read:
  FUZZTIME       time per target when no argument gives it [default: 10m]
  FUZZ_MAX_NEW   inputs kept per target [default: 40]
  FUZZ_PARALLEL  fuzzing workers per target [default: one per CPU]
USAGE
    exit 0 ;;
esac
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$HOME/go/bin:$PATH

fuzztime=${1:-${FUZZTIME:-10m}}
only=${2:-.}
parallel=()
[[ -n ${FUZZ_PARALLEL:-} ]] && parallel=(-parallel "$FUZZ_PARALLEL")
max_new=${FUZZ_MAX_NEW:-40} # keep the committed corpus small
cache=$(go env GOCACHE)/fuzz
module=$(go list -m)

# Every "func FuzzXxx(" in a _test.go file, as "dir name".
mapfile -t targets < <(grep -rl --include='*_test.go' '^func Fuzz' . |
	xargs grep -o '^func Fuzz[A-Za-z0-9_]*' |
	sed -E 's#^\./(.*)/[^/]*:func (Fuzz.*)#\1 \2#' | sort -u | grep -E -- "$only")

status=0
for t in "${targets[@]}"; do
	read -r dir name <<<"$t"
	echo "== $dir $name ($fuzztime)"
	log=$(mktemp)
	if ! go test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" "${parallel[@]}" "./$dir" 2>&1 | tee "$log"; then
		if grep -q 'Failing input written' "$log"; then
			echo "!! $dir $name failed; the crasher is in $dir/testdata/fuzz/$name/" >&2
			status=1
		else
			# Go's fuzzer reports "context deadline exceeded" when a slow
			# target (one that stops the world to count allocations) is
			# still running as -fuzztime ends: no input failed.
			echo "!! $dir $name: the fuzzer stopped without a failing input ($(tail -n 4 "$log" | grep -m1 -o 'context deadline exceeded' || echo 'see above'))" >&2
			grep -q 'context deadline exceeded' "$log" || status=1
		fi
	fi
	rm -f "$log"
	found="$cache/$module/$dir/$name"
	if [[ -d $found ]]; then
		mkdir -p "$dir/testdata/fuzz/$name"
		# The newest interesting inputs, up to max_new, smallest first.
		find "$found" -type f -size -8k -printf '%T@ %s %p\n' | sort -rn | head -n "$max_new" |
			awk '{print $3}' | xargs -r cp -n -t "$dir/testdata/fuzz/$name/"
	fi
done
du -sh $(find . -path '*/testdata/fuzz' -type d) 2>/dev/null || true
exit $status
