#!/usr/bin/env bash
# One device call (after call_fwd_claim.sh on the same warm machine: its base build is reused): the backward's two
# memory-bound kernels with heads as the fastest index, against the checkout, three interleaved rounds:
#   docs/journal/patches/bwd_preprocess_heads_fastest.patch  (D = rowsum(dO * O) and the zeroed dQ workspace)
#   docs/journal/patches/bwd_dq_convert_heads_fastest.patch  (the dQ conversion's grid)
# The bf16 sm90 backward suites on each. Everything goes into one archive (a call returns at most 8 files).
# usage: bash bench/results/2026-12-06_h200_session44/call_bwd_aux.sh OUTDIR
set -uo pipefail
OUT=$1
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
R=/tmp/aux; rm -rf "$R"; mkdir -p "$R"
DEV_BWD_WORK=/tmp/dev-ab44 DEV_HDIMS="64;128;256" DEV_AB_ROUNDS=3 DEV_AB_SAN=0 DEV_GTEST_S=100 \
  DEV_AB_HDIMS=64,128 DEV_AB_SEQLENS="512 1024 2048" \
  timeout 400 bash "$REPO/bench/gpu/dev/bwd_patch_ab.sh" "$R/ab" docs/journal/patches/bwd_preprocess_heads_fastest.patch \
  docs/journal/patches/bwd_dq_convert_heads_fastest.patch 2>&1 | tail -40
tar czf "$OUT/aux.tgz" -C /tmp aux
