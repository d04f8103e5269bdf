#!/usr/bin/env bash
# Runs a command, or a whole fpt cluster, on K emulated hosts: network
# namespaces joined by a bridge, addressed 198.18.0.1, 198.18.0.2, ...,
# each host's link shaped with tc tbf to its own rate (up and down). The
# network is removed when the run ends, fails or is interrupted. Needs root.
# A thin wrapper: builds bin/fpt, then runs "bin/fpt netem" (fpt netem -h).
# In --cluster mode every host gets the same cluster secret, a random one
# per run unless FPT_CLUSTER_SECRET(_FILE) is set (the hosts are not
# loopback, so nodes without one would refuse to start).
#
#   # a cluster of 3 hosts, one slow, each running a server and a worker
#   scripts/netem.sh --hosts 1gbit,200mbit,1gbit --cluster -- --iters 20
#   # any command in every host; its environment says where it runs
#   scripts/netem.sh --host 1gbit --host 100mbit/1gbit -- sh -c 'echo $FPT_NETEM_HOST $FPT_NETEM_ADDR'
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
for a in "$@"; do
  case "$a" in
    -h|--help)
      cat <<'USAGE'
usage: scripts/netem.sh [fpt netem flags] -- COMMAND [ARGS...]
       scripts/netem.sh [fpt netem flags] --cluster [-- test_kv_app flags...]

Builds the binaries (scripts/build.sh), then runs "bin/fpt netem" with the
same arguments: a command, or a whole fpt cluster (scripts/run_test.sh on
every host), on emulated hosts joined by shaped links. Needs root and
iproute2 (ip, tc; "scripts/setup.sh test" installs it).

  scripts/netem.sh --hosts 1gbit,200mbit,1gbit --cluster -- --iters 20

Environment read: FPT_CLUSTER_SECRET, FPT_CLUSTER_SECRET_FILE (in --cluster
mode every host gets the same secret, a random one unless these give it).
The flags and the rest of the environment: bin/fpt netem -h, below once built.
USAGE
      [ -x "$repo/bin/fpt" ] && { echo; "$repo/bin/fpt" netem -h 2>&1; }
      exit 0 ;;
    --) break ;;
  esac
done
command -v ip >/dev/null 2>&1 || { echo "netem.sh: ip not found: apt-get install iproute2 (or scripts/setup.sh test)" >&2; exit 1; }
"$repo/scripts/build.sh"
exec "$repo/bin/fpt" netem "$@"
