#!/usr/bin/env bash
# Written in session 45 for the next device session, not run. Two backward patches against the checkout (a call fits
# two: each rebuilds the whole ci kernel set, about 105 s on the device's 16 cores; this folder's README, run 2):
#   docs/journal/patches/bwd_preprocess_heads_fastest.patch     (D and the zeroed dQ workspace, heads fastest)
#   docs/journal/patches/bwd_dq_convert_heads_fastest.patch     (the dQ conversion's grid, heads fastest)
# The bf16 sm90 backward suites at d64 and d128 on each, then
# three interleaved rounds at 512-4k, d64 and d128. About 8 minutes on an H100. One archive (a call returns at most 8
# files).
# usage: bash bench/results/2026-12-07_h100_session45/call_next_bwd_b.sh OUTDIR
set -uo pipefail
OUT=$1
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
R=/tmp/bwd6; rm -rf "$R"; mkdir -p "$R"
DEV_BWD_WORK=/tmp/dev-bwd6 DEV_HDIMS="64;128" DEV_AB_ROUNDS=3 DEV_AB_SAN=0 DEV_GTEST_S=120 \
  DEV_AB_HDIMS=64,128 DEV_AB_SEQLENS="512 1024 4096" \
  timeout 570 bash "$REPO/bench/gpu/dev/bwd_patch_ab.sh" "$R/ab" \
  docs/journal/patches/bwd_preprocess_heads_fastest.patch docs/journal/patches/bwd_dq_convert_heads_fastest.patch 2>&1 | tail -60
tar czf "$OUT/bwd6.tgz" -C /tmp bwd6
