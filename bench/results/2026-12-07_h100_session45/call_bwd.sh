#!/usr/bin/env bash
# One call, about 8 minutes on an H100: three backward patches of session 44 and the band mask of session 45 against
# the checkout (bwd_patch_ab.sh: the bf16 sm90 backward suites on each patch, deterministic cases included; three
# interleaved rounds at 512-4k, where each applies):
#   docs/journal/patches/bwd_causal_tail_key_block_major.patch  (the causal grid's last pairs key block major;
#                                                               schedule_model.py --backward: -1 to -5 % makespan)
#   docs/journal/patches/bwd_preprocess_heads_fastest.patch     (D and the zeroed dQ workspace, heads fastest)
#   docs/journal/patches/bwd_dq_convert_heads_fastest.patch     (the dQ conversion's grid, heads fastest)
#   docs/journal/patches/bwd_band_mask.patch                    (diagonal steps of tiles inside both sequences
#                                                               masked by key - query offsets: about 2 instructions a
#                                                               probability in the d128 SASS instead of about 10)
# Everything goes into one archive (a call returns at most 8 files).
# usage: bash bench/results/2026-12-07_h200_session45/call_bwd.sh OUTDIR
set -uo pipefail
OUT=$1
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
R=/tmp/bwd4; rm -rf "$R"; mkdir -p "$R"
DEV_BWD_WORK=/tmp/dev-bwd4 DEV_HDIMS="64;128" DEV_AB_ROUNDS=3 DEV_AB_SAN=0 DEV_GTEST_S=120 \
  DEV_AB_HDIMS=64,128 DEV_AB_SEQLENS="512 1024 4096" \
  timeout 560 bash "$REPO/bench/gpu/dev/bwd_patch_ab.sh" "$R/ab" \
  docs/journal/patches/bwd_causal_tail_key_block_major.patch docs/journal/patches/bwd_band_mask.patch \
  docs/journal/patches/bwd_preprocess_heads_fastest.patch docs/journal/patches/bwd_dq_convert_heads_fastest.patch 2>&1 |
  tail -60
tar czf "$OUT/bwd4.tgz" -C /tmp bwd4
