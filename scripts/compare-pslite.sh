#!/usr/bin/env bash
# Builds dmlc/ps-lite from a checkout (or a bare git directory) in a
# scratch directory, builds clients/pslite/benchmark.cc against it, and
# runs "fpt bench --scenario classic" with that program as its ps-lite path,
# next to fpt's classic and FPT paths and raw TCP in the same run:
#
#   scripts/compare-pslite.sh PSLITE [fpt bench flags...]
#
# PSLITE is a ps-lite source tree or bare git directory (its HEAD is
# used). Needs g++, libzmq (libzmq3-dev), protobuf (libprotobuf-dev,
# protobuf-compiler), and bin/fpt and bin/pslite_benchmark (scripts/build.sh).
# Nothing of it is part of fpt's build or tests. COMPARE_PSLITE_WORK names the
# scratch directory (default: a new one under /tmp, removed at the end).
set -euo pipefail
usage() {
  cat <<'USAGE'
usage: scripts/compare-pslite.sh PSLITE [fpt bench flags...]

Builds dmlc/ps-lite from PSLITE (a source tree or a bare git directory, its
HEAD) in a scratch directory, builds clients/pslite/benchmark.cc against it,
and runs "bin/fpt bench --scenario classic" with that program as the
ps-lite path, next to fpt's classic and FPT paths and raw TCP in one run.
Needs g++, pkg-config, libzmq3-dev, libprotobuf-dev, protobuf-compiler, and
bin/fpt and bin/pslite_benchmark (scripts/build.sh). Nothing of fpt's build
or tests depends on it.

Environment read: COMPARE_PSLITE_WORK (the scratch directory; default a new
one under /tmp, removed at the end).
USAGE
}
case "${1:-}" in
  -h|--help) usage; exit 0 ;;
  "") usage >&2; exit 2 ;;
esac
src=$1
shift
cd "$(dirname "$0")/.."
root=$(pwd)
for tool in g++ protoc pkg-config; do
  command -v "$tool" >/dev/null 2>&1 || { echo "compare-pslite: $tool not found (apt-get install g++ protobuf-compiler pkg-config)" >&2; exit 1; }
done
[ -x bin/fpt ] && [ -x bin/pslite_benchmark ] || { echo "compare-pslite: bin/fpt or bin/pslite_benchmark missing (scripts/build.sh)" >&2; exit 1; }
work=${COMPARE_PSLITE_WORK:-}
if [ -z "$work" ]; then
  work=$(mktemp -d /tmp/compare-pslite.XXXXXX)
  trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work/pslite"
if [ -d "$src/src" ] && [ -d "$src/include/ps" ]; then
  cp -r "$src/." "$work/pslite/"
else
  git --git-dir="$src" archive HEAD | tar -x -C "$work/pslite"
fi
cd "$work/pslite"
protoc --cpp_out=src --proto_path=src src/meta.proto
flags="-std=c++11 -O3 -msse2 -pthread -Isrc -Iinclude $(pkg-config --cflags protobuf libzmq 2>/dev/null || true)"
objs=()
for f in customer postoffice van meta.pb; do
  # Word splitting of $flags is intended.
  # shellcheck disable=SC2086
  g++ $flags -c "src/$f.cc" -o "$f.o"
  objs+=("$f.o")
done
ar crs libps.a "${objs[@]}"
# shellcheck disable=SC2086,SC2046
g++ $flags -o "$work/pslite_benchmark" "$root/clients/pslite/benchmark.cc" libps.a $(pkg-config --libs protobuf libzmq 2>/dev/null || echo -lprotobuf -lzmq)
cd "$root"
bin/fpt bench --scenario classic --pslite-program "$work/pslite_benchmark" "$@"
