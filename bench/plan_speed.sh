#!/usr/bin/env bash
# Host speed of `cocemu plan` (#13): the full LLaMA2-70B search on 64 nodes of 8 NPUs (global
# batch 1024, seq 4096) on 1 and on 2 threads — wall time and candidates per second (of the
# parallel pruning-and-evaluation phase), median of RUNS (default 5), and the 2-thread speedup.
set -euo pipefail
cd "$(dirname "$0")/.."
COCEMU=${COCEMU:-./build/bench/cocemu}
RUNS=${RUNS:-5}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}'; }
declare -A rate
for threads in 1 2; do
  : >"$out/rates" && : >"$out/walls"
  for _ in $(seq "$RUNS"); do
    t0=$(date +%s.%N)
    "$COCEMU" plan --model llama2-70b --nodes 64 --global-batch 1024 --seq 4096 \
      --threads "$threads" --no-heuristic-compare --out-dir "$out" |
      sed -n 's/.*(\([0-9]*\) candidates\/s).*/\1/p' >>"$out/rates"
    t1=$(date +%s.%N)
    echo "$t1 - $t0" | bc >>"$out/walls"
  done
  rate[$threads]=$(median <"$out/rates")
  printf "plan llama2-70b, 512 devices, %d thread(s): %8.3f s wall, %8d candidates/s (median of %d)\n" \
    "$threads" "$(median <"$out/walls")" "${rate[$threads]}" "$RUNS"
done
echo "2 threads / 1 thread: $(echo "scale=2; ${rate[2]} / ${rate[1]}" | bc)x"
