#!/usr/bin/env bash
# The test command: vet, the race-enabled tests of every package (among
# them the integration tests in tests/, which start real clusters of
# processes through the DMLC_* environment), the Kubernetes manifests'
# test (a module of its own), then the tests that move tensors over 2 GiB,
# which are too large for the race detector.
# -count=1: the integration tests run binaries built from packages they do
# not import, which Go's test cache cannot see.
set -euo pipefail
case "${1:-}" in
  -h|--help)
    cat <<'USAGE'
usage: scripts/test.sh

The test command: installs what the tests need ("scripts/setup.sh test":
the build's packages, python3-torch, python3-numpy, iproute2, chromium,
slurm-wlm, munge), builds, runs go vet, the race-enabled tests of every
package (the integration tests in tests/ start real clusters of processes,
and a one-node Slurm cluster), the Kubernetes manifests' test (the module
in deploy/kubernetes), then the tests that move tensors over 2 GiB. No
flags.

Environment read by the tests: FPT_SKIP_ROOT_TESTS=1 skips the tests that need
root (network namespaces), FPT_ADVERSARIAL=0 the adversarial suite,
FPT_TEST_LOG=1 logs the vans.
USAGE
    exit 0 ;;
esac
cd "$(dirname "$0")/.."
scripts/setup.sh test
scripts/build.sh
echo "== go vet"
go vet ./...
echo "== go test -race (all packages)"
go test -race -count=1 -timeout 20m ./...
echo "== go vet and go test, the Kubernetes manifests (a module of their own: k8s.io/api stays out of fpt's)"
(cd deploy/kubernetes && go vet ./... && go test -count=1 ./...)
echo "== go test, tensors over 2 GiB (too large for the race detector)"
go test -count=1 -timeout 20m -run 'Over2GiB' ./van/ ./tests/
