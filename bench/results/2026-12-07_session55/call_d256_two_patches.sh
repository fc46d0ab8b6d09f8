#!/usr/bin/env bash
# One device call, two alternative patches for the d256 backward's dQ accumulator (#14; the split mainloop,
# bwd_mainloop_split.cuh), so that the preprocess zeroes none at any head dim:
#   A docs/journal/patches/bwd_dq_first_store_split.patch: a tile's first add stores (as the staged kernels since
#     4a9a0a1); the other CTAs wait for the claimer's stores.
#   B docs/journal/patches/bwd_dq_zero_ahead_split.patch: each tile zeroed a step ahead by the CTA that claims it;
#     every add a reduce-add.
# Both are built at once (ablation builds with sm90 d256 only: with_patch.sh + sm90_bwd_loop.sh, build only), then
# for each: the sm90 backward suites (OUTDIR/X_gtest.log), fwd_env_ab.py --bwd with the patch ("") and the zeroed
# accumulator (FLASHATTN_SM90_DQ_ZEROED=1) in one process beside cuDNN, bf16 16k tokens, d256, 512/1k/4k, causal and
# not (OUTDIR/X_ab.csv), and memcheck + racecheck on the d200/d256 sanitizer cases.
# usage: [ONLY="B"] bash bench/results/2026-12-07_session55/call_d256_two_patches.sh OUTDIR   (carry .whl; about 7-8
# minutes for both; ONLY: the patches to run, default "A B")
set -uo pipefail
OUT=$1
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
declare -A P=([A]=bwd_dq_first_store_split [B]=bwd_dq_zero_ahead_split)
for x in ${ONLY:-A B}; do
  DEV_BWD_WORK=/tmp/d256$x WITH_PATCH_DIR=/tmp/patched$x DEV_HDIMS=256 DEV_BWD_BENCH=0 \
    DEV_CMAKE_ARGS="-DFLASHATTN_SM90_ABLATIONS=ON -DFLASHATTN_SM90_ABLATION_VARIANTS=none" \
    bash "$REPO/bench/gpu/dev/with_patch.sh" "docs/journal/patches/${P[$x]}.patch" bench/gpu/dev/sm90_bwd_loop.sh \
    "$OUT/$x" none >"$OUT/${x}_build.txt" 2>&1 &
done
wait
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for x in ${ONLY:-A B}; do
  echo "== $x ${P[$x]}"; tail -3 "$OUT/${x}_build.txt"
  BIN=$(find /tmp/d256$x/build -name flashattn_gpu_tests -type f | head -1)
  [[ -n $BIN ]] || { echo "no test binary"; continue; }
  FLASHATTN_REQUIRE_SM90=1 timeout 80 "$BIN" --gtest_filter='Sm90*/Backward.*' >"$OUT/${x}_gtest.log" 2>&1
  echo "gtest rc $?"; grep -E "^\[  (PASSED|FAILED)  \]" "$OUT/${x}_gtest.log" | head -8
  PYTHONPATH=/tmp/d256$x/pyroot timeout 100 python3 "$REPO/bench/gpu/dev/fwd_env_ab.py" --bwd \
    --env FLASHATTN_SM90_DQ_ZEROED --values ,1 --hdims 256 --seqlens 512,1024,4096 --csv "$OUT/${x}_ab.csv" 2>&1 | tail -8
done
for x in ${ONLY:-A B}; do
  BIN=$(find /tmp/d256$x/build -name flashattn_gpu_tests -type f | head -1)
  for tool in memcheck racecheck; do
    timeout 45 compute-sanitizer --tool $tool --error-exitcode 9 "$BIN" --gtest_filter='Sanitizer*sm90*_d2*' \
      >"$OUT/${x}_san_$tool.log" 2>&1
    echo "$x $tool rc $?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED  \]" "$OUT/${x}_san_$tool.log" | head -3
  done
done
