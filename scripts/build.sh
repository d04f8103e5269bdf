#!/usr/bin/env bash
# Builds fpt's binaries into bin/: fpt (scheduler, server, bench) and
# test_kv_app (the simulated trainer); then the C library into build/
# (libfpt.so, fpt.h, fpt.pc) and its C and C++ programs into bin/
# (scripts/build-lib.sh).
set -euo pipefail
case "${1:-}" in
  -h|--help)
    cat <<'USAGE'
usage: scripts/build.sh

Builds bin/fpt and bin/test_kv_app, then the C library and its programs
(scripts/build-lib.sh: build/, bin/kvstore_client, bin/pslite_*), after
"scripts/setup.sh build" has installed what the build needs (pkg-config,
libczmq-dev, g++; not what only the tests or PyTorch need). No flags.

Environment read: GOEXPERIMENT (passed to the Go builds, as in build-lib.sh -h),
PKG_CONFIG_PATH (extended for the C++ programs).
USAGE
    exit 0 ;;
  "") ;;
  *) echo "build.sh: no arguments expected (build.sh -h)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
scripts/setup.sh build
mkdir -p bin
go build -o bin/ ./cmd/fpt ./tests/test_kv_app
scripts/build-lib.sh
