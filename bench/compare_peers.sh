#!/usr/bin/env bash
# Measures cocemu's collectives against the peers of this machine in one run:
#   - STREAM copy bandwidth with 2 threads (the memory floor of a host-side all_reduce),
#   - OpenMPI over shared memory (vader), 8 processes,
#   - cocemu collbench all_reduce, 8 ranks,
# and prints the figures the runtime issue asks for, as ratios (the machine is shared and noisy).
#
#   bench/compare_peers.sh [REPS]      (peers' sources: $PEERS, default ../shared/peers)
set -euo pipefail
cd "$(dirname "$0")/.."
REPS="${1:-3}"
PEERS="${PEERS:-../shared/peers}"
[ -d "$PEERS/src" ] || { echo "compare_peers: no peer sources in $PEERS/src" >&2; exit 2; }
for p in openmpi-bin libopenmpi-dev; do
  dpkg -s "$p" >/dev/null 2>&1 || { export DEBIAN_FRONTEND=noninteractive; apt-get update -qq;
    apt-get install -y -qq openmpi-bin libopenmpi-dev >/dev/null; break; }
done
[ -x build/cli/cocemu ] || bash ./bootstrap.sh deps && cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build build -j2 >/dev/null
out="$(mktemp -d)"
gcc -O3 -march=native -fopenmp "$PEERS/src/stream.c" -o "$out/stream"
mpicc -O3 -march=native "$PEERS/src/mpi_coll.c" -o "$out/mpi_coll"
ROOT=""; [ "$(id -u)" = 0 ] && ROOT="--allow-run-as-root"
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
: > "$out/copy"; : > "$out/mpi16"; : > "$out/c4k"; : > "$out/c16"; : > "$out/c64"
for r in $(seq "$REPS"); do
  OMP_NUM_THREADS=2 "$out/stream" 256 10 | awk '$1 == "copy" {print $3}' >> "$out/copy"
  mpirun $ROOT --oversubscribe --bind-to none --mca pml ob1 --mca btl self,vader \
    --mca oob_tcp_if_include lo --mca btl_tcp_if_include lo -np 8 "$out/mpi_coll" 64 2>/dev/null |
    awk '$1 == "all_reduce" && $3 == 16777216 {print $9}' >> "$out/mpi16"
  ./build/cli/cocemu collbench --ops all_reduce -b 4096 -e 67108864 -f 4 --json "$out/c.json" >/dev/null
  # rows: out-of-place (as MPI measures); fields from the JSON written by collbench
  awk -v RS='{' '/"op": "all_reduce"/ && /"in_place": false/' "$out/c.json" |
    awk -v RS='{' '/"size_bytes": 4096,/ {match($0, /"wall_us": [0-9.e+-]+/); print substr($0, RSTART+11, RLENGTH-11)}' >> "$out/c4k"
  awk -v RS='{' '/"in_place": false/ && /"size_bytes": 16777216,/ {match($0, /"busbw_gbps": [0-9.e+-]+/); print substr($0, RSTART+14, RLENGTH-14)}' "$out/c.json" >> "$out/c16"
  awk -v RS='{' '/"in_place": false/ && /"size_bytes": 67108864,/ {match($0, /"wall_us": [0-9.e+-]+/); print substr($0, RSTART+11, RLENGTH-11)}' "$out/c.json" >> "$out/c64"
done
copy=$(median < "$out/copy"); mpi16=$(median < "$out/mpi16"); c4k=$(median < "$out/c4k")
c16=$(median < "$out/c16"); c64=$(median < "$out/c64")
floor_ms=$(awk -v bw="$copy" 'BEGIN {print 2 * 8 * 67108864 / (bw * 1e9) * 1e3}')
echo "# compare_peers: medians of $REPS runs, 8 ranks, f32, out-of-place (as OpenMPI's benchmark)"
printf "STREAM copy, 2 threads:                 %8.2f GB/s\n" "$copy"
printf "all_reduce 16 MiB busbw: cocemu %6.3f GB/s, OpenMPI %6.3f GB/s -> %.2fx (target >= 2x)\n" "$c16" "$mpi16" "$(awk -v a="$c16" -v b="$mpi16" 'BEGIN {print a / b}')"
printf "all_reduce 64 MiB: cocemu %8.1f ms, floor 2nS/copy %6.1f ms -> %.2fx (target <= 1.5x)\n" "$(awk -v t="$c64" 'BEGIN {print t / 1e3}')" "$floor_ms" "$(awk -v t="$c64" -v f="$floor_ms" 'BEGIN {print t / 1e3 / f}')"
printf "all_reduce 4 KiB latency: cocemu %6.1f us (target <= 50 us)\n" "$c4k"
rm -rf "$out"
