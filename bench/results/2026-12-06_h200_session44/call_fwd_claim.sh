#!/usr/bin/env bash
# One device call: the causal forward's schedule (session 44's record has d256 causal 16k at 617 TFLOP/s where the
# H200 records before the claim warp had 665-695). bwd_patch_ab.sh's forward A/B against the checkout of
#   docs/journal/patches/fwd_claim_and_small_section_first.patch: warp 0 asks the claim warp for each claim two key
#   blocks before a tile's last loads (not at the tile's start), and the smaller section of the longest-first order
#   goes first (not last);
# the sm90 forward suites (no sanitizer: the device time left did not allow it), then
# bench_fwd.py in two orders. Everything goes into one archive (a call returns at most 8 files).
# usage: bash bench/results/2026-12-06_h200_session44/call_fwd_claim.sh OUTDIR
set -uo pipefail
OUT=$1
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
R=/tmp/claim; rm -rf "$R"; mkdir -p "$R"
DEV_BWD_WORK=/tmp/dev-ab44 DEV_HDIMS="64;128;256" DEV_AB_DIR=fwd DEV_AB_SAN=0 DEV_GTEST_S=60 \
  DEV_AB_HDIMS=128,256 DEV_AB_SEQLENS="1024 4096 16384" \
  timeout 280 bash "$REPO/bench/gpu/dev/bwd_patch_ab.sh" "$R/ab" \
  docs/journal/patches/fwd_claim_and_small_section_first.patch 2>&1 | tail -40
tar czf "$OUT/claim.tgz" -C /tmp claim
