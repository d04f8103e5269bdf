#!/usr/bin/env bash
# The test command: vet, the race-enabled tests of every package (among
# them the integration tests in tests/, which start real clusters of
# processes through the DMLC_* environment), then the tests that move
# tensors over 2 GiB, which are too large for the race detector.
# -count=1: the integration tests run binaries built from packages they do
# not import, which Go's test cache cannot see.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
echo "== go vet"
go vet ./...
echo "== go test -race (all packages)"
go test -race -count=1 -timeout 20m ./...
echo "== go test, tensors over 2 GiB (too large for the race detector)"
go test -count=1 -timeout 20m -run 'Over2GiB' ./van/ ./tests/
