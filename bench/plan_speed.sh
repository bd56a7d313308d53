#!/usr/bin/env bash
# Host speed of `cocemu plan` (#13), on 1 and on 2 threads, median of RUNS (default 5):
#  - the full LLaMA2-70B search on 64 nodes of 8 NPUs (global batch 1024, seq 4096): the issue's
#    "under 30 s" case; it takes a fraction of a second, so thread start-up weighs on its ratio;
#  - a larger one, GPT-3 175B on 128 nodes (global batch 1536, cp up to 16, vpp up to 8).
# Prints wall time, candidates per second of the parallel pruning-and-evaluation phase, and the
# 2-thread / 1-thread ratio of the latter (of the medians, and over interleaved pairs of runs).
set -euo pipefail
cd "$(dirname "$0")/.."
COCEMU=${COCEMU:-./build/cli/cocemu}
RUNS=${RUNS:-5}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}'; }
search() {
  local label=$1
  shift
  : >"$out/rates1" && : >"$out/rates2" && : >"$out/walls1" && : >"$out/walls2" && : >"$out/pairs"
  # 1- and 2-thread runs alternate, so that the machine's drift hits both alike; each pair's
  # ratio is kept too.
  for _ in $(seq "$RUNS"); do
    for threads in 1 2; do
      t0=$(date +%s.%N)
      "$COCEMU" plan "$@" --threads "$threads" --no-heuristic-compare --out-dir "$out" |
        sed -n 's/.*(\([0-9]*\) candidates\/s).*/\1/p' >"$out/rate"
      t1=$(date +%s.%N)
      echo "$t1 - $t0" | bc >>"$out/walls$threads"
      cat "$out/rate" >>"$out/rates$threads"
      [ "$threads" = 1 ] && one=$(cat "$out/rate")
    done
    echo "scale=3; $(cat "$out/rate") / $one" | bc >>"$out/pairs"
  done
  for threads in 1 2; do
    printf "%-40s %d thread(s): %7.3f s wall, %8d candidates/s (median of %d)\n" "$label" \
      "$threads" "$(median <"$out/walls$threads")" "$(median <"$out/rates$threads")" "$RUNS"
  done
  printf "%-40s 2 threads / 1 thread: %sx of the medians; pairs %s..%s, median %s\n" "$label" \
    "$(echo "scale=2; $(median <"$out/rates2") / $(median <"$out/rates1")" | bc)" \
    "$(sort -g "$out/pairs" | head -1)" "$(sort -g "$out/pairs" | tail -1)" \
    "$(median <"$out/pairs")"
}
search "llama2-70b, 512 devices, gbs 1024" --model llama2-70b --nodes 64 --global-batch 1024 \
  --seq 4096
search "gpt3-175b, 1024 devices, gbs 1536" --model gpt3-175b --nodes 128 --global-batch 1536 \
  --max-cp 16 --max-vpp 8
