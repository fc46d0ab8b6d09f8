#!/usr/bin/env bash
# Written in session 34, run in session 35 (bench/results/2026-12-06_h100_session35, run 1): the rows' LSE and 1 / sum
# taken under the tile's last P.V (docs/journal/patches/fwd_finish_under_pv.patch). sm90_bwd_loop.sh builds it with
# the ablation variants late_finish / late_finish_d64, runs the sm90 forward suites on the new default and memcheck +
# racecheck on the sm90 forward sanitizer cases; then the A/B against the variants in one process. Run it on a
# patched copy (the checkout stays):
#   bash bench/gpu/dev/with_patch.sh docs/journal/patches/fwd_finish_under_pv.patch \
#     bench/results/2026-12-06_h100_session34/call_finish.sh $OUT
set -uo pipefail
OUT=$1
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
DEV_BWD_WORK=/tmp/dev-f DEV_HDIMS="64;128" DEV_BWD_BENCH=0 DEV_GTEST_S=120 DEV_SAN_FILTER='Sanitizer/Forward.*sm90*' \
  DEV_CMAKE_ARGS="-DFLASHATTN_SM90_ABLATIONS=ON -DFLASHATTN_SM90_ABLATION_VARIANTS=late_finish;late_finish_d64" \
  bash "$REPO/bench/gpu/dev/sm90_bwd_loop.sh" "$OUT" 'Sm90*/Forward.*:Sm90/Fp8Forward.*:Sm90TileCounter.*:Paged*:Sm90Dropout/*' ||
  exit 1
rm -f "$OUT/build.log"
cd "$REPO/bench/gpu/dev"
export PYTHONPATH=/tmp/dev-f/pyroot
timeout 110 python3 fwd_env_ab.py --env FLASHATTN_SM90_MECHANISMS --values ,late_finish --hdims 128 \
  --seqlens 512,1024,2048,4096,16384 --csv "$OUT/ab_finish_d128.csv" 2>&1 | grep -v -i warn
timeout 80 python3 fwd_env_ab.py --env FLASHATTN_SM90_MECHANISMS --values ,late_finish_d64 --hdims 64 \
  --seqlens 512,1024,2048,16384 --csv "$OUT/ab_finish_d64.csv" 2>&1 | grep -v -i warn
