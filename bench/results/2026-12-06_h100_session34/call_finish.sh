#!/usr/bin/env bash
# Written in session 34, NOT run yet (no device time left): the rows' LSE and 1 / sum taken under the tile's last P.V
# (docs/journal/patches/fwd_finish_under_pv.patch) against its ablation variants late_finish / late_finish_d64 in one
# process, the sm90 forward suites on the new default, memcheck and racecheck on the sm90 forward sanitizer cases.
# Run it on a patched copy (the checkout stays as it is):
#   bash bench/gpu/dev/with_patch.sh docs/journal/patches/fwd_finish_under_pv.patch \
#     bench/results/2026-12-06_h100_session34/call_finish.sh $OUT
set -uo pipefail
OUT=$1; mkdir -p "$OUT"; T0=$(date +%s); left() { echo $(( ${CALL_BUDGET:-560} - ($(date +%s) - T0) )); }
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
DEV_BWD_WORK=/tmp/dev-f DEV_HDIMS="64;128" DEV_BWD_BENCH=0 \
  DEV_CMAKE_ARGS="-DFLASHATTN_SM90_ABLATIONS=ON -DFLASHATTN_SM90_ABLATION_VARIANTS=late_finish;late_finish_d64" \
  bash "$REPO/bench/gpu/dev/sm90_bwd_loop.sh" "$OUT" none || exit 1
rm -f "$OUT/build.log"
cd "$REPO/bench/gpu/dev"
export PYTHONPATH=/tmp/dev-f/pyroot
echo "== A/B d128 ($(left) s left)"
timeout 110 python3 fwd_env_ab.py --env FLASHATTN_SM90_MECHANISMS --values ,late_finish --hdims 128 \
  --seqlens 512,1024,2048,4096,16384 --csv "$OUT/ab_finish_d128.csv" 2>&1 | grep -v -i warn
echo "== A/B d64 ($(left) s left)"
timeout 80 python3 fwd_env_ab.py --env FLASHATTN_SM90_MECHANISMS --values ,late_finish_d64 --hdims 64 \
  --seqlens 512,1024,2048,16384 --csv "$OUT/ab_finish_d64.csv" 2>&1 | grep -v -i warn
BIN=/tmp/dev-f/build/tests/gpu/flashattn_gpu_tests
echo "== suites ($(left) s left)"
FLASHATTN_REQUIRE_SM90=1 timeout 120 "$BIN" --gtest_filter='Sm90*/Forward.*:Sm90/Fp8Forward.*:Sm90TileCounter.*:Paged*:*Sink*:Sm90Dropout/*' \
  >"$OUT/suite.log" 2>&1; echo "rc $?"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]" "$OUT/suite.log" | head -12
for tool in memcheck racecheck; do
  [[ $(left) -gt 40 ]] || break
  echo "== $tool ($(left) s left)"
  timeout $(( $(left) > 130 ? 90 : $(left) - 20 )) compute-sanitizer --tool $tool --error-exitcode 9 "$BIN" \
    --gtest_filter='Sanitizer/Forward.*sm90*' >"$OUT/san_$tool.log" 2>&1
  echo "rc $?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" "$OUT/san_$tool.log" | head -4
done
echo "done at $(( $(date +%s) - T0 )) s"
