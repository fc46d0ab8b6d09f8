#!/usr/bin/env bash
# Paged K/V on the GPU machine: the small build of sm90_bwd_loop.sh (ci kernels plus sm90 d64/d128/d256 and the
# Python package), the paged GPU cases (Paged*), compute-sanitizer memcheck/racecheck on PagedSanitizer, then
# paged_decode.py (decode by page size beside cuDNN).
# usage: bench/gpu/dev/paged_dev.sh OUTDIR   (DEV_PAGES: the page sizes, e.g. 256,16,17,1)
set -uo pipefail
OUT=$1
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
export DEV_BWD_WORK=${DEV_BWD_WORK:-/tmp/dev-paged} DEV_HDIMS=${DEV_HDIMS:-64;128;256}
DEV_SAN_FILTER=${DEV_SAN_FILTER:-'PagedSanitizer*'} DEV_BWD_BENCH=0 DEV_GTEST_S=${DEV_GTEST_S:-150} \
  bash "$REPO/bench/gpu/dev/sm90_bwd_loop.sh" "$OUT" "${DEV_FILTER:-Paged*:*fp8_paged*}"
PYTHONPATH=$DEV_BWD_WORK/pyroot timeout 200 python3 "$REPO/bench/gpu/dev/paged_decode.py" --csv "$OUT/paged_decode.csv" \
  ${DEV_PAGES:+--pages "$DEV_PAGES"} 2>&1 | tee "$OUT/paged_decode.log" | tail -60
