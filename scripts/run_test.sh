#!/usr/bin/env bash
# Starts one node's share of an fpt cluster (scheduler, servers, workers
# running test_kv_app), labels their output by role and rank, and stops
# them all on the first failure (but a node the job goes on without) or
# Ctrl-C. The help text is usage() below.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  cat <<'USAGE'
usage: scripts/run_test.sh [flags] [-- test_kv_app flags...]

Starts one node's share of an fpt cluster: the scheduler if asked, S servers
and W simulated-trainer workers (bin/test_kv_app), each its own process, plus a
monitor printing this host's transmit and receive rate while they run. Output
lines are labelled [scheduler], [server R], [worker R] (R the node's rank). The
last line says whether every process finished cleanly; the exit status is 0 if
so, else 1. Children are stopped on failure or Ctrl-C, except when a worker
fails under FPT_ON_WORKER_LOSS=continue or wait, or a server under
FPT_ON_SERVER_LOSS=retry: the job goes on without it, and the others run to
their end (the status is still 1: a process failed). The script exits only
once every process it started is gone (SIGTERM, then SIGKILL after 5 s).
Builds bin/fpt and bin/test_kv_app first when they are missing or older
than their sources (scripts/build.sh, which installs only what the build
needs: scripts/setup.sh build).

With no flags: a whole local cluster on loopback (scheduler, 2 servers, 2
workers). Across machines, run it on each with the same --root and cluster
sizes, --scheduler on one of them, and --first-worker/--first-server so that
the hosts' ranks do not overlap (without them a share's ranks are left to the
scheduler, and labelled [worker local I]).

Flags:
  --scheduler           run the scheduler here
  -s N                  servers here (default: all of the cluster's)
  -w N                  workers here (default: all of the cluster's)
  --root HOST:PORT      the scheduler's address (default: 127.0.0.1 and a free port
                        when the whole cluster runs here)
  --num-servers N       servers in the cluster (default: DMLC_NUM_SERVER, else 2)
  --num-workers N       workers in the cluster (default: DMLC_NUM_WORKER, else 2)
  --first-server R      rank of the first server here (pins ranks R, R+1, ...)
  --first-worker R      rank of the first worker here
  --iface IF            the network interface to use and monitor (DMLC_INTERFACE)
  --metrics-port P      serve each node's Prometheus metrics (FPT_METRICS_ADDR) on
                        ports P, P+1, ... in the order the nodes start (scheduler first)
  --status-port P       the scheduler serves its status page on the root host, port P
                        (FPT_STATUS_ADDR); its URL is printed at start
  --secret S            the cluster's secret (FPT_CLUSTER_SECRET)
  --secret-file F       a file holding it (FPT_CLUSTER_SECRET_FILE)
  --no-monitor          no transmit/receive rate lines
  -h, --help            this help
  -- ARGS               the rest goes to every test_kv_app (test_kv_app -h)

Environment read (flags win):
  DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT   the scheduler's address, as --root
  DMLC_NUM_SERVER, DMLC_NUM_WORKER      the cluster's size [default: 2 and 2]
  DMLC_INTERFACE                        as --iface
  PS_VERBOSE                            the nodes' logging [default: 0]
  FPT_CLUSTER_SECRET, FPT_CLUSTER_SECRET_FILE
                                        the secret; a local cluster without one gets a
                                        random one per run, across machines it is required
  FPT_INSECURE                          1: run without a secret
  FPT_METRICS_ADDR                      every node's metrics address, without --metrics-port
Set for each node: DMLC_ROLE, DMLC_WORKER_ID / DMLC_SERVER_ID (pinned ranks; the
script unsets DMLC_TASK_ID), FPT_STATUS_ADDR (scheduler, with --status-port). Every
other variable passes through to the nodes: bin/fpt -h lists those they read.
USAGE
}
usage_error() { echo "run_test.sh: $*; run_test.sh -h for help" >&2; exit 2; }

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
first_server=""
first_worker=""
status_port=""
while [ $# -gt 0 ]; do
  case "$1" in
    --scheduler) run_sched=1; share_given=1 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; app_args=("$@"); break ;;
    --no-monitor) monitor=0 ;;
    -s|-w|--root|--num-servers|--num-workers|--iface|--metrics-port|--status-port|--secret|--secret-file|--first-server|--first-worker)
      [ $# -ge 2 ] || usage_error "$1 needs a value"
      case "$1" in
        -s) nserv_here="$2"; share_given=1 ;;
        -w) nwork_here="$2"; share_given=1 ;;
        --root) root="$2"; share_given=1 ;;
        --num-servers) nserv="$2" ;;
        --num-workers) nwork="$2" ;;
        --iface) iface="$2" ;;
        --metrics-port) metrics_port="$2" ;;
        --status-port) status_port="$2" ;;
        --secret) export FPT_CLUSTER_SECRET="$2"; unset FPT_CLUSTER_SECRET_FILE ;;
        --secret-file) export FPT_CLUSTER_SECRET_FILE="$2"; unset FPT_CLUSTER_SECRET ;;
        --first-server) first_server="$2" ;;
        --first-worker) first_worker="$2" ;;
      esac
      shift ;;
    *) usage_error "unknown argument $1" ;;
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
for v in "$nserv" "$nwork" "$nserv_here" "$nwork_here" "$first_server" "$first_worker" "$metrics_port" "$status_port"; do
  [[ -z "$v" || "$v" =~ ^[0-9]+$ ]] || usage_error "\"$v\" is not a number"
