#!/bin/bash
# One device call for the backward: GPU test binaries (4 gtest shards side by side: the float64 reference is the
# slow part), compute-sanitizer memcheck + racecheck on the backward sanitizer subset, backward timing next to
# torch SDPA flash (FA2) and cuDNN. Every phase has its own time limit so that a hang leaves the rest running.
# Usage (from the staged source root): bench/gpu/dev/device_run_bwd.sh OUT_DIR BUILD_DIR[:TAG] [BUILD_DIR2:TAG2]
# The first build runs the whole suite (forward + backward); further builds (backward variants) run the backward.
# BENCH_ARGS (default "2048 8192") and BENCH_TIMEOUT (seconds, default 60) pass through to bench_bwd.py, e.g.
# BENCH_ARGS="1024 2048 8192 16384 --hdims 64,128,256" BENCH_TIMEOUT=150. EXTRA_LIBS="LIB:TAG ..." adds libraries
# that are only timed (e.g. a host-side variant of a tested build: same kernels).
O=$1
shift
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH PYTHONUNBUFFERED=1
nvidia-smi -L
SHARDS=4
FILTER='*'
LIBS=""
for spec in "$@"; do
  B=${spec%%:*}; TAG=${spec#*:}; [ "$TAG" = "$spec" ] && TAG=ours
  for i in $(seq 0 $((SHARDS - 1))); do
    GTEST_TOTAL_SHARDS=$SHARDS GTEST_SHARD_INDEX=$i OMP_NUM_THREADS=4 timeout 45 "$B/flashattn_gpu_tests" \
      --gtest_brief=1 --gtest_filter="$FILTER" > "$O/tests_${TAG}_$i.log" 2>&1 &
  done
  wait
  cat "$O"/tests_${TAG}_*.log > "$O/tests_$TAG.log"; rm "$O"/tests_${TAG}_*.log
  echo "== $TAG tests ($FILTER): $(grep -c '^\[       OK \]' "$O/tests_$TAG.log") ok lines"
  grep -E "tests ran|^\[  PASSED|^\[  FAILED  \] [0-9]|^\[  SKIPPED \] [0-9]" "$O/tests_$TAG.log"
  grep -E "^\[  FAILED  \] .*\." "$O/tests_$TAG.log" | sort -u | head -30
  grep -A3 "Failure" "$O/tests_$TAG.log" | head -30
  LIBS="$LIBS $B/libflashattn_capi.so:$TAG"
  FILTER='*Backward*'
done
SUB='Sanitizer/Backward.*'
for spec in "$@"; do
  B=${spec%%:*}; TAG=${spec#*:}; [ "$TAG" = "$spec" ] && TAG=ours
  for tool in memcheck racecheck; do
    timeout 30 compute-sanitizer --tool $tool --error-exitcode 9 "$B/flashattn_gpu_tests" --gtest_brief=1 \
      --gtest_filter="$SUB" > "$O/${tool}_$TAG.log" 2>&1
    echo "== $TAG $tool rc=$?"; tail -2 "$O/${tool}_$TAG.log"
  done
done
timeout ${BENCH_TIMEOUT:-60} python3 bench/gpu/dev/bench_bwd.py $LIBS $EXTRA_LIBS ${BENCH_ARGS:-2048 8192} > "$O/bench_bwd.tsv" 2>&1
echo "== bench rc=$?"
cat "$O/bench_bwd.tsv"
