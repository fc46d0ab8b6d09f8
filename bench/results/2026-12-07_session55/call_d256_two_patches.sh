#!/usr/bin/env bash
# One device call, two alternative patches for the d256 backward's dQ accumulator (#14; the split mainloop,
# bwd_mainloop_split.cuh), so that the preprocess zeroes none at any head dim:
#   A docs/journal/patches/bwd_dq_first_store_split.patch: a tile's first add stores (as the staged kernels since
#     4a9a0a1); the other CTAs wait for the claimer's stores.
#   B docs/journal/patches/bwd_dq_zero_ahead_split.patch: each tile zeroed a step ahead by the CTA that claims it;
#     every add a reduce-add.
# Both are built at once (ablation builds with sm90 d256 only: with_patch.sh + sm90_bwd_loop.sh, build only), then
# for each: the sm90 backward suites and memcheck + racecheck on the d200/d256 sanitizer cases (OUTDIR/X/), then
# fwd_env_ab.py --bwd with the patch ("") and the zeroed accumulator (FLASHATTN_SM90_DQ_ZEROED=1) in one process
# beside cuDNN, bf16 16k tokens, d256, 512/1k/4k, causal and not (OUTDIR/X_ab.csv).
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
# The suites and sanitizers through each copy's own sm90_bwd_loop.sh (its build is then up to date: ninja only checks).
for x in ${ONLY:-A B}; do
  echo "== $x ${P[$x]}"; tail -3 "$OUT/${x}_build.txt"
  DEV_BWD_WORK=/tmp/d256$x DEV_HDIMS=256 DEV_BWD_BENCH=0 DEV_GTEST_S=80 DEV_SAN_S=45 DEV_SAN_FILTER='Sanitizer*sm90*_d2*' \
    DEV_CMAKE_ARGS="-DFLASHATTN_SM90_ABLATIONS=ON -DFLASHATTN_SM90_ABLATION_VARIANTS=none" \
    bash "/tmp/patched$x/${P[$x]}/bench/gpu/dev/sm90_bwd_loop.sh" "$OUT/$x" 'Sm90*/Backward.*' 2>&1 | grep -v "^ *[0-9.]* s " | tail -12
  PYTHONPATH=/tmp/d256$x/pyroot timeout 100 python3 "$REPO/bench/gpu/dev/fwd_env_ab.py" --bwd \
    --env FLASHATTN_SM90_DQ_ZEROED --values ,1 --hdims 256 --seqlens 512,1024,4096 --csv "$OUT/${x}_ab.csv" 2>&1 | tail -8
done
