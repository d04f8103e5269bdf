#!/usr/bin/env bash
# Builds fpt's binaries into bin/: fpt (scheduler, server, bench) and
# test_kv_app (the simulated trainer).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
mkdir -p bin
go build -o bin/ ./cmd/fpt ./tests/test_kv_app
