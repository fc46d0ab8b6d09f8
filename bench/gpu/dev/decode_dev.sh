#!/usr/bin/env bash
# Split-KV counts for decode on the GPU machine: the small build of sm90_bwd_loop.sh (ci kernels, sm90 d128 only,
# the Python package; no tests), then decode_splits.py (DEV_SPLITS: the counts to sweep).
# usage: bench/gpu/dev/decode_dev.sh OUTDIR
set -uo pipefail
OUT=$1
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
export DEV_BWD_WORK=${DEV_BWD_WORK:-/tmp/dev-decode} DEV_HDIMS=${DEV_HDIMS:-128}
DEV_BWD_SANITIZE=0 DEV_BWD_BENCH=0 DEV_GTEST_S=5 bash "$REPO/bench/gpu/dev/sm90_bwd_loop.sh" "$OUT" 'NoTest.None' |
  grep -v "^gtest rc"
PYTHONPATH=$DEV_BWD_WORK/pyroot timeout 240 python3 "$REPO/bench/gpu/dev/decode_splits.py" --csv "$OUT/decode_splits.csv" \
  ${DEV_SPLITS:+--splits "$DEV_SPLITS"} 2>&1 | tee "$OUT/decode_splits.log" | tail -120
