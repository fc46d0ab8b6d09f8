#!/usr/bin/env bash
# Development loop for the dropout kernels on the GPU machine (not the record harness, run.sh): the small build of
# sm90_bwd_loop.sh (FLASHATTN_KERNELS=ci, sm90 head dims 64/128/256) with the Python package, the dropout cost
# table (dropout_cost.py), then the dropout cases of the GPU suites of both families (bf16: the ci build has no fp16
# kernels, and its sm80 family only d128, so the sm80 d256 cases are left out) until DEV_DEADLINE_S seconds after
# the start, then compute-sanitizer memcheck/racecheck on the dropout sanitizer cases when DEV_SANITIZE=1.
# usage: bench/gpu/dev/dropout_dev.sh OUTDIR
set -uo pipefail
OUT=$1
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
T0=$(date +%s)
export DEV_BWD_WORK=${DEV_BWD_WORK:-/tmp/dev-drop} DEV_HDIMS=${DEV_HDIMS:-"64;128;256"}
DEV_BWD_SANITIZE=0 DEV_BWD_BENCH=0 DEV_GTEST_S=1 bash "$REPO/bench/gpu/dev/sm90_bwd_loop.sh" "$OUT" 'NoTest.None' |
  grep -v "^gtest rc"
PYTHONPATH=$DEV_BWD_WORK/pyroot timeout 200 python3 "$REPO/bench/gpu/dev/dropout_cost.py" --csv "$OUT/dropout_cost.csv" \
  ${DEV_COST_ARGS:-} >"$OUT/dropout_cost.log" 2>&1
echo "cost rc $?"; grep -v "^#" "$OUT/dropout_cost.log" | cut -f1-6,9,10 | head -40
BIN=$(find "$DEV_BWD_WORK/build" -name 'flashattn_gpu_tests' -type f | head -1)
FILTER=${DEV_FILTER:-'Sm90Dropout/*:Sm80Dropout/*:ForwardDropout.*:-*fp16*:*sm80_*d256*'}
left=$(( T0 + ${DEV_DEADLINE_S:-560} - $(date +%s) ))
FLASHATTN_REQUIRE_SM90=1 timeout $(( left > 30 ? left : 30 )) "$BIN" --gtest_filter="$FILTER" >"$OUT/gtest.log" 2>&1
echo "gtest rc $?"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran" "$OUT/gtest.log" | head -40
[[ ${DEV_SANITIZE:-0} == 1 ]] || exit 0
for tool in memcheck racecheck; do
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 "$BIN" --gtest_filter="${DEV_SAN_FILTER:-Sanitizer*dropout*}" \
    >"$OUT/san_$tool.log" 2>&1
  echo "sanitizer $tool rc $?"; grep -E "ERROR SUMMARY|Hazard|Invalid|PASSED|FAILED" "$OUT/san_$tool.log" | head -5
done
