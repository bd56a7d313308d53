#!/usr/bin/env bash
# Host speed of `cocemu plan` (#13), on 1 and on 2 threads, median of RUNS (default 5):
#  - the full LLaMA2-70B search on 64 nodes of 8 NPUs (global batch 1024, seq 4096): the issue's
#    "under 30 s" case; it takes a fraction of a second, so thread start-up weighs on its ratio;
#  - a larger one, GPT-3 175B on 128 nodes (global batch 1536, cp up to 16, vpp up to 8).
# Prints wall time, candidates per second of the parallel pruning-and-evaluation phase, and the
# 2-thread / 1-thread ratio of the latter.
set -euo pipefail
cd "$(dirname "$0")/.."
COCEMU=${COCEMU:-./build/bench/cocemu}
RUNS=${RUNS:-5}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}'; }
search() {
  local label=$1
  shift
  declare -A rate
  for threads in 1 2; do
    : >"$out/rates" && : >"$out/walls"
    for _ in $(seq "$RUNS"); do
      t0=$(date +%s.%N)
      "$COCEMU" plan "$@" --threads "$threads" --no-heuristic-compare --out-dir "$out" |
        sed -n 's/.*(\([0-9]*\) candidates\/s).*/\1/p' >>"$out/rates"
      t1=$(date +%s.%N)
      echo "$t1 - $t0" | bc >>"$out/walls"
    done
    rate[$threads]=$(median <"$out/rates")
    printf "%-40s %d thread(s): %7.3f s wall, %8d candidates/s (median of %d)\n" "$label" \
      "$threads" "$(median <"$out/walls")" "${rate[$threads]}" "$RUNS"
  done
  printf "%-40s 2 threads / 1 thread: %sx\n" "$label" "$(echo "scale=2; ${rate[2]} / ${rate[1]}" | bc)"
}
search "llama2-70b, 512 devices, gbs 1024" --model llama2-70b --nodes 64 --global-batch 1024 \
  --seq 4096
search "gpt3-175b, 1024 devices, gbs 1536" --model gpt3-175b --nodes 128 --global-batch 1536 \
  --max-cp 16 --max-vpp 8
