#!/usr/bin/env bash
# One H200 call: session 53's record with the FP8 rows (call_record_fp8.sh, its budget cut to 470 s), then the sm90
# fp16 backward cases with the record's test binary (the dQ first-store landing check's development build had no fp16
# sm90 kernels: bench/results/2026-12-07_h100_session55/README.md) into OUTDIR/fp16_bwd_gtest.log.
# usage: FLASHATTN_COMMIT=<hash> bash bench/results/2026-12-07_session55/call_record_fp16check.sh OUTDIR  (carry .whl,
# needs_h200)
set -uo pipefail
OUT=$1
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
REC_BUDGET=${REC_BUDGET:-470} bash "$REPO/bench/results/2026-12-07_h100_session53/call_record_fp8.sh" "$OUT"
T=$(ls -t /tmp/flashattn-harness.*/build/tests/gpu/flashattn_gpu_tests 2>/dev/null | head -1)
if [[ -n $T ]]; then
  LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" timeout 40 "$T" \
    --gtest_filter='Sm90*/Backward.*fp16*' >"$OUT/fp16_bwd_gtest.log" 2>&1
  echo "fp16 sm90 backward gtest rc $?"; grep -E "^\[  (PASSED|FAILED)  \]|tests ran" "$OUT/fp16_bwd_gtest.log" | head -5
else
  echo "no test binary under /tmp/flashattn-harness.*/build"
fi
