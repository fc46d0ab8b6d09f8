#!/bin/bash
# One device call: GPU tests, compute-sanitizer (memcheck + racecheck) on the fast subset, forward timing.
# Usage (from the staged source root): bench/gpu/dev/device_run.sh BUILD_DIR OUT_DIR
B=$1
O=$2
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH PYTHONUNBUFFERED=1
nvidia-smi -L
"$B/flashattn_gpu_tests" --gtest_brief=1 > "$O/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"
grep -E "^\[  (PASSED|FAILED|SKIPPED)|tests ran|FAILED  \]" "$O/gpu_tests.log" | tail -25
grep -B2 -A6 "Failure" "$O/gpu_tests.log" | head -60
SUB='Sanitizer/*:Sm80Validation.*'
compute-sanitizer --tool memcheck --error-exitcode 9 "$B/flashattn_gpu_tests" --gtest_brief=1 --gtest_filter="$SUB" > "$O/memcheck.log" 2>&1
echo "memcheck rc=$?"; tail -4 "$O/memcheck.log"
compute-sanitizer --tool racecheck --error-exitcode 9 "$B/flashattn_gpu_tests" --gtest_brief=1 --gtest_filter='Sanitizer/*' > "$O/racecheck.log" 2>&1
echo "racecheck rc=$?"; tail -4 "$O/racecheck.log"
python3 bench/gpu/dev/bench_fwd.py "$B/libflashattn_capi.so" ${BENCH_SEQLENS:-1024 2048 8192} > "$O/bench.tsv" 2>&1
echo "bench rc=$?"
cat "$O/bench.tsv"
