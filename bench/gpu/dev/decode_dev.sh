#!/usr/bin/env bash
# The decode path's loop on the GPU machine, in one call: the small build of sm90_bwd_loop.sh (ci kernels, sm90
# DEV_HDIMS (default d128), the Python package), the decode GPU cases (packed GQA, split-KV and its combine, sinks,
# paged, the tile-shape tests), compute-sanitizer memcheck and racecheck on the packed, split and paged decode cases,
# then decode_splits.py --profile (the plan's split count and DEV_SPLITS, beside cuDNN; kernel times per call) and
# paged_decode.py (DEV_PAGES, default 256,16,1: each paged output bit for bit against the contiguous one).
# DEV_DECODE_ENV="NAME=a,b": decode_splits.py also times each value of that ablation switch (--env/--values);
# DEV_SAN_FILTER: the sanitizers' gtest filter instead of the decode cases'.
# usage: bench/gpu/dev/decode_dev.sh OUTDIR
set -uo pipefail
OUT=$1
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
export DEV_BWD_WORK=${DEV_BWD_WORK:-/tmp/dev-decode} DEV_HDIMS=${DEV_HDIMS:-128}
cases='Sm90/Forward.*packed*:Sm90/Forward.*split*:Sm90/Forward.*fused_merge*:Sm90/Forward.*sinks*:GpuMerge.*:Paged*:*TileShape*'
cases+=':Sm90TileCounter.*:Sm90MergeCounters.*'
DEV_BWD_SANITIZE=0 DEV_BWD_BENCH=0 DEV_GTEST_S=${DEV_GTEST_S:-150} bash "$REPO/bench/gpu/dev/sm90_bwd_loop.sh" "$OUT" \
  "$cases:-*fp16*"
BIN=$(find "$DEV_BWD_WORK/build" -name 'flashattn_gpu_tests' -type f | head -1)
for tool in memcheck racecheck; do
  timeout "${DEV_SAN_S:-90}" compute-sanitizer --tool $tool --error-exitcode 9 "$BIN" \
    --gtest_filter="${DEV_SAN_FILTER:-Sm90/Forward.*packed_decode*:Sm90/Forward.*split_decode*:Sm90/Forward.*fused_merge*:PagedSanitizer*:-*fp16*}" \
    >"$OUT/san_$tool.log" 2>&1
  echo "sanitizer $tool rc $?"; grep -E "ERROR SUMMARY|Hazard|Invalid|PASSED|FAILED" "$OUT/san_$tool.log" | head -5
done
# DEV_DECODE_ENV="NAME=a,b": each count also under each value of an ablation build's switch (decode_splits.py --env).
env_args=()
[[ -n ${DEV_DECODE_ENV:-} ]] && env_args=(--env "${DEV_DECODE_ENV%%=*}" --values "${DEV_DECODE_ENV#*=}")
PYTHONPATH=$DEV_BWD_WORK/pyroot timeout 150 python3 "$REPO/bench/gpu/dev/decode_splits.py" --profile \
  --splits "0${DEV_SPLITS:+,$DEV_SPLITS}" "${env_args[@]}" --csv "$OUT/decode_splits.csv" >"$OUT/decode_splits.log" 2>&1
echo "decode_splits rc $?"; grep -v -i warn "$OUT/decode_splits.log" | tail -60
PYTHONPATH=$DEV_BWD_WORK/pyroot timeout 150 python3 "$REPO/bench/gpu/dev/paged_decode.py" --csv "$OUT/paged_decode.csv" \
  --pages "${DEV_PAGES:-256,16,1}" >"$OUT/paged_decode.log" 2>&1
echo "paged_decode rc $?"; tail -30 "$OUT/paged_decode.log"
