#!/usr/bin/env bash
# The test command: vet, the race-enabled unit tests of every package, and
# the integration tests that start real clusters of processes through the
# DMLC_* environment (tests/). Run as root to include the tests that need it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
echo "== go vet"
go vet ./...
echo "== go test -race (all packages)"
go test -race -timeout 20m ./...
echo "== go test, tensors over 2 GiB (too large for the race detector)"
go test -timeout 20m -run 'Big' -count=1 ./van/ ./tests/
