#!/usr/bin/env bash
# How cocemu's collectives scale with the number of ranks, against the memory floor measured in
# the same run (issue "Host speed at every scale"):
#   - STREAM copy bandwidth with 2 threads;
#   - all_reduce of 4 MiB per rank, out of place, at 8, 16, 32 and 64 ranks, and of 64 MiB at 8:
#     host wall time (median per call) against the floor 2·n·S / copy bandwidth;
#   - all_reduce of 4 KiB at 8 and 64 ranks (latency through the streams): as the sweep above
#     measures it (one untimed call, then 9 samples of 50 calls: a fresh world's first calls,
#     which fault in its op log and heap), and in steady state (500 untimed calls, 60 samples).
# With BASELINE=path/to/another/cocemu the same figures are measured for that binary too, its runs
# alternating with this build's (before/after comparisons on a noisy machine).
#
#   bench/scale_peers.sh [REPS]      (STREAM source: $PEERS/src/stream.c, default ../shared/peers)
set -euo pipefail
cd "$(dirname "$0")/.."
REPS="${1:-3}"
PEERS="${PEERS:-../shared/peers}"
[ -f "$PEERS/src/stream.c" ] || { echo "scale_peers: no $PEERS/src/stream.c" >&2; exit 2; }
[ -x build/cli/cocemu ] || bash ./bootstrap.sh deps && cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build build -j2 >/dev/null
declare -A bins=([this]="./build/cli/cocemu")
if [ -n "${BASELINE:-}" ]; then
  [ -x "$BASELINE" ] || { echo "scale_peers: BASELINE=$BASELINE is not an executable" >&2; exit 2; }
  bins[baseline]="$BASELINE"
fi
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
gcc -O3 -march=native -fopenmp "$PEERS/src/stream.c" -o "$out/stream"
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
# wall_us of the out-of-place all_reduce row of SIZE in a collbench JSON
wall_of() {
  awk -v RS='{' -v size="\"size_bytes\": $2," '/"in_place": false/ && index($0, size) {
    match($0, /"wall_us": [0-9.e+-]+/); print substr($0, RSTART + 11, RLENGTH - 11)}' "$1"
}
: > "$out/copy"
for r in $(seq "$REPS"); do
  OMP_NUM_THREADS=2 "$out/stream" 256 10 | awk '$1 == "copy" {print $3}' >> "$out/copy"
  order=$(printf "%s\n" "${!bins[@]}" | sort); [ $((r % 2)) = 0 ] && order=$(echo "$order" | tac)
  for b in $order; do
    for n in 8 16 32 64; do
      "${bins[$b]}" collbench -n "$n" --ops all_reduce -b 4096 -e 4194304 -f 1024 --check 0 \
        --json "$out/c.json" >/dev/null
      wall_of "$out/c.json" 4194304 >> "$out/$b-w4m-$n"
      wall_of "$out/c.json" 4096 >> "$out/$b-w4k-$n"
    done
    "${bins[$b]}" collbench -n 8 --ops all_reduce -b 67108864 -e 67108864 --check 0 \
      --json "$out/c.json" >/dev/null
    wall_of "$out/c.json" 67108864 >> "$out/$b-w64m"
    for n in 8 64; do
      "${bins[$b]}" collbench -n "$n" --ops all_reduce -b 4096 -e 4096 --check 0 -w 500 \
        --samples 60 --json "$out/c.json" >/dev/null
      wall_of "$out/c.json" 4096 >> "$out/$b-s4k-$n"
    done
  done
done
copy=$(median < "$out/copy")
row() {  # ranks size wall_us
  awk -v n="$1" -v s="$2" -v w="$3" -v bw="$copy" 'BEGIN {
    floor = 2 * n * s / (bw * 1e9) * 1e3;
    printf "%6d %9.0fK %12.2f %12.2f %7.2fx\n", n, s / 1024, w / 1e3, floor, w / 1e3 / floor }'
}
for b in $(printf "%s\n" "${!bins[@]}" | sort -r); do
  echo "# scale_peers ($b: ${bins[$b]}): medians of $REPS runs, all_reduce f32 out of place;" \
    "STREAM copy $copy GB/s (2 threads)"
  printf "%6s %10s %12s %12s %8s\n" ranks "per rank" "wall ms" "floor ms" ratio
  for n in 8 16 32 64; do row "$n" 4194304 "$(median < "$out/$b-w4m-$n")"; done
  row 8 67108864 "$(median < "$out/$b-w64m")"
  latency() {  # label file-prefix
    local a8 a64
    a8=$(median < "$out/$2-8"); a64=$(median < "$out/$2-64")
    printf "4 KiB all_reduce latency, %s: 8 ranks %.1f us, 64 ranks %.1f us (%.1fx)\n" "$1" \
      "$a8" "$a64" "$(awk -v a="$a64" -v b="$a8" 'BEGIN {print a / b}')"
    # Each repetition's own ratio: its 8- and 64-rank figures are measured seconds apart.
    printf "  per run (64 / 8 ranks):%s\n" "$(paste -d' ' "$out/$2-8" "$out/$2-64" |
      awk '{printf " %.1fx", $2 / $1}')"
  }
  latency "fresh world (1 untimed call, 9 x 50 timed)" "$b-w4k"
  latency "steady state (500 untimed calls, 60 x 50 timed)" "$b-s4k"
done
