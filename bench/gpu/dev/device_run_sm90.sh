#!/bin/bash
# One device call for the sm90 forward: the forward GPU tests of both CUDA backends (4 gtest shards side by side),
# compute-sanitizer memcheck + racecheck on the forward sanitizer subset, forward timing of cuda-sm90 and
# cuda-sm80 next to torch SDPA flash (FA2) and cuDNN. Every phase has its own time limit.
# Usage (from the source root): bench/gpu/dev/device_run_sm90.sh OUT_DIR BUILD_DIR [seqlen ...]
O=$1; B=$2; shift 2
T=$(find "$B" -name flashattn_gpu_tests -type f | head -1); L=$(find "$B" -name libflashattn_capi.so | head -1)
SEQLENS=${*:-2048 8192 16384}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH PYTHONUNBUFFERED=1
nvidia-smi -L
# Registers / spills / shared memory of the sm90 kernels (ptxas figures kept in the binary).
cuobjdump -res-usage "$L" 2>/dev/null | grep -A1 "sm90.*fwd_kernel" | grep -oE "REG:[0-9]+|STACK:[0-9]+|SHARED:[0-9]+|LOCAL:[0-9]+" | paste -sd' ' | fold -w 200 | head -20
SHARDS=4
FILTER=${FILTER:-'*Forward*:*Validation*'}
for i in $(seq 0 $((SHARDS - 1))); do
  GTEST_TOTAL_SHARDS=$SHARDS GTEST_SHARD_INDEX=$i OMP_NUM_THREADS=4 timeout 90 "$T" \
    --gtest_brief=1 --gtest_filter="$FILTER" > "$O/tests_$i.log" 2>&1 &
done
wait
cat "$O"/tests_*.log > "$O/tests.log"; rm "$O"/tests_?.log
echo "== tests ($FILTER): $(grep -c '^\[       OK \]' "$O/tests.log") ok lines"
grep -E "^\[  PASSED|^\[  FAILED  \] [0-9]|^\[  SKIPPED \] [0-9]" "$O/tests.log"
grep -E "^\[  FAILED  \] .*\." "$O/tests.log" | sort -u | head -40
grep -B2 -A6 "Failure" "$O/tests.log" | head -60
for tool in memcheck racecheck; do
  timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 "$T" --gtest_brief=1 \
    --gtest_filter='Sanitizer/Forward.*sm90*' > "$O/${tool}.log" 2>&1
  echo "== $tool rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Error|hazard" "$O/${tool}.log" | head -8
done
[ "${BENCH:-1}" = 0 ] && exit 0
timeout 150 python3 bench/gpu/dev/bench_fwd.py "$L" $SEQLENS --backends sm90,sm80 > "$O/bench_fwd.tsv" 2>&1
echo "== bench rc=$?"
cat "$O/bench_fwd.tsv"
