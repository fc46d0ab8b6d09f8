#!/usr/bin/env bash
# One device call: the forward's claim warp at d256 causal (session 44's record has d256 causal 16k at 617 TFLOP/s
# where the H200 records before the claim warp had 665-695). bwd_patch_ab.sh's forward A/B against the checkout:
#   docs/journal/patches/fwd_claim_near_tile_end.patch   (warp 0 asks for each claim two key blocks before a tile's
#                                                         last loads; the forward suites, no sanitizer: device time)
#   docs/journal/patches/diag_fwd_late_claim_default.patch (the LateClaim ablation as the default: the schedule as
#                                                         before the claim warp; timed, not tested)
# bench_fwd.py in two orders at d128/d256. Everything goes into one archive (a call returns at most 8 files).
# usage: bash bench/results/2026-12-06_h200_session44/call_fwd_claim.sh OUTDIR
set -uo pipefail
OUT=$1
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
R=/tmp/claim; rm -rf "$R"; mkdir -p "$R"
DEV_BWD_WORK=/tmp/dev-ab44 DEV_HDIMS="64;128;256" DEV_AB_DIR=fwd DEV_AB_SAN=0 DEV_GTEST_S=90 \
  DEV_AB_HDIMS=128,256 DEV_AB_SEQLENS="1024 4096 16384" \
  timeout 470 bash "$REPO/bench/gpu/dev/bwd_patch_ab.sh" "$R/ab" docs/journal/patches/fwd_claim_near_tile_end.patch \
  docs/journal/patches/diag_fwd_late_claim_default.patch 2>&1 | tail -40
tar czf "$OUT/claim.tgz" -C /tmp claim
