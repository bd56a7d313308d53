#!/usr/bin/env bash
# How cocemu's collectives scale with the number of ranks, against the memory floor measured in
# the same run (issue "Host speed at every scale"):
#   - STREAM copy bandwidth with 2 threads;
#   - all_reduce of 4 MiB per rank, out of place, at 8, 16, 32 and 64 ranks, and of 64 MiB at 8:
#     host wall time (median per call) against the floor 2·n·S / copy bandwidth;
#   - all_reduce of 4 KiB at 8 and 64 ranks (latency through the streams).
#
#   bench/scale_peers.sh [REPS]      (STREAM source: $PEERS/src/stream.c, default ../shared/peers)
set -euo pipefail
cd "$(dirname "$0")/.."
REPS="${1:-3}"
PEERS="${PEERS:-../shared/peers}"
[ -f "$PEERS/src/stream.c" ] || { echo "scale_peers: no $PEERS/src/stream.c" >&2; exit 2; }
[ -x build/bench/cocemu ] || bash ./bootstrap.sh deps && cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build build -j2 >/dev/null
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
  for n in 8 16 32 64; do
    ./build/bench/cocemu collbench -n "$n" --ops all_reduce -b 4096 -e 4194304 -f 1024 --check 0 \
      --json "$out/c$n.json" >/dev/null
    wall_of "$out/c$n.json" 4194304 >> "$out/w4m-$n"
    wall_of "$out/c$n.json" 4096 >> "$out/w4k-$n"
  done
  ./build/bench/cocemu collbench -n 8 --ops all_reduce -b 67108864 -e 67108864 --check 0 \
    --json "$out/c64m.json" >/dev/null
  wall_of "$out/c64m.json" 67108864 >> "$out/w64m"
done
copy=$(median < "$out/copy")
echo "# scale_peers: medians of $REPS runs, all_reduce f32 out of place; STREAM copy $copy GB/s (2 threads)"
printf "%6s %10s %12s %12s %8s\n" ranks "per rank" "wall ms" "floor ms" ratio
row() {  # ranks size wall_us
  awk -v n="$1" -v s="$2" -v w="$3" -v bw="$copy" 'BEGIN {
    floor = 2 * n * s / (bw * 1e9) * 1e3;
    printf "%6d %9.0fK %12.2f %12.2f %7.2fx\n", n, s / 1024, w / 1e3, floor, w / 1e3 / floor }'
}
for n in 8 16 32 64; do row "$n" 4194304 "$(median < "$out/w4m-$n")"; done
row 8 67108864 "$(median < "$out/w64m")"
printf "4 KiB all_reduce latency: 8 ranks %.1f us, 64 ranks %.1f us\n" \
  "$(median < "$out/w4k-8")" "$(median < "$out/w4k-64")"
