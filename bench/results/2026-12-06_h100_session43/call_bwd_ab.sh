#!/usr/bin/env bash
# One device call: the backward A/B of two patches against the checkout (bwd_patch_ab.sh: one base build, one
# incremental build per patch with the bf16 sm90 backward suites, then bench_bwd.py with three interleaved rounds):
#   docs/journal/patches/tma_cache_hints.patch               (TMA loads with L2 eviction hints)
#   docs/journal/patches/bwd_d128_rows80_keys_contiguous.patch  (80-row steps at d128 without a mask, dS keys contiguous)
# Everything it writes goes into one archive (a call returns at most 8 files).
# usage: bash bench/results/2026-12-06_h100_session43/call_bwd_ab.sh OUTDIR
set -uo pipefail
OUT=$1
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
R=/tmp/bwdab; rm -rf "$R"; mkdir -p "$R"
DEV_BWD_WORK=/tmp/dev-bwdab DEV_HDIMS="64;128" DEV_AB_ROUNDS=3 DEV_AB_SAN=0 DEV_GTEST_S=150 \
  DEV_AB_HDIMS=64,128 DEV_AB_SEQLENS="1024 4096 16384" \
  bash "$REPO/bench/gpu/dev/bwd_patch_ab.sh" "$R/ab" docs/journal/patches/tma_cache_hints.patch \
  docs/journal/patches/bwd_d128_rows80_keys_contiguous.patch 2>&1 | tail -80
tar czf "$OUT/bwdab.tgz" -C /tmp bwdab
