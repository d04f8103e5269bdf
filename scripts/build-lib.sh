#!/usr/bin/env bash
# Builds libfpt, fpt's C library, and installs it under a prefix with its
# headers and a pkg-config file; then builds the programs in clients/kvstore
# and clients/pslite against that install with the flags pkg-config gives,
# as a user's C++ build would:
#
#   scripts/build-lib.sh [--prefix DIR] [--bindir DIR]
#
# prefix (default build/): lib/libfpt.so, include/fpt.h, include/ps/ and
# include/dmlc/ (ps-lite's C++ interface over fpt.h, header-only),
# lib/pkgconfig/fpt.pc. bindir (default bin/): kvstore_client (the C++
# client that drives the library as MXNet's kvstore_dist does),
# fpt_bad_calls (a C program that calls every entry point wrongly), and the
# ps-lite programs of clients/pslite, built as C++11: pslite_kv_app,
# pslite_multi_workers, pslite_simple_app, pslite_benchmark,
# pslite_mxnet_client, pslite_final_barrier, pslite_scheduler_app.
# GOEXPERIMENT passes through: GOEXPERIMENT=cgocheck2 builds a library that
# checks every pointer the Go side writes.
set -euo pipefail
usage() {
  cat <<'USAGE'
usage: scripts/build-lib.sh [--prefix DIR] [--bindir DIR]

Builds libfpt (fpt's C library) and installs it under a prefix with its
headers and a pkg-config file, then builds the C and C++ client programs
against that install with the flags pkg-config gives.

Flags:
  --prefix DIR   where to install [default: build]: lib/libfpt.so,
                 include/fpt.h, include/ps/ and include/dmlc/ (ps-lite's C++
                 interface over fpt.h), lib/pkgconfig/fpt.pc
  --bindir DIR   where the programs go [default: bin]: kvstore_client,
                 fpt_bad_calls, pslite_kv_app, pslite_multi_workers,
                 pslite_simple_app, pslite_benchmark, pslite_mxnet_client,
                 pslite_final_barrier, pslite_scheduler_app
  -h, --help     this help

Environment read:
  GOEXPERIMENT     passed to go build: GOEXPERIMENT=cgocheck2 builds a library
                   that checks every pointer the Go side writes
  PKG_CONFIG_PATH  extended with the install's lib/pkgconfig
USAGE
}
cd "$(dirname "$0")/.."
prefix=build
bindir=bin
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix=$2; shift 2 ;;
    --bindir) bindir=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "build-lib.sh: unknown argument $1 (build-lib.sh -h)" >&2; exit 2 ;;
  esac
done
for cc in gcc g++; do
  command -v "$cc" >/dev/null 2>&1 || { echo "build-lib: $cc not found (scripts/setup.sh installs it)" >&2; exit 1; }
done
mkdir -p "$prefix/lib/pkgconfig" "$prefix/include" "$bindir"
prefix=$(cd "$prefix" && pwd)
bindir=$(cd "$bindir" && pwd)

go build -buildmode=c-shared -o "$prefix/lib/libfpt.so" ./cmd/libfpt
# cgo's generated header is not the interface (it includes the shell's
# private shim.h); the hand-written fpt.h is, and the build checked that
# the two agree.
rm -f "$prefix/lib/libfpt.h"
install -m 644 include/fpt.h "$prefix/include/fpt.h"
# ps-lite's interface: a stale header from an earlier install must not
# linger, so the directories are replaced.
rm -rf "$prefix/include/ps" "$prefix/include/dmlc"
mkdir -p "$prefix/include/ps/internal" "$prefix/include/dmlc"
install -m 644 include/ps/*.h "$prefix/include/ps/"
install -m 644 include/ps/internal/*.h "$prefix/include/ps/internal/"
install -m 644 include/dmlc/*.h "$prefix/include/dmlc/"
# The rpath lets programs built against a build tree run without
# LD_LIBRARY_PATH; an install into a system prefix does not need it.
cat >"$prefix/lib/pkgconfig/fpt.pc" <<PC
prefix=$prefix
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: fpt
Description: fpt parameter server, C interface (fpt_push/fpt_pull) and ps-lite's C++ interface (ps/ps.h)
Version: 1
Cflags: -I\${includedir}
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -lfpt
PC

export PKG_CONFIG_PATH="$prefix/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
# The programs compile side by side; each one's failure fails the build.
pids=()
# Word splitting of pkg-config's output is intended.
# shellcheck disable=SC2046
g++ -std=c++17 -O2 -Wall -Wextra -Werror -pthread -o "$bindir/kvstore_client" clients/kvstore/kvstore_client.cc $(pkg-config --cflags --libs fpt) &
pids+=($!)
# shellcheck disable=SC2046
gcc -std=c11 -O2 -Wall -Wextra -Werror -o "$bindir/fpt_bad_calls" clients/kvstore/bad_calls.c $(pkg-config --cflags --libs fpt) &
pids+=($!)
for prog in kv_app multi_workers simple_app benchmark mxnet_client final_barrier scheduler_app; do
  # shellcheck disable=SC2046
  g++ -std=c++11 -O2 -Wall -Wextra -Werror -pthread -o "$bindir/pslite_$prog" "clients/pslite/$prog.cc" $(pkg-config --cflags --libs fpt) &
  pids+=($!)
done
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
if [ "$failed" = 1 ]; then
  echo "build-lib: a client program did not compile (its errors are above)" >&2
  exit 1
fi
