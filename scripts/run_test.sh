#!/usr/bin/env bash
# Starts one node's share of an fpt cluster: the scheduler if asked, S
# servers and W simulated-trainer workers, each its own process, plus a
# monitor printing this host's transmit and receive rate while they run.
#
# With no arguments: a whole local cluster on loopback (scheduler, 2 servers,
# 2 workers). Across machines, run it on each with the same --root and
# cluster sizes, --scheduler on one of them. Children are cleaned up on
# failure or Ctrl-C. Settings come from flags or the DMLC_* environment.
#
#   scripts/run_test.sh [--scheduler] [-s N] [-w N] [--root HOST:PORT]
#                       [--num-servers N] [--num-workers N] [--iface IF]
#                       [--metrics-port P] [--no-monitor]
#                       [--secret S | --secret-file F]
#                       [-- test_kv_app flags...]
#
# The cluster's secret (FPT_CLUSTER_SECRET, or --secret / --secret-file /
# FPT_CLUSTER_SECRET_FILE) authenticates every node. A local cluster gets a
# random one per run when none is given; across machines give every host
# the same one (e.g. FPT_CLUSTER_SECRET=$(openssl rand -hex 16) on all).
#
# --metrics-port P serves each node's Prometheus metrics (FPT_METRICS_ADDR)
# on ports P, P+1, ... in the order the nodes start (the scheduler first).
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }

run_sched=0
share_given=0
nserv_here=""
nwork_here=""
root="${DMLC_PS_ROOT_URI:-}${DMLC_PS_ROOT_PORT:+:$DMLC_PS_ROOT_PORT}"
nserv="${DMLC_NUM_SERVER:-2}"
nwork="${DMLC_NUM_WORKER:-2}"
iface="${DMLC_INTERFACE:-}"
monitor=1
metrics_port=""
app_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --scheduler) run_sched=1; share_given=1 ;;
    -s) nserv_here="$2"; share_given=1; shift ;;
    -w) nwork_here="$2"; share_given=1; shift ;;
    --root) root="$2"; share_given=1; shift ;;
    --num-servers) nserv="$2"; shift ;;
    --num-workers) nwork="$2"; shift ;;
    --iface) iface="$2"; shift ;;
    --no-monitor) monitor=0 ;;
    --metrics-port) metrics_port="$2"; shift ;;
    --secret) export FPT_CLUSTER_SECRET="$2"; unset FPT_CLUSTER_SECRET_FILE; shift ;;
    --secret-file) export FPT_CLUSTER_SECRET_FILE="$2"; unset FPT_CLUSTER_SECRET; shift ;;
    --) shift; app_args=("$@"); break ;;
    -h|--help) usage ;;
    *) echo "run_test.sh: unknown argument $1" >&2; usage ;;
  esac
  shift
done
# A whole local cluster unless told which share this node runs.
if [ "$share_given" = 0 ] && [ -z "${DMLC_PS_ROOT_URI:-}" ]; then
  run_sched=1
fi
if [ -z "$nserv_here" ] && [ -z "$nwork_here" ]; then
  nserv_here=$nserv; nwork_here=$nwork
fi
nserv_here=${nserv_here:-0}; nwork_here=${nwork_here:-0}

free_port() {
  local p
  for p in $(shuf -i 20000-59999 -n 50); do
    # Refused on both the control port and the data port next to it: free.
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && ! (exec 3<>"/dev/tcp/127.0.0.1/$((p+1))") 2>/dev/null; then
      echo "$p"; return 0
    fi
  done
  echo "run_test.sh: no free port found" >&2; return 1
}

if [ -z "$root" ]; then
  if [ "$run_sched" = 1 ]; then
    root="127.0.0.1:$(free_port)"
  else
    echo "run_test.sh: --root HOST:PORT (or DMLC_PS_ROOT_URI and DMLC_PS_ROOT_PORT) is required when the scheduler runs elsewhere" >&2
    exit 2
  fi
fi
export DMLC_PS_ROOT_URI="${root%:*}" DMLC_PS_ROOT_PORT="${root##*:}"
export DMLC_NUM_SERVER="$nserv" DMLC_NUM_WORKER="$nwork"
[ -n "$iface" ] && export DMLC_INTERFACE="$iface"
export PS_VERBOSE="${PS_VERBOSE:-0}"

