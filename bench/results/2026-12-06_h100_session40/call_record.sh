#!/usr/bin/env bash
# Session 40, run 4: the bars-only record run (run.sh --training bf16) on the landed host-built divisors, then the
# sm90 forward suites' d256 cases on a ci + d256 build (run 3's suites covered d64/d128 only).
#   FLASHATTN_COMMIT=<hash> bash bench/results/2026-12-06_h100_session40/call_record.sh $OUT
set -uo pipefail
OUT=$1
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$REPO"
nvidia-smi --query-gpu=name --format=csv,noheader
bash bench/gpu/run.sh "$OUT/record" --skip ctest,ctest_cpu,check,pytest,sanitize --training bf16 --budget 300 2>&1 |
  grep -E "Geometric|done|Build:|\| (fwd|bwd) .* 256 "
DEV_BWD_WORK=/tmp/dev-256 DEV_HDIMS=256 DEV_BWD_BENCH=0 DEV_PYTHON=OFF DEV_BWD_SANITIZE=0 DEV_GTEST_S=120 \
  bash bench/gpu/dev/sm90_bwd_loop.sh "$OUT/d256" 'Sm90*/Forward.*d256*:Sm90TileCounter.*' | grep -E "build|gtest|PASSED|FAILED"
