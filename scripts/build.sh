#!/usr/bin/env bash
# Builds fpt's binaries into bin/: fpt (scheduler, server, bench) and
# test_kv_app (the simulated trainer); then the C library into build/
# (libfpt.so, fpt.h, fpt.pc) and its C and C++ programs into bin/
# (scripts/build-lib.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
mkdir -p bin
go build -o bin/ ./cmd/fpt ./tests/test_kv_app
scripts/build-lib.sh