# Every process of the job shares one secret: a random one for a cluster
# wholly on this host, the user's across machines.
if [ -z "${FPT_CLUSTER_SECRET:-}" ] && [ -z "${FPT_CLUSTER_SECRET_FILE:-}" ] && [ "${FPT_INSECURE:-}" != 1 ]; then
  case "$DMLC_PS_ROOT_URI" in
    127.*|localhost|::1)
      FPT_CLUSTER_SECRET=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
      export FPT_CLUSTER_SECRET ;;
    *)
      echo "run_test.sh: a cluster across machines needs the same secret on every host: set FPT_CLUSTER_SECRET (e.g. \$(openssl rand -hex 16)) or pass --secret S / --secret-file F" >&2
      exit 2 ;;
  esac
fi

if [ ! -x bin/fpt ] || [ ! -x bin/test_kv_app ] || [ -n "$(find cmd tests trainer worker server scheduler cluster van pool control aggregator lb frame node config launch -name '*.go' -newer bin/test_kv_app 2>/dev/null | head -1)" ]; then
  scripts/build.sh
fi

pids=()
names=()
cleanup() {
  local code=$?
  trap - EXIT INT TERM
  for pid in "${pids[@]}" ${mon_pid:-}; do kill "$pid" 2>/dev/null || true; done
  # Give them a moment to release their ports, then make sure.
  sleep 0.2
  for pid in "${pids[@]}" ${mon_pid:-}; do kill -9 "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  exit "$code"
}
trap cleanup EXIT
trap 'echo "run_test.sh: interrupted" >&2; exit 130' INT TERM

start() { # name role cmd...
  local name=$1 role=$2; shift 2
  local metrics_addr="${FPT_METRICS_ADDR:-}"
  if [ -n "$metrics_port" ]; then
    metrics_addr=":$((metrics_port + ${#pids[@]}))"
    echo "run_test.sh: $name serves metrics at http://localhost$metrics_addr/metrics"
  fi
  DMLC_ROLE=$role FPT_METRICS_ADDR="$metrics_addr" "$@" > >(sed -u "s/^/[$name] /") 2> >(sed -u "s/^/[$name] /" >&2) &
  pids+=($!); names+=("$name")
}

echo "run_test.sh: cluster of $nserv servers and $nwork workers, scheduler at $root; here:$([ "$run_sched" = 1 ] && echo " scheduler,") $nserv_here servers, $nwork_here workers"
[ "$run_sched" = 1 ] && start scheduler scheduler bin/fpt
for i in $(seq 1 "$nserv_here"); do start "server$i" server bin/fpt; done
first_worker=${#pids[@]}
for i in $(seq 1 "$nwork_here"); do start "worker$i" worker bin/test_kv_app ${app_args[@]+"${app_args[@]}"}; done

if [ "$monitor" = 1 ]; then
  dev="${iface:-lo}"
  [ "$DMLC_PS_ROOT_URI" != 127.0.0.1 ] && [ -z "$iface" ] && dev=$(ip route get "$DMLC_PS_ROOT_URI" 2>/dev/null | sed -n 's/.* dev \([^ ]*\).*/\1/p' | head -1)
  (
    read_bytes() { awk -v d="$dev:" '$1==d {print $2, $10}' /proc/net/dev; }
    set -- $(read_bytes); rx0=${1:-0}; tx0=${2:-0}
    while sleep 1; do
      set -- $(read_bytes); rx=${1:-0}; tx=${2:-0}
      awk -v d="$dev" -v t=$((tx-tx0)) -v r=$((rx-rx0)) 'BEGIN{printf "[net %s] tx %.2f Gbit/s  rx %.2f Gbit/s\n", d, t*8/1e9, r*8/1e9}' >&2
      rx0=$rx; tx0=$tx
    done
  ) &
  mon_pid=$!
fi

# Wait for every process; the first failure stops the rest.
status=0
running=("${pids[@]}")
while [ ${#running[@]} -gt 0 ]; do
  done_pid=""
  set +e
  wait -n -p done_pid "${running[@]}"
  code=$?
  set -e
  [ -z "$done_pid" ] && break
  still=()
  for pid in "${running[@]}"; do [ "$pid" != "$done_pid" ] && still+=("$pid"); done
  running=(${still[@]+"${still[@]}"})
  if [ "$code" -ne 0 ]; then
    for i in "${!pids[@]}"; do
      [ "${pids[$i]}" = "$done_pid" ] && echo "run_test.sh: ${names[$i]} exited with status $code; stopping the others" >&2
    done
    status=1
    break
  fi
done
[ -n "${mon_pid:-}" ] && kill "$mon_pid" 2>/dev/null || true
if [ "$status" -eq 0 ]; then
  echo "run_test.sh: all $((${#pids[@]})) processes finished cleanly"
fi
exit "$status"