done
# Ranks are pinned (so that labels are true) when this host runs all of a
# role, or is told where its share starts.
[ -z "$first_server" ] && [ "$nserv_here" = "$nserv" ] && first_server=0
[ -z "$first_worker" ] && [ "$nwork_here" = "$nwork" ] && first_worker=0

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

if [ ! -x bin/fpt ] || [ ! -x bin/test_kv_app ] || [ -n "$(find cmd tests/test_kv_app trainer worker server scheduler cluster van pool control aggregator lb frame node config launch -name '*.go' -newer bin/test_kv_app 2>/dev/null | head -1)" ]; then
  scripts/build.sh
fi

pids=()    # the nodes, each a child of this script
names=()
# Each node is a child of this script, in a process group of its own (job
# control, on while they start), and writes through two labelling seds
# (process substitutions, children of this script too): the script can
# signal a node and wait for the node itself, not for a shell above it
# that a signal would end first, leaving the node to init.
stop_all() { # signal: the nodes still running, and the monitor
  local pid
  if [ -n "${running+x}" ]; then set -- "$1" ${running[@]+"${running[@]}"}; else set -- "$1" ${pids[@]+"${pids[@]}"}; fi
  for pid in "${@:2}"; do kill "-$1" -- "-$pid" 2>/dev/null || true; done
  # The monitor leads a group of its own: its sleep is signalled with it.
  [ -n "${mon_pid:-}" ] && kill "-$1" -- "-$mon_pid" 2>/dev/null
  return 0
}
# children sets kids to this script's child processes, read from /proc
# with builtins only (a command substitution would be a child itself). It
# finds every child, also one whose id a signal kept the script from
# recording.
children() {
  kids=()
  local f=/proc/$$/task/$$/children line rest
  if [ -r "$f" ]; then
    read -r -a kids <"$f" || true
    return 0
  fi
  for f in /proc/[0-9]*/stat; do   # kernels without the children file
    { read -r line <"$f"; } 2>/dev/null || continue
    rest=${line##*) }              # after the command's name: state, ppid, ...
    rest=${rest#* }
    [ "${rest%% *}" = "$$" ] || continue
    f=${f#/proc/}; kids+=("${f%/stat}")
  done
}
# gone_within waits up to $1 seconds for every child to end (bash reaps a
# child as it exits, and it leaves /proc).
gone_within() {
  local now=${EPOCHREALTIME/./}
  local end=$((now + $1 * 1000000))
  while :; do
    children
    [ ${#kids[@]} -eq 0 ] && return 0
    now=${EPOCHREALTIME/./}
    [ "$now" -lt "$end" ] || return 1
    sleep 0.1
  done
}
# stop_children stops every child and returns only once all are gone:
# SIGTERM to the nodes and the monitor (a labeller ends with its node, once
# this script holds no end of its pipe), up to 5 s for every child to end,
# then SIGKILL to all and a wait for each.
stop_children() {
  [ -n "${out_fd:-}" ] && exec {out_fd}>&-
  [ -n "${err_fd:-}" ] && exec {err_fd}>&-
  out_fd="" err_fd=""
  stop_all TERM
  if ! gone_within 5; then
    stop_all KILL
    children
    local pid
    for pid in ${kids[@]+"${kids[@]}"}; do kill -KILL -- "-$pid" "$pid" 2>/dev/null || true; done
    for pid in ${kids[@]+"${kids[@]}"}; do wait "$pid" 2>/dev/null || true; done
  fi
  # Gone: their ids may belong to others from here on.
  stopped=1
}
cleanup() {
  local code=$?
  trap - EXIT INT TERM
  in_script || exit "$code"
  [ "${stopped:-0}" = 1 ] || stop_children
  exit "$code"
}
# A child forked for a node, a labeller or the monitor keeps these traps
# until it execs or sets its own; signalled in between, it must only end,
# not stop the script's children (it would wait 5 s for itself among
# them, since $$ is still the script's id).
in_script() { [ "$BASHPID" = "$$" ]; }
trap cleanup EXIT
# A signal that comes between a child's fork and the line that records its
# id is held until that line has run: stopped then, the script would miss
# the child for 5 s and then SIGKILL it with its own children, which init
# (or the script's parent) would inherit.
holding=0 held=0
interrupted() {
  in_script || exit 143
  if [ "$holding" = 1 ]; then held=1; return 0; fi
  echo "run_test.sh: interrupted" >&2
  exit 130
}
hold() { holding=1; }
release() {
  holding=0
  if [ "$held" = 1 ]; then interrupted; fi
}
trap interrupted INT TERM

start() { # label role rank-variable rank cmd...
  local label=$1 role=$2 rank_var=$3 rank=$4; shift 4
  local metrics_addr="${FPT_METRICS_ADDR:-}"
  if [ -n "$metrics_port" ]; then
    metrics_addr=":$((metrics_port + ${#pids[@]}))"
    echo "run_test.sh: $label serves metrics at http://localhost$metrics_addr/metrics"
  fi
  local env=(DMLC_ROLE="$role" FPT_METRICS_ADDR="$metrics_addr")
  [ -n "$rank_var" ] && env+=("$rank_var=$rank")
  [ "$role" = scheduler ] && [ -n "$status_port" ] && env+=(FPT_STATUS_ADDR="$DMLC_PS_ROOT_URI:$status_port")
  # stdout and stderr each through their own sed, to the script's own.
  # (out_fd and err_fd are global: an interrupted start leaves them for
  # stop_children to close.)
  exec {out_fd}> >(exec sed -u "s/^/[$label] /")
  exec {err_fd}> >(exec sed -u "s/^/[$label] /" >&2)
  hold
  env -u DMLC_TASK_ID -u DMLC_WORKER_ID -u DMLC_SERVER_ID "${env[@]}" "$@" >&"$out_fd" 2>&"$err_fd" {out_fd}>&- {err_fd}>&- &
  pids+=($!); names+=("$label")
  release
  # The node holds the seds' pipes now: they end once it has.
  exec {out_fd}>&- {err_fd}>&-
  out_fd="" err_fd=""
}

# label role i first: "worker 3" when pinned at first+i, else "worker local i".
node_label() {
  if [ -n "$3" ]; then echo "$1 $(($3 + $2))"; else echo "$1 local $2"; fi
}

echo "run_test.sh: cluster of $nserv servers and $nwork workers, scheduler at $root; here:$([ "$run_sched" = 1 ] && echo " scheduler,") $nserv_here servers, $nwork_here workers"
if [ -n "$status_port" ]; then
  if [ "$run_sched" = 1 ]; then
    echo "run_test.sh: scheduler status page at http://$DMLC_PS_ROOT_URI:$status_port/"
  else
    echo "run_test.sh: --status-port: the scheduler runs elsewhere; its status page is its host's" >&2
  fi
fi
set -m
[ "$run_sched" = 1 ] && start scheduler scheduler "" "" bin/fpt
for i in $(seq 0 $((nserv_here - 1))); do
  start "$(node_label server "$i" "$first_server")" server "${first_server:+DMLC_SERVER_ID}" "$((${first_server:-0} + i))" bin/fpt
done
for i in $(seq 0 $((nwork_here - 1))); do
  start "$(node_label worker "$i" "$first_worker")" worker "${first_worker:+DMLC_WORKER_ID}" "$((${first_worker:-0} + i))" bin/test_kv_app ${app_args[@]+"${app_args[@]}"}
done

if [ "$monitor" = 1 ]; then
  dev="${iface:-lo}"
  [ "$DMLC_PS_ROOT_URI" != 127.0.0.1 ] && [ -z "$iface" ] && dev=$(ip route get "$DMLC_PS_ROOT_URI" 2>/dev/null | sed -n 's/.* dev \([^ ]*\).*/\1/p' | head -1)
  hold
  (
    # SIGTERM ends the loop and its sleep together: nothing outlives the
    # script. The trap waits for every child, not only $nap: a signal
    # between `sleep 1 &` and `nap=$!` leaves $nap naming the last sleep.
    trap 'kill "$nap" 2>/dev/null; wait; exit 0' TERM
    read_bytes() { awk -v d="$dev:" '$1==d {print $2, $10}' /proc/net/dev; }
    set -- $(read_bytes); rx0=${1:-0}; tx0=${2:-0}
    while :; do
      sleep 1 & nap=$!
      wait "$nap"
      set -- $(read_bytes); rx=${1:-0}; tx=${2:-0}
      awk -v d="$dev" -v t=$((tx-tx0)) -v r=$((rx-rx0)) 'BEGIN{printf "[net %s] tx %.2f Gbit/s  rx %.2f Gbit/s\n", d, t*8/1e9, r*8/1e9}' >&2
      rx0=$rx; tx0=$tx
    done
  ) &
  mon_pid=$!
  release
fi
# Job control off again: it would report every stopped group, source and all.
set +m

# survivable reports whether the job goes on without the node labelled $1
# (FPT_ON_WORKER_LOSS=continue or wait, FPT_ON_SERVER_LOSS=retry).
survivable() {
  case "$1" in
    worker*) [ "${FPT_ON_WORKER_LOSS:-}" = continue ] || [ "${FPT_ON_WORKER_LOSS:-}" = wait ] ;;
    server*) [ "${FPT_ON_SERVER_LOSS:-}" = retry ] ;;
    *) false ;;
  esac
}

# Wait for every node; the first failure stops the rest, unless the job
# goes on without that node.
status=0
failed=""
lost=""
running=("${pids[@]}")
# next_done sets done_pid to a node that has exited. Not `wait -n`: with
# job control off, bash 5.2 files away a child it reaped while returning
# another one, and a later `wait -n` then waits for the monitor, for ever
# (seen when a host's server and worker ended together). `wait PID` finds
# a filed child's status.
next_done() {
  while :; do
    for pid in "${running[@]}"; do
      if ! kill -0 "$pid" 2>/dev/null; then
        done_pid=$pid
        return
      fi
    done
    sleep 0.1
  done
}
while [ ${#running[@]} -gt 0 ]; do
  done_pid=""
  next_done
  set +e
  wait "$done_pid"
  code=$?
  set -e
  still=()
  for pid in "${running[@]}"; do [ "$pid" != "$done_pid" ] && still+=("$pid"); done
  running=(${still[@]+"${still[@]}"})
  if [ "$code" -ne 0 ]; then
    name=""
    for i in "${!pids[@]}"; do
      [ "${pids[$i]}" = "$done_pid" ] && name="${names[$i]}"
    done
    if survivable "$name"; then
      echo "run_test.sh: $name exited with status $code; the job goes on without it" >&2
      lost="${lost:+$lost, }$name (status $code)"
      continue
    fi
    failed="$name exited with status $code"
    status=1
    break
  fi
done
# The monitor (its sleep too) goes before the final line, and so do the
# labellers' last lines.
if [ "$status" -eq 0 ]; then
  stop_children
fi
if [ "$status" -eq 0 ] && [ -n "$lost" ]; then
  echo "run_test.sh: the others finished cleanly; the job went on without $lost" >&2
  status=1
elif [ "$status" -eq 0 ]; then
  echo "run_test.sh: all ${#pids[@]} processes finished cleanly"
else
  # Their last lines come before the final one.
  stop_children
  echo "run_test.sh: $failed; stopped the others" >&2
fi
exit "$status"
