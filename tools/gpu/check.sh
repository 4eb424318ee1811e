#!/usr/bin/env bash
# The GPU checks, on a machine with an NVIDIA GPU, its driver and NCCL but
# without our Debian packages: runs the pack that tools/gpu/pack.sh made
# (this script is copied into it) through the glibc loader it carries.
#
#   1. nccl_gpu_test: push-pull (sum, average) and broadcast on CUDA
#      buffers, exact on integer-valued data, every float type, odd sizes;
#      an NCCL initialization and an allreduce aborted while a peer is
#      missing.
#   2. data_plane_gpu_ipc_test: the agent's data plane on CUDA tensors of
#      trainers in other processes (CUDA IPC handles and ready events):
#      push-pull and broadcast with --gpu_cross_node=nccl (one agent) and
#      gloo (two agents sharing GPU 0), results checked by the trainers.
#   3. baton-gpu-bench: the transport's allreduce, and the agent's
#      push-pull through its data plane (scheduler, 4 MiB partitions),
#      against a direct ncclAllReduce of the same buffers, 1 MiB to 1 GiB,
#      and their ratios.
#
# Usage: check.sh [PACK_DIR]   (default: the folder this script is in)
# Environment:
#   OUT                      results go there (logs, gtest XML, bench JSON
#                            lines, summary.txt); default a temporary folder
#   BATON_NCCL_LIBRARY_DIR   where libnccl.so.2 is, when not found by itself
#   BATON_GPU_BENCH_ARGS     extra flags for baton-gpu-bench
# Exit: 0 when the tests passed (or skipped: no CUDA device) and the
# benchmark ran; 1 otherwise. Bounded to under 5 minutes: at most 30 s to
# find NCCL, then 110 + 70 + 80 s for the three steps.
set -uo pipefail

pack=$(cd "${1:-$(dirname "$0")}" && pwd)
if [ ! -x "$pack/bin/nccl_gpu_test" ] || [ ! -x "$pack/bin/data_plane_gpu_ipc_test" ]; then
  echo "check.sh: no pack in $pack: run tools/gpu/pack.sh first and give its folder" >&2
  exit 1
fi
results=${OUT:-$(mktemp -d /tmp/baton-gpu-check.XXXXXX)}
mkdir -p "$results"
started=$(date +%s)

# libnccl.so.2 of this machine: where the loader finds it, or where CUDA,
# the system or Python's NVIDIA wheels (PyTorch) put it.
find_nccl() {
  local dir search=${LD_LIBRARY_PATH:-}
  for dir in "${BATON_NCCL_LIBRARY_DIR:-}" ${search//:/ } \
      /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu \
      /usr/lib64 /usr/local/lib; do
    if [ -n "$dir" ] && [ -e "$dir/libnccl.so.2" ]; then
      echo "$dir"
      return
    fi
  done
  dir=$(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 / {print $NF; exit}')
  if [ -n "$dir" ]; then
    dirname "$dir"
    return
  fi
  for python in python3 python; do
    dir=$("$python" -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib"))' 2>/dev/null) &&
      [ -e "$dir/libnccl.so.2" ] && { echo "$dir"; return; }
  done
  dir=$(timeout 30 find / -xdev \( -path /proc -o -path /sys \) -prune -o \
    -name libnccl.so.2 -print 2>/dev/null | head -1)
  [ -n "$dir" ] && dirname "$dir"
}
nccl_dir=$(find_nccl)
library_path="$pack/lib${nccl_dir:+:$nccl_dir}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# Runs a packed binary with our loader and libraries, within a time limit.
run() {
  local limit=$1 binary=$2
  shift 2
  timeout --kill-after=10 "$limit" "$pack/lib/ld-linux-x86-64.so.2" \
    --library-path "$library_path" "$pack/bin/$binary" "$@"
}

summary="$results/summary.txt"
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }

say "baton GPU check: $(head -1 "$pack/MANIFEST" 2>/dev/null)"
say "NCCL library: ${nccl_dir:-not found (set BATON_NCCL_LIBRARY_DIR)}"

# Says how a gtest binary of the pack did (exit code `rc`), from its log:
# counts, the failures with the lines that explain them, and what skipped.
summarize_tests() {
  local name=$1 rc=$2 log="$results/$1.log" passed skipped failed why=""
  passed=$(grep -cE '^\[       OK \]' "$log")
  skipped=$(grep -cE '^\[  SKIPPED \] [A-Za-z]' "$log")
  failed=$(grep -cE '^\[  FAILED  \] [A-Za-z].*\(' "$log")
  if [ "$rc" -eq 0 ]; then
    say "$name: passed ($passed ok, $skipped skipped)"
  elif [ "$rc" -eq 77 ]; then
    say "$name: $(grep -m1 '^skipped:' "$log")"
  else
    [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && why=", timed out"
    say "$name: FAILED (exit $rc$why; $passed ok, $skipped skipped, $failed failed)"
    grep -A6 -E '^\[  FAILED  \] [A-Za-z].*\(|Failure$' "$log" |
      grep -vE '^(--|\[ RUN|\[       OK|\[--|\[==|\[  PASSED|Value of:|  Actual:|Expected:|$)' |
      head -60 | tee -a "$summary"
    [ -n "$why" ] && tail -5 "$log" | sed 's/^/  last: /' | tee -a "$summary"
  fi
  grep -A1 -E '^\[  SKIPPED \] [A-Za-z]|Skipped$' "$log" |
    grep -v '^--' | sed 's/^/  /' | tee -a "$summary"
}

run 110 nccl_gpu_test --gtest_output="xml:$results/nccl_gpu_test.xml" \
  > "$results/nccl_gpu_test.log" 2>&1
tests_rc=$?
if [ $tests_rc -eq 77 ]; then
  say "$(grep -m1 '^skipped:' "$results/nccl_gpu_test.log")"
  say "results: $results"
  exit 0
fi
say "devices: $(head -1 "$results/nccl_gpu_test.log")"
summarize_tests nccl_gpu_test $tests_rc

# The trainers are this binary started again (through the same loader);
# NCCL_DEBUG=WARN puts NCCL's own account of an error in the log.
NCCL_DEBUG=${NCCL_DEBUG:-WARN} run 70 data_plane_gpu_ipc_test \
  --gtest_output="xml:$results/data_plane_gpu_ipc_test.xml" \
  > "$results/data_plane_gpu_ipc_test.log" 2>&1
ipc_rc=$?
summarize_tests data_plane_gpu_ipc_test $ipc_rc

# shellcheck disable=SC2086
run 80 baton-gpu-bench ${BATON_GPU_BENCH_ARGS:-} > "$results/gpu_bench.txt" 2>&1
bench_rc=$?
grep '^{' "$results/gpu_bench.txt" > "$results/gpu_bench.jsonl"
if [ $bench_rc -eq 0 ]; then
  say "baton-gpu-bench: $(grep -c '^{' "$results/gpu_bench.txt") sizes"
  grep '^# ' "$results/gpu_bench.txt" | tail -n +2 | tee -a "$summary"
else
  say "baton-gpu-bench: FAILED (exit $bench_rc)"
  tail -5 "$results/gpu_bench.txt" | tee -a "$summary"
fi

say "took $(( $(date +%s) - started )) s; results: $results"
if [ $tests_rc -eq 0 ] && { [ $ipc_rc -eq 0 ] || [ $ipc_rc -eq 77 ]; } &&
  [ $bench_rc -eq 0 ]; then
  say "all GPU checks passed"
  exit 0
fi
exit 1
