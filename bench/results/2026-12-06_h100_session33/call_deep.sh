#!/usr/bin/env bash
# Session 33, device call 1: docs/journal/patches/decode_deep_tiles.patch built in an ablation build, the decode cases on
# the deep tiles and (FLASHATTN_SM90_DECODE_DEEP=0) on kDecode, the decode shapes A/B in one process (both orders,
# kernel times per call), paged 256/16 A/B, memcheck on the deep tiles. usage: bench/results/2026-12-06_h100_session33/call_deep.sh OUTDIR
set -uo pipefail
OUT=$1; mkdir -p "$OUT"; T0=$(date +%s); left() { echo $(( ${CALL_BUDGET:-570} - ($(date +%s) - T0) )); }
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
export DEV_BWD_WORK=/tmp/dev-deep DEV_HDIMS=128 DEV_BWD_BENCH=0 DEV_BWD_SANITIZE=0 DEV_GTEST_S=110
export DEV_CMAKE_ARGS="-DFLASHATTN_SM90_ABLATIONS=ON -DFLASHATTN_SM90_ABLATION_VARIANTS=single_q"
CASES='Sm90/Forward.*packed*:Sm90/Forward.*split*:Paged*:*TileShape*:GpuMerge.*:-*fp16*'
bash "$REPO/bench/gpu/dev/with_patch.sh" docs/journal/patches/decode_deep_tiles.patch bench/gpu/dev/sm90_bwd_loop.sh "$OUT" "$CASES" || exit 1
BIN=$(find /tmp/dev-deep/build -name flashattn_gpu_tests -type f | head -1)
P=/tmp/patched/decode_deep_tiles/bench/gpu/dev
export PYTHONPATH=/tmp/dev-deep/pyroot
echo "== decode_splits A/B ($(left) s left)"
(cd $P && timeout $(( $(left) > 170 ? 170 : $(left) )) python3 decode_splits.py --env FLASHATTN_SM90_DECODE_DEEP --values ,0 --splits 0 --profile --csv "$OUT/decode_ab.csv" >"$OUT/decode_ab.log" 2>&1); echo "rc $?"
grep -v -i warn "$OUT/decode_ab.log" | tail -40
for deep in 1 0; do
  echo "== paged deep=$deep ($(left) s left)"; [[ $(left) -gt 60 ]] || break
  (cd $P && FLASHATTN_SM90_DECODE_DEEP=$deep timeout 70 python3 paged_decode.py --pages 256,16 --csv "$OUT/paged_deep$deep.csv" >"$OUT/paged_deep$deep.log" 2>&1); echo "rc $?"; tail -14 "$OUT/paged_deep$deep.log"
done
echo "== gtest on kDecode ($(left) s left)"
[[ $(left) -gt 40 ]] && { FLASHATTN_SM90_DECODE_DEEP=0 FLASHATTN_REQUIRE_SM90=1 timeout $(( $(left) - 35 )) "$BIN" --gtest_filter="$CASES" >"$OUT/gtest_kdecode.log" 2>&1; echo "rc $?"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]" "$OUT/gtest_kdecode.log" | head; }
echo "== memcheck deep ($(left) s left)"
[[ $(left) -gt 25 ]] && { timeout $(( $(left) - 10 )) compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN" --gtest_filter='Sm90/Forward.*packed_decode*:Sm90/Forward.*split_decode*:PagedSanitizer*:-*fp16*' >"$OUT/san_memcheck.log" 2>&1; echo "rc $?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/san_memcheck.log" | head -4; }
echo "done at $(( $(date +%s) - T0 )) s"
