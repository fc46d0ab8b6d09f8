#!/usr/bin/env bash
# One device call for docs/journal/patches/bwd_dq_first_store_split.patch (#14): the d256 backward's dQ tiles (the
# split mainloop, bwd_mainloop_split.cuh) stored on their first add too, so the preprocess zeroes no accumulator at
# any head dim. Built as an ablation build in a copy of the checkout (with_patch.sh; only the run-time switch
# FLASHATTN_SM90_DQ_ZEROED=1, which restores the zeroed accumulator): the sm90 d256 backward suites (every mask,
# deterministic mode, varlen, both dtypes) and memcheck + racecheck on its sanitizer cases (OUTDIR/loop), then
# fwd_env_ab.py --bwd with the patch ("") and the switch ("1") in one process, both orders, beside cuDNN: bf16 16k
# tokens, d256, 512/1k/4k, causal and not (OUTDIR/dq_zeroed_ab_d256.csv).
# usage: bash bench/results/2026-12-07_session55/call_dq_first_store_split.sh OUTDIR   (carry .whl; about 4-5
# minutes on an H100)
set -uo pipefail
OUT=$1
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
W=/tmp/dev-dqfs256
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
DEV_BWD_WORK=$W DEV_CMAKE_ARGS="-DFLASHATTN_SM90_ABLATIONS=ON -DFLASHATTN_SM90_ABLATION_VARIANTS=none" \
  DEV_HDIMS="256" DEV_BWD_BENCH=0 DEV_GTEST_S=150 DEV_SAN_S=80 DEV_SAN_FILTER='Sanitizer*sm90*_d2*' \
  bash "$REPO/bench/gpu/dev/with_patch.sh" docs/journal/patches/bwd_dq_first_store_split.patch \
  bench/gpu/dev/sm90_bwd_loop.sh "$OUT/loop" 'Sm90*/Backward.*' 2>&1 | tail -30
PYTHONPATH=$W/pyroot timeout 150 python3 "$REPO/bench/gpu/dev/fwd_env_ab.py" --bwd --env FLASHATTN_SM90_DQ_ZEROED \
  --values ,1 --hdims 256 --seqlens 512,1024,4096 --csv "$OUT/dq_zeroed_ab_d256.csv" 2>&1 | tail -10
