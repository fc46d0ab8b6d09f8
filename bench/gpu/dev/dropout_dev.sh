#!/usr/bin/env bash
# Development loop for the dropout kernels on the GPU machine (not the record harness, run.sh): the small build of
# sm90_bwd_loop.sh (FLASHATTN_KERNELS=ci, sm90 head dims 64/128/256) with the Python package, the dropout cost
# table (dropout_cost.py), then the dropout cases of the GPU suites of both families (bf16: the ci build has no fp16
# kernels, and its sm80 family only d128, so the sm80 d256 cases are left out) until DEV_DEADLINE_S seconds after
# the start, then compute-sanitizer memcheck/racecheck on the dropout sanitizer cases when DEV_SANITIZE=1.
# DEV_PYTEST: a pytest -k expression run on CUDA against this build's package (e.g. "dropout or graph");
# DEV_FUZZ=1: the GPU fuzz binary's cases (FA_GPU_FUZZ_CASES of them) for both families, before the sanitizers.
# usage: bench/gpu/dev/dropout_dev.sh OUTDIR
set -uo pipefail
OUT=$1
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
T0=$(date +%s)
export DEV_BWD_WORK=${DEV_BWD_WORK:-/tmp/dev-drop} DEV_HDIMS=${DEV_HDIMS:-"64;128;256"}
DEV_BWD_BENCH=0 bash "$REPO/bench/gpu/dev/sm90_bwd_loop.sh" "$OUT" none
PYTHONPATH=$DEV_BWD_WORK/pyroot timeout 200 python3 "$REPO/bench/gpu/dev/dropout_cost.py" --csv "$OUT/dropout_cost.csv" \
  ${DEV_COST_ARGS:-} >"$OUT/dropout_cost.log" 2>&1
echo "cost rc $?"; grep -v "^#" "$OUT/dropout_cost.log" | cut -f1-6,9,10 | head -40
BIN=$(find "$DEV_BWD_WORK/build" -name 'flashattn_gpu_tests' -type f | head -1)
FILTER=${DEV_FILTER:-'Sm90Dropout/*:Sm80Dropout/*:ForwardDropout.*:-*fp16*:*sm80_*d256*'}
left=$(( T0 + ${DEV_DEADLINE_S:-560} - $(date +%s) ))
FLASHATTN_REQUIRE_SM90=1 timeout $(( left > 30 ? left : 30 )) "$BIN" --gtest_filter="$FILTER" >"$OUT/gtest.log" 2>&1
echo "gtest rc $?"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran" "$OUT/gtest.log" | head -40
if [[ -n ${DEV_PYTEST:-} ]]; then
  (cd "$REPO" && PYTHONPATH=$DEV_BWD_WORK/pyroot timeout 240 python3 -m pytest tests/python -q -rs -k "$DEV_PYTEST" \
    >"$OUT/pytest.log" 2>&1)
  echo "pytest rc $?"; tail -4 "$OUT/pytest.log"
fi
if [[ ${DEV_FUZZ:-0} == 1 ]]; then
  FUZZ=$(find "$DEV_BWD_WORK/build" -name 'flashattn_gpu_fuzz' -type f | head -1)
  timeout 150 "$FUZZ" --gtest_filter='GpuFuzz.*' >"$OUT/fuzz.log" 2>&1
  echo "fuzz rc $?"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]|failed|tests ran" "$OUT/fuzz.log" | head -12
fi
[[ ${DEV_SANITIZE:-0} == 1 ]] || exit 0
for tool in memcheck racecheck; do
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 "$BIN" --gtest_filter="${DEV_SAN_FILTER:-Sanitizer*dropout*}" \
    >"$OUT/san_$tool.log" 2>&1
  echo "sanitizer $tool rc $?"; grep -E "ERROR SUMMARY|Hazard|Invalid|PASSED|FAILED" "$OUT/san_$tool.log" | head -5
done
