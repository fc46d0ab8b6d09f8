#!/usr/bin/env bash
# Written in session 44 for the next device session, not run: run 4 (call_fwd_claim.sh) built and tested the patch
# below on an H100 but its timing did not fit the device time left. One call, about 8 minutes on an H100:
# bwd_patch_ab.sh's forward A/B of docs/journal/patches/fwd_claim_and_small_section_first.patch against the checkout
# (the sm90 forward suites, memcheck and racecheck on the forward's sanitizer cases and the tile counter), then
# bench_fwd.py in two orders on the causal rows, where the schedule applies (bench/gpu/dev/schedule_model.py's
# predictions are in this folder's README). Everything goes into one archive (a call returns at most 8 files).
# usage: bash bench/results/2026-12-06_h200_session44/call_next_claim.sh OUTDIR
set -uo pipefail
OUT=$1
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
R=/tmp/claim2; rm -rf "$R"; mkdir -p "$R"
DEV_BWD_WORK=/tmp/dev-claim DEV_HDIMS="64;128;256" DEV_AB_DIR=fwd DEV_AB_SAN=1 DEV_GTEST_S=90 DEV_SAN_S=70 \
  DEV_AB_MASKS=causal DEV_AB_HDIMS=64,128,256 DEV_AB_SEQLENS="1024 2048 4096 16384" \
  timeout 560 bash "$REPO/bench/gpu/dev/bwd_patch_ab.sh" "$R/ab" \
  docs/journal/patches/fwd_claim_and_small_section_first.patch 2>&1 | tail -40
tar czf "$OUT/claim2.tgz" -C /tmp claim2
