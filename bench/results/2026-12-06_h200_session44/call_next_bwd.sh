#!/usr/bin/env bash
# Written in session 44 for the next device session, not run. One call, about 8 minutes on an H100: three backward
# patches and a diagnostic against the checkout (bwd_patch_ab.sh: the bf16 sm90 backward suites on each patch,
# deterministic cases included; three interleaved rounds at 512-4k, where each applies):
#   docs/journal/patches/bwd_causal_tail_key_block_major.patch  (the causal grid's last pairs key block major;
#                                                               schedule_model.py --backward: -1 to -5 % makespan)
#   docs/journal/patches/bwd_preprocess_heads_fastest.patch     (D and the zeroed dQ workspace, heads fastest)
#   docs/journal/patches/bwd_dq_convert_heads_fastest.patch     (the dQ conversion's grid, heads fastest)
#   docs/journal/patches/diag_bwd_no_diagonal_mask.patch        (wrong gradients by design, timed only: the causal
#                                                               diagonal unmasked, d <= 128; what the mask costs of
#                                                               the causal CTA's 2-5 us extra fixed cost)
# Everything goes into one archive (a call returns at most 8 files).
# usage: bash bench/results/2026-12-06_h200_session44/call_next_bwd.sh OUTDIR
set -uo pipefail
OUT=$1
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
R=/tmp/bwd3; rm -rf "$R"; mkdir -p "$R"
DEV_BWD_WORK=/tmp/dev-bwd3 DEV_HDIMS="64;128" DEV_AB_ROUNDS=3 DEV_AB_SAN=0 DEV_GTEST_S=120 \
  DEV_AB_HDIMS=64,128 DEV_AB_SEQLENS="512 1024 4096" \
  timeout 560 bash "$REPO/bench/gpu/dev/bwd_patch_ab.sh" "$R/ab" \
  docs/journal/patches/bwd_causal_tail_key_block_major.patch docs/journal/patches/bwd_preprocess_heads_fastest.patch \
  docs/journal/patches/bwd_dq_convert_heads_fastest.patch docs/journal/patches/diag_bwd_no_diagonal_mask.patch 2>&1 |
  tail -60
tar czf "$OUT/bwd3.tgz" -C /tmp bwd3
