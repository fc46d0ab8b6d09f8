#!/usr/bin/env bash
# One device call, written in session 43 and not run there (no device time was left): the forward half of
# docs/journal/patches/tma_cache_hints.patch against the checkout (the backward half ran in call_bwd_ab.sh).
# bwd_patch_ab.sh's forward A/B: the sm90 forward suites on the patched build, memcheck + racecheck on the forward
# sanitizer cases, bench_fwd.py in two orders. Everything it writes goes into one archive (a call returns at most 8
# files). About 5 minutes.
# usage: bash bench/results/2026-12-06_h100_session43/call_hints.sh OUTDIR
set -uo pipefail
OUT=$1
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
R=/tmp/hints; rm -rf "$R"; mkdir -p "$R"
DEV_BWD_WORK=/tmp/dev-hints DEV_AB_DIR=fwd DEV_AB_HDIMS=64,128 DEV_AB_SEQLENS="512 1024 4096 16384" \
  DEV_GTEST_S=150 DEV_SAN_S=60 \
  bash "$REPO/bench/gpu/dev/bwd_patch_ab.sh" "$R/ab" docs/journal/patches/tma_cache_hints.patch 2>&1 | tail -60
tar czf "$OUT/hints.tgz" -C /tmp hints
