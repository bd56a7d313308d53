#!/usr/bin/env bash
# Host speed of `cocemu train` (#12's benchmark figures): the default real-numerics step on 8
# ranks, and the full-size LLaMA2-70B dry run on 64 nodes (512 devices, step model). Prints the
# wall time of each, median of RUNS (default 3).
set -euo pipefail
cd "$(dirname "$0")/.."
COCEMU=${COCEMU:-./build/cli/cocemu}
RUNS=${RUNS:-3}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}'; }
measure() {
  local label=$1
  shift
  for _ in $(seq "$RUNS"); do
    local t0 t1
    t0=$(date +%s.%N)
    "$COCEMU" train "$@" --out-dir "$out" >/dev/null
    t1=$(date +%s.%N)
    echo "$t1 - $t0" | bc
  done | median | xargs printf "%-58s %8.3f s (median of $RUNS)\n" "$label"
}
measure "default real-numerics step (8 ranks, tp2 dp2 pp2)"
measure "llama2-70b dry run, 64 nodes, tp8 pp8 dp8, gbs 1024" \
  --dry-run --model llama2-70b --nodes 64 --tensor-model-parallel-size 8 \
  --pipeline-model-parallel-size 8 --global-batch-size 1024
