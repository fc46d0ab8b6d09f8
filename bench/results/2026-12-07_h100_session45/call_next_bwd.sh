#!/usr/bin/env bash
# Written in session 45 for the next device sessions, not run (session 46's two tries lost their machine mid-call).
# Backward patches against the checkout through bwd_patch_ab.sh: the bf16 sm90 backward suites at HDIMS on each
# (deterministic cases included), then three interleaved rounds at 512-4k, d64 and d128. A patch that touches a
# header the sm80 units include rebuilds the whole ci kernel set, about 105-120 s on the device's 16 cores (this
# folder's README, run 2), so a call takes at most two.
# bwd_band_mask.patch no longer does (session 46: its band lives in sm90/bwd_mask_band.cuh): it recompiles the sm90
# backward units and the host mask test only. Under a small device budget (session 46 had 419 s left), one lean call:
#   R=/tmp/bwdnext; mkdir -p $R; DEV_BWD_WORK=/tmp/dev-bwdnext DEV_HDIMS="64;128" DEV_AB_ROUNDS=2 DEV_AB_SAN=0 \
#     DEV_GTEST_S=90 DEV_AB_HDIMS=64,128 DEV_AB_SEQLENS="512 1024 4096" timeout 290 bash bench/gpu/dev/bwd_patch_ab.sh \
#     $R/ab docs/journal/patches/bwd_band_mask.patch 2>&1 | tail -50; tar czf $OUT/bwdnext.tgz -C /tmp bwdnext
# The next calls, in this order:
#   bash bench/results/2026-12-07_h100_session45/call_next_bwd.sh $OUT "64;128;256" \
#     docs/journal/patches/bwd_band_mask.patch                        (about 6 minutes; d256 builds its split mainloop)
#   bash bench/results/2026-12-07_h100_session45/call_next_bwd.sh $OUT "64;128" \
#     docs/journal/patches/bwd_causal_tail_key_block_major.patch docs/journal/patches/bwd_dq_convert_heads_fastest.patch
#   bash bench/results/2026-12-07_h100_session45/call_next_bwd.sh $OUT "64;128" \
#     docs/journal/patches/bwd_preprocess_heads_fastest.patch
# One archive (a call returns at most 8 files). DEV_CALL_S: the seconds the patches get before the archive (570).
# usage: bash bench/results/2026-12-07_h100_session45/call_next_bwd.sh OUTDIR HDIMS PATCH...
set -uo pipefail
OUT=$1
HDIMS=$2
shift 2
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
R=/tmp/bwdnext; rm -rf "$R"; mkdir -p "$R"
DEV_BWD_WORK=/tmp/dev-bwdnext DEV_HDIMS="$HDIMS" DEV_AB_ROUNDS=3 DEV_AB_SAN=0 DEV_GTEST_S=120 \
  DEV_AB_HDIMS=64,128 DEV_AB_SEQLENS="512 1024 4096" \
  timeout "${DEV_CALL_S:-570}" bash "$REPO/bench/gpu/dev/bwd_patch_ab.sh" "$R/ab" "$@" 2>&1 | tail -60
tar czf "$OUT/bwdnext.tgz" -C /tmp bwdnext
