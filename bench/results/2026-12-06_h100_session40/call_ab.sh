#!/usr/bin/env bash
# Session 40, run 3: docs/journal/patches/fwd_fast_divmod.patch (the tile scheduler's divisions by host-built
# divisors) against the checkout: the forward suites and both sanitizers on the patched build, then bench_fwd.py in
# two orders beside FA2 and cuDNN, d64/d128, both masks.
#   bash bench/results/2026-12-06_h100_session40/call_ab.sh $OUT
set -uo pipefail
OUT=$1
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
DEV_AB_DIR=fwd DEV_AB_HDIMS=64,128 DEV_AB_SEQLENS="512 1024 4096 16384" DEV_GTEST_S=120 DEV_SAN_S=70 \
  bash "$REPO/bench/gpu/dev/bwd_patch_ab.sh" "$OUT/ab" docs/journal/patches/fwd_fast_divmod.patch
