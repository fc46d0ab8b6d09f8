#!/bin/bash
# One device call for the backward: the whole GPU test binary (forward + backward; 4 gtest shards side by side,
# the float64 reference is the slow part), compute-sanitizer memcheck + racecheck on the backward sanitizer
# subset, backward timing next to torch SDPA flash (FA2) and cuDNN.
# Usage (from the staged source root): src/cuda/bench/device_run_bwd.sh BUILD_DIR OUT_DIR
B=$1
O=$2
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH PYTHONUNBUFFERED=1
nvidia-smi -L
SHARDS=4
for i in $(seq 0 $((SHARDS - 1))); do
  GTEST_TOTAL_SHARDS=$SHARDS GTEST_SHARD_INDEX=$i OMP_NUM_THREADS=4 "$B/flashattn_gpu_tests" --gtest_brief=1 \
    > "$O/gpu_tests_$i.log" 2>&1 &
done
wait
cat "$O"/gpu_tests_*.log > "$O/gpu_tests.log"; rm "$O"/gpu_tests_*.log
echo "gpu tests: $(grep -c '^\[       OK \]' "$O/gpu_tests.log") ok lines, summary:"
grep -E "^\[  (PASSED|FAILED|SKIPPED)|tests ran|FAILED  \]" "$O/gpu_tests.log" | head -40
grep -A4 "Failure" "$O/gpu_tests.log" | head -60
SUB='Sanitizer/Backward.*'
compute-sanitizer --tool memcheck --error-exitcode 9 "$B/flashattn_gpu_tests" --gtest_brief=1 --gtest_filter="$SUB" > "$O/memcheck.log" 2>&1
echo "memcheck rc=$?"; tail -3 "$O/memcheck.log"
compute-sanitizer --tool racecheck --error-exitcode 9 "$B/flashattn_gpu_tests" --gtest_brief=1 --gtest_filter="$SUB" > "$O/racecheck.log" 2>&1
echo "racecheck rc=$?"; tail -3 "$O/racecheck.log"
python3 src/cuda/bench/bench_bwd.py "$B/libflashattn_capi.so" 2048 8192 > "$O/bench_bwd.tsv" 2>&1
echo "bench rc=$?"
cat "$O/bench_bwd.tsv"
