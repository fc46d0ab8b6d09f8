#!/usr/bin/env bash
# Builds tma_rate.cu on the GPU machine and times each copy mechanism (see its header); TSV to OUTDIR/tma_rate.tsv.
# usage: bench/gpu/dev/tma_rate/run.sh OUTDIR
set -uo pipefail
OUT=$1
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../../../.." && pwd)
W=/tmp/tma-rate
mkdir -p "$W" "$OUT"
if [[ ! -f $W/cutlass/cutlass_library/source/include/cute/tensor.hpp ]]; then
  python3 - "$(ls "$REPO"/.whl/nvidia_cutlass-*.whl | head -1)" "$W/cutlass" <<'PYEOF'
import sys, zipfile
p = "cutlass_library/source/include/"
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith(p)])
PYEOF
fi
nvcc -std=c++17 -arch=sm_90a -O3 -I"$W/cutlass/cutlass_library/source/include" "$HERE/tma_rate.cu" -o "$W/tma_rate" -lcuda ||
  exit 1
T="$OUT/tma_rate.tsv"
printf 'mode\tinner_bytes\tbox_rows\tstages\twarps\tctas_per_sm\tGB/s\tper_SM_GB/s\n' >"$T"
run() { timeout 30 "$W/tma_rate" "$@" | tee -a "$T"; }
for stages in 2 4 6; do
  for warps in 1 4; do
    for rows in 16 64 128; do run tma 128 $rows $stages $warps 1; done
    for rows in 16 128; do run tma 256 $rows $stages $warps 1; run tma 64 $rows $stages $warps 1; done
    run bulk 256 1 $stages $warps 1
  done
  run cpasync 16 1 $stages 4 1
done
for warps in 1 4; do
  run tma 128 16 3 $warps 2; run tma 128 128 3 $warps 2; run tma 256 16 3 $warps 2; run bulk 256 1 3 $warps 2
done
run cpasync 16 1 3 4 2
