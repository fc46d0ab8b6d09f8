#!/usr/bin/env bash
# The sm90 forward's short tile entry on the GPU machine: the small build of sm90_bwd_loop.sh (ci kernels plus sm90
# d64/d128) with the ablation switch that lets the plan read FLASHATTN_SM90_SHORT_SEQLEN (no ablation kernels),
# the sm90 forward GPU suite and tile-shape tests, memcheck/racecheck on the forward's sanitizer cases, then
# fwd_short_tiles.py (both entries at the harness's shapes beside cuDNN).
# usage: bench/gpu/dev/fwd_short_dev.sh OUTDIR   (DEV_SEQLENS: fwd_short_tiles.py's --seqlens)
set -uo pipefail
OUT=$1
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
export DEV_BWD_WORK=${DEV_BWD_WORK:-/tmp/dev-short} DEV_HDIMS=${DEV_HDIMS:-64;128}
DEV_CMAKE_ARGS="-DFLASHATTN_SM90_ABLATIONS=ON -DFLASHATTN_SM90_ABLATION_VARIANTS=none" \
  DEV_SAN_FILTER=${DEV_SAN_FILTER:-'Sanitizer/Forward.*sm90_d64*:Sanitizer/Forward.*sm90_d128*'} DEV_BWD_BENCH=0 \
  DEV_GTEST_S=${DEV_GTEST_S:-200} \
  bash "$REPO/bench/gpu/dev/sm90_bwd_loop.sh" "$OUT" "${DEV_FILTER:-Sm90/Forward.*:*Sm90TileShapeReported*}"
PYTHONPATH=$DEV_BWD_WORK/pyroot timeout "${DEV_BENCH_S:-240}" python3 "$REPO/bench/gpu/dev/fwd_short_tiles.py" \
  --csv "$OUT/fwd_short_tiles.csv" ${DEV_SEQLENS:+--seqlens "$DEV_SEQLENS"} 2>&1 | tee "$OUT/fwd_short_tiles.log"
