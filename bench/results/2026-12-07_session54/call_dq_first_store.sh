#!/usr/bin/env bash
# One device call for docs/journal/patches/bwd_dq_first_store.patch (#14): a dQ tile's first add stores, so the
# preprocess no longer zeroes the fp32 accumulator. The patch is built as an ablation build in a copy of the checkout
# (with_patch.sh; no ablation kernels, only the run-time switch FLASHATTN_SM90_DQ_ZEROED=1 that restores the zeroed
# accumulator): the sm90 backward suites (every mask, deterministic mode, varlen) and memcheck + racecheck on its
# sanitizer cases (sm90_bwd_loop.sh: OUTDIR/loop), then fwd_env_ab.py --bwd, the backward with the patch ("") and with
# the switch ("1") in one process, both orders, beside cuDNN: bf16 16k tokens, d64/d128, 512/1k/4k, causal and not
# (OUTDIR/dq_zeroed_ab.csv).
# usage: bash bench/results/2026-12-07_session54/call_dq_first_store.sh OUTDIR   (carry .whl; about 6 minutes on an
# H100 with a 150-190 s build). DEV_HDIMS: the sm90 head dims built (default "64;128": d256 keeps the zeroed
# accumulator, but its preprocess changed too, so a landing run adds 256).
set -uo pipefail
OUT=$1
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
W=/tmp/dev-dqfs
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
DEV_BWD_WORK=$W DEV_CMAKE_ARGS="-DFLASHATTN_SM90_ABLATIONS=ON -DFLASHATTN_SM90_ABLATION_VARIANTS=none" \
  DEV_HDIMS="${DEV_HDIMS:-64;128}" DEV_BWD_BENCH=0 DEV_GTEST_S=150 DEV_SAN_S=80 \
  bash "$REPO/bench/gpu/dev/with_patch.sh" docs/journal/patches/bwd_dq_first_store.patch \
  bench/gpu/dev/sm90_bwd_loop.sh "$OUT/loop" 'Sm90*/Backward.*:-*fp16*' 2>&1 | tail -40
PYTHONPATH=$W/pyroot timeout 150 python3 "$REPO/bench/gpu/dev/fwd_env_ab.py" --bwd --env FLASHATTN_SM90_DQ_ZEROED \
  --values ,1 --hdims 64,128 --seqlens 512,1024,4096 --csv "$OUT/dq_zeroed_ab.csv" 2>&1 | tail -15
