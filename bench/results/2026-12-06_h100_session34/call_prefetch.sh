#!/usr/bin/env bash
# Session 34, device call 3: the next tile's Q prefetched into L2 a tile ahead (static schedule) against the ablation
# variants no_q_prefetch / no_q_prefetch_d64 in one process (causal rows: the dynamic schedule, which does not
# prefetch, as the control), the sm90 forward suite on the new default, and memcheck on its sanitizer cases.
# It ran on 89f730d + docs/journal/patches/fwd_next_q_prefetch.patch (dropped since): `git apply` that patch first.
# usage: bench/results/2026-12-06_h100_session34/call_prefetch.sh OUT
set -uo pipefail
OUT=$1; mkdir -p "$OUT"; T0=$(date +%s); left() { echo $(( ${CALL_BUDGET:-400} - ($(date +%s) - T0) )); }
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
DEV_BWD_WORK=/tmp/dev-p DEV_HDIMS="64;128" DEV_BWD_BENCH=0 \
  DEV_CMAKE_ARGS="-DFLASHATTN_SM90_ABLATIONS=ON -DFLASHATTN_SM90_ABLATION_VARIANTS=no_q_prefetch;no_q_prefetch_d64" \
  bash "$REPO/bench/gpu/dev/sm90_bwd_loop.sh" "$OUT" none || exit 1
rm -f "$OUT/build.log"
cd "$REPO/bench/gpu/dev"
export PYTHONPATH=/tmp/dev-p/pyroot
echo "== A/B d128 ($(left) s left)"
timeout 110 python3 fwd_env_ab.py --env FLASHATTN_SM90_MECHANISMS --values ,no_q_prefetch --hdims 128 \
  --seqlens 512,1024,2048,4096 --csv "$OUT/ab_q_prefetch_d128.csv" 2>&1 | grep -v -i warn
BIN=/tmp/dev-p/build/tests/gpu/flashattn_gpu_tests
echo "== suite ($(left) s left)"
FLASHATTN_REQUIRE_SM90=1 timeout 70 "$BIN" --gtest_filter='Sm90/Forward.*:Sm90TileCounter.*:Paged*' >"$OUT/suite.log" 2>&1
echo "rc $?"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]" "$OUT/suite.log" | head -8
if [[ $(left) -gt 60 ]]; then
  echo "== A/B d64 ($(left) s left)"
  timeout $(( $(left) > 110 ? 60 : $(left) - 45 )) python3 fwd_env_ab.py --env FLASHATTN_SM90_MECHANISMS --values ,no_q_prefetch_d64 --hdims 64 \
    --seqlens 512,1024,2048 --csv "$OUT/ab_q_prefetch_d64.csv" 2>&1 | grep -v -i warn
fi
if [[ $(left) -gt 30 ]]; then
  echo "== memcheck ($(left) s left)"
  timeout $(( $(left) - 10 )) compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN" --gtest_filter='Sanitizer/Forward.*sm90*' \
    >"$OUT/memcheck.log" 2>&1; echo "rc $?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/memcheck.log" | head -4
fi
echo "done at $(( $(date +%s) - T0 )) s"
