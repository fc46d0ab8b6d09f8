#!/usr/bin/env bash
# One device call: docs/journal/patches/tma_cache_hints.patch against the checkout. The forward A/B of
# bwd_patch_ab.sh (the sm90 forward and backward suites on the patched build, memcheck + racecheck on the forward
# sanitizer cases, bench_fwd.py in two orders), then bench_bwd.py on the same two libraries, three interleaved rounds.
# Everything it writes goes into one archive (a call returns at most 8 files).
# usage: bash bench/results/2026-12-06_h100_session43/call_hints.sh OUTDIR
set -uo pipefail
OUT=$1
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
R=/tmp/hints; rm -rf "$R"; mkdir -p "$R"
export DEV_BWD_WORK=/tmp/dev-hints
DEV_AB_DIR=fwd DEV_AB_HDIMS=64,128 DEV_AB_SEQLENS="512 1024 4096 16384" DEV_GTEST_S=200 DEV_SAN_S=60 \
  DEV_AB_CASES='Sm90*/Forward.*:Sm90*/Backward.*:Sm90TileCounter.*:Paged*:-*fp16*' \
  bash "$REPO/bench/gpu/dev/bwd_patch_ab.sh" "$R/ab" docs/journal/patches/tma_cache_hints.patch 2>&1 | tail -60
W=$DEV_BWD_WORK
if [[ -f $W/tma_cache_hints.so ]]; then
  (cd "$REPO/bench/gpu/dev" && timeout 240 python3 bench_bwd.py "$W/base.so:base" "$W/tma_cache_hints.so:hints" \
    --rounds 3 --hdims 64,128 1024 4096 16384 >"$R/bwd_rounds.tsv" 2>&1)
  echo "bench_bwd rc $?"; grep -E "^# (paired)" "$R/bwd_rounds.tsv"
fi
tar czf "$OUT/hints.tgz" -C /tmp hints
