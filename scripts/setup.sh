#!/usr/bin/env bash
# Installs on Debian what one use of fpt needs, when it is missing, in one
# apt-get run, and fetches Go modules: a local job waits for no browser.
# Idempotent; safe to run before every build.
set -euo pipefail
usage() {
  cat <<'USAGE'
usage: scripts/setup.sh [build|python|test]

Installs with apt-get, when missing (as root), what one use of fpt needs on
Debian, then fetches the Go modules. Idempotent. What for:
  build    build and run fpt, its C library and the C/C++ programs:
           pkg-config, libczmq-dev (goczmq's cgo), g++
           (scripts/build.sh and scripts/run_test.sh ask for this)
  python   build, plus the Python package's and examples' PyTorch:
           python3-torch, python3-numpy (for /usr/bin/python3)
  test     python, plus what the tests use: iproute2 (emulated networks),
           chromium (the status page's browser test), slurm-wlm and munge
           (a one-node Slurm cluster of the test's own: deploy/slurm)
           (scripts/test.sh and .ci/run ask for this; the default)

Environment read: PATH (a Go toolchain, else /usr/local/go/bin or
/usr/lib/go/bin).
USAGE
}
what=test
case "${1:-}" in
  -h|--help) usage; exit 0 ;;
  build|python|test) what=$1 ;;
  "") ;;
  *) echo "setup.sh: unknown argument $1; setup.sh -h for help" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."

need=()
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
pkg-config --exists libczmq 2>/dev/null || need+=(libczmq-dev)
command -v g++ >/dev/null 2>&1 || need+=(g++)
if [ "$what" != build ]; then
  # Python and PyTorch (python/fpt, fptrun, examples/pytorch and their
  # tests): Debian's packages, for /usr/bin/python3 (fptrun finds it even
  # when another python3 comes first on PATH; FPT_PYTHON overrides).
  dpkg -s python3-torch >/dev/null 2>&1 || need+=(python3-torch)
  dpkg -s python3-numpy >/dev/null 2>&1 || need+=(python3-numpy)
fi
if [ "$what" = test ]; then
  command -v ip >/dev/null 2>&1 || need+=(iproute2)
  # The status page's browser test (tests/status_test.go) drives Debian's
  # headless Chromium.
  command -v chromium >/dev/null 2>&1 || need+=(chromium)
  # The Slurm test (tests/slurm_test.go) starts slurmctld and slurmd of
  # its own; the packages' services are not used.
  command -v slurmctld >/dev/null 2>&1 || need+=(slurm-wlm)
  command -v munged >/dev/null 2>&1 || need+=(munge)
fi
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing ${need[*]}; run as root or: sudo apt-get install -y ${need[*]}" >&2
    exit 1
  fi
  echo "setup: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq "${need[@]}" >/dev/null
fi
if ! command -v go >/dev/null 2>&1; then
  for d in /usr/local/go/bin /usr/lib/go/bin; do [ -x "$d/go" ] && export PATH="$d:$PATH"; done
fi
command -v go >/dev/null 2>&1 || { echo "setup: no Go toolchain on PATH (Go 1.26 or later)" >&2; exit 1; }
go mod download
# The Kubernetes manifests' test is a module of its own (deploy/kubernetes).
(cd deploy/kubernetes && go mod download)
