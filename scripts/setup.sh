#!/usr/bin/env bash
# Installs what building fpt needs on Debian (ZeroMQ's czmq headers and
# pkg-config for goczmq's cgo; g++ for the C++ client of the C library;
# python3-torch and python3-numpy for the Python package and its tests;
# chromium for the status page's browser test), when it is missing, in one
# apt-get run, and fetches Go modules.
# Idempotent; safe to run before every build.
set -euo pipefail
case "${1:-}" in
  -h|--help)
    cat <<'USAGE'
usage: scripts/setup.sh

Installs with apt-get what building and testing fpt needs on Debian, when
missing (pkg-config, libczmq-dev, iproute2, g++, python3-torch,
python3-numpy, chromium; as root), and fetches the Go modules. Idempotent;
scripts/build.sh runs it first. No flags.

Environment read: PATH (a Go toolchain, else /usr/local/go/bin or
/usr/lib/go/bin).
USAGE
    exit 0 ;;
esac
cd "$(dirname "$0")/.."

need=()
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
pkg-config --exists libczmq 2>/dev/null || need+=(libczmq-dev)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v g++ >/dev/null 2>&1 || need+=(g++)
# Python and PyTorch (python/fpt, fptrun, examples/pytorch and their tests):
# Debian's packages, for /usr/bin/python3 (fptrun finds it even when another
# python3 comes first on PATH; FPT_PYTHON overrides).
dpkg -s python3-torch >/dev/null 2>&1 || need+=(python3-torch)
dpkg -s python3-numpy >/dev/null 2>&1 || need+=(python3-numpy)
# The status page's browser test (tests/status_test.go) drives Debian's
# headless Chromium.
command -v chromium >/dev/null 2>&1 || need+=(chromium)
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
