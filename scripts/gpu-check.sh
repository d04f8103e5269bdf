#!/usr/bin/env bash
# Checks fpt's GPU training on a machine with a GPU and PyTorch but no Go:
# it runs the prebuilt bin/fpt and build/lib/libfpt.so (with the runtime
# libraries --prepare copied next to them), and finishes within 5 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

usage() {
	cat <<'TXT'
usage: scripts/gpu-check.sh [--prepare] [--cpu] [--params N]

Checks fpt's GPU training with the prebuilt bin/fpt and build/lib/libfpt.so
(no Go needed), within 5 minutes on one GPU:
  1. exactness: 2 workers on one GPU train the example model with
     fpt.torch.DistributedOptimizer (2 backward passes per step) and with
     DDP + fpt.torch.comm_hook; their parameters equal one process trained
     on the whole batch within 1e-5, and within bfloat16 rounding over a
     bf16 wire (python/tests/gpu_checks.py train); 3 workers' bfloat16 sums,
     16-bit wires and fpt.allreduce (of a CUDA tensor too) are exact or
     within one rounding (gpu_checks.py collective);
  2. a table of ms per step for an MLP of --params parameters (default 21 M)
     at 2 and 4 workers: fpt (as many servers as workers), fpt over a bf16
     wire, DDP over gloo with CUDA tensors, and one process without
     communication (python/tests/gpu_bench.py);
  3. the pinned copies' share of fpt's step: every gradient copied to pinned
     host memory and back, timed alone, over the step time.

  --prepare   on the build machine: copy the shared libraries bin/fpt and
              libfpt.so need (ldd; not the C library's own) into
              build/lib/runtime, which this script puts on LD_LIBRARY_PATH
  --cpu       run on the CPU even where CUDA is available (a small model:
              the check of the script itself on a machine without a GPU)
  --params N  the benchmark model's parameters

Environment read: FPT_PYTHON (the interpreter, default python3),
LD_LIBRARY_PATH (build/lib/runtime is put first), and sets FPT_LIB, FPT_BIN,
PYTHONPATH and DEVICE (cuda or cpu) for the programs it runs.
TXT
}

prepare=0 cpu=0 params=
while [ $# -gt 0 ]; do
	case $1 in
	-h | --help) usage; exit 0 ;;
	--prepare) prepare=1 ;;
	--cpu) cpu=1 ;;
	--params) params=$2; shift ;;
	*) echo "gpu-check.sh: unknown argument $1 (gpu-check.sh -h)" >&2; exit 2 ;;
	esac
	shift
done

for f in bin/fpt build/lib/libfpt.so; do
	[ -e "$f" ] || { echo "gpu-check.sh: $f is missing: build it with scripts/build.sh first" >&2; exit 1; }
done
if [ "$prepare" = 1 ]; then
	mkdir -p build/lib/runtime
	# The system's own C and C++ runtime stay the GPU machine's.
	ldd bin/fpt build/lib/libfpt.so | awk '/=> \// {print $3}' | sort -u |
		grep -Ev '/(libc|libm|libpthread|libdl|librt|libresolv|libgcc_s|libstdc\+\+|ld-linux[^/]*)\.so' |
		while read -r lib; do cp -L "$lib" build/lib/runtime/; done
	du -sh build/lib/runtime
	exit 0
fi

export LD_LIBRARY_PATH="$repo/build/lib/runtime${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export FPT_LIB="$repo/build/lib/libfpt.so" FPT_BIN="$repo/bin/fpt" PYTHONPATH="$repo/python"
py=${FPT_PYTHON:-python3}
export FPT_PYTHON="$py"
if [ "$cpu" = 0 ] && "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
	export DEVICE=cuda
	params=${params:-21000000}
else
	export DEVICE=cpu
	params=${params:-300000}
	echo "gpu-check.sh: no CUDA (or --cpu): the CPU fallback with a $params-parameter model; the CUDA path does not run"
fi
"$py" -c 'import torch; print("torch", torch.__version__, "cuda" if torch.cuda.is_available() else "no cuda",
                           torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")'
fptrun() { timeout "$1" "$py" -m fpt.run "${@:2}"; }
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT

echo "== 1. exactness: 2 workers on one $DEVICE vs one process"
if fptrun 150 -np 2 --servers 1 "$py" python/tests/gpu_checks.py train >"$log/exact" 2>&1; then
	grep -E '^\[worker0\] (ok|FAIL|skip)' "$log/exact" | sed 's/^\[worker0\] /  /'
else
	tail -40 "$log/exact"
	echo "gpu-check.sh: the exactness check failed" >&2
	exit 1
fi

if fptrun 120 -np 3 --servers 1 "$py" python/tests/gpu_checks.py collective >"$log/coll" 2>&1; then
	grep -E '^\[worker0\] (ok|FAIL|skip)' "$log/coll" | grep -E 'CUDA|exact|within' | sed 's/^\[worker0\] /  /'
else
	tail -40 "$log/coll"
	echo "gpu-check.sh: the collective check (3 workers) failed" >&2
	exit 1
fi

echo "== 2. ms per step, a $params-parameter MLP on $DEVICE"
bench() { grep -h '^\(\[worker0\] \)\?RESULT\|^\(\[worker0\] \)\?PINNED' "$@" | sed 's/^\[worker0\] //'; }
"$py" python/tests/gpu_bench.py none --params "$params" >"$log/none" 2>&1 || tail -5 "$log/none"
for w in 2 4; do
	# One server per worker, as a job on one machine would run: a single
	# server carries every worker's bytes both ways.
	fptrun 60 -np "$w" --servers "$w" "$py" python/tests/gpu_bench.py fpt --params "$params" >"$log/fpt$w" 2>&1 || tail -5 "$log/fpt$w"
	fptrun 60 -np "$w" --servers "$w" "$py" python/tests/gpu_bench.py fpt --compression bf16 --params "$params" \
		>"$log/bf$w" 2>&1 || tail -5 "$log/bf$w"
	timeout 60 "$py" python/tests/gpu_bench.py ddp --workers "$w" --params "$params" >"$log/ddp$w" 2>&1 ||
		tail -5 "$log/ddp$w"
done
printf '  %-10s %8s %12s\n' system workers "ms/step"
bench "$log"/none "$log"/fpt2 "$log"/bf2 "$log"/ddp2 "$log"/fpt4 "$log"/bf4 "$log"/ddp4 |
	awk '$1 == "RESULT" {printf "  %-10s %8d %12.2f\n", $2, $3, $4}'

echo "== 3. the pinned copies' share of fpt's step"
for w in 2 4; do
	bench "$log/fpt$w" | awk -v w="$w" '$1 == "PINNED" {printf "  %d workers: %.2f ms of copies to pinned memory and back, %.1f%% of the step\n", w, $2, 100 * $3}'
done
echo "gpu-check.sh: done"
