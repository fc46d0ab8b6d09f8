#!/usr/bin/env bash
# Session 34, device call 2: the short forward's tile boundary (#13). (1) A/B in one process: O stored from registers
# where it has a shared-memory tile of its own (ablation variants direct_o, direct_o_d64) against the default TMA
# store; (2) the boundary trace (docs/journal/patches/fwd_trace.patch, now with the producer's and the epilogue's
# stamps) at d128 512-4k; (3) ncu (--set full) of ours and cuDNN's at d128 512 and the source-level stall samples of
# ours at 512 without a mask. It ran on 89f730d + docs/journal/patches/fwd_direct_o.patch (the variants; dropped since):
# `git apply` that patch first. usage: bench/results/2026-12-06_h100_session34/call_boundary.sh OUT
set -uo pipefail
OUT=$1; mkdir -p "$OUT"; T0=$(date +%s); left() { echo $(( ${CALL_BUDGET:-560} - ($(date +%s) - T0) )); }
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
DEV_BWD_WORK=/tmp/dev-a DEV_HDIMS="64;128" DEV_BWD_BENCH=0 \
  DEV_CMAKE_ARGS="-DFLASHATTN_SM90_ABLATIONS=ON -DFLASHATTN_SM90_ABLATION_VARIANTS=direct_o;direct_o_d64" \
  bash "$REPO/bench/gpu/dev/sm90_bwd_loop.sh" "$OUT/a" none || exit 1
# The trace build in the background (its own copy and work folder) while the A/B runs.
( DEV_BWD_WORK=/tmp/dev-t DEV_HDIMS=128 DEV_BWD_BENCH=0 DEV_CMAKE_ARGS=-DFLASHATTN_SM90_TRACE=ON \
  bash "$REPO/bench/gpu/dev/with_patch.sh" docs/journal/patches/fwd_trace.patch bench/gpu/dev/sm90_bwd_loop.sh "$OUT/t" none \
  >"$OUT/trace_build.log" 2>&1 ) &
BPID=$!
cd "$REPO/bench/gpu/dev"
export PYTHONPATH=/tmp/dev-a/pyroot
echo "== A/B direct_o d128 ($(left) s left)"
timeout 150 python3 fwd_env_ab.py --env FLASHATTN_SM90_MECHANISMS --values ,direct_o --hdims 128 \
  --seqlens 512,1024,2048,4096 --csv "$OUT/ab_direct_o_d128.csv" 2>&1 | grep -v -i warn
echo "== A/B direct_o_d64 ($(left) s left)"
timeout 100 python3 fwd_env_ab.py --env FLASHATTN_SM90_MECHANISMS --values ,direct_o_d64 --hdims 64 \
  --seqlens 512,1024,2048 --csv "$OUT/ab_direct_o_d64.csv" 2>&1 | grep -v -i warn
BIN=/tmp/dev-a/build/tests/gpu/flashattn_gpu_tests
for v in direct_o direct_o_d64; do  # the sm90 forward suite's bf16 cases on the variant (the ablation switch takes them)
  echo "== suite on $v ($(left) s left)"
  FLASHATTN_SM90_MECHANISMS=$v FLASHATTN_REQUIRE_SM90=1 timeout 80 "$BIN" --gtest_filter='Sm90/Forward.*:-*fp16*' \
    >"$OUT/suite_$v.log" 2>&1; echo "rc $?"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]" "$OUT/suite_$v.log" | head -8
done
echo "== trace build ($(left) s left)"
wait $BPID; tail -3 "$OUT/trace_build.log"
echo "== trace ($(left) s left)"
PYTHONPATH=/tmp/dev-t/pyroot timeout 120 python3 /tmp/patched/fwd_trace/bench/gpu/dev/fwd_trace.py --hdims 128 \
  --seqlens 512,1024,4096 --csv "$OUT/trace.csv" 2>&1 | grep -v -i warn
if [[ $(left) -gt 100 ]]; then
  echo "== ncu, ours and cuDNN d128 512 ($(left) s left)"
  timeout $(( $(left) / 2 )) ncu --clock-control none --set full -k regex:'fwd_kernel|flash_fprop' -f -o /tmp/fwd512 \
    python3 fwd_once.py d128n512 d128c512 >/dev/null 2>&1; echo "rc $?"
  ncu -i /tmp/fwd512.ncu-rep --page details >"$OUT/ncu_details.txt" 2>&1
  grep -E "^  [a-z_].*\(|Duration|Issue Slots Busy|Warp Cycles Per Issued|No Eligible|Registers Per|L2 Hit|DRAM Throughput" \
    "$OUT/ncu_details.txt" | cut -c1-150 | head -80
fi
if [[ $(left) -gt 50 ]]; then
  echo "== ncu source, ours d128n512 ($(left) s left)"
  timeout $(( $(left) - 25 )) ncu --clock-control none --set full --import-source yes -k regex:fwd_kernel --launch-skip 1 -c 1 \
    -f -o /tmp/src512 python3 fwd_once.py d128n512 >/dev/null 2>&1; echo "rc $?"
  ncu -i /tmp/src512.ncu-rep --page source --csv --print-source sass 2>&1 | gzip >"$OUT/ncu_src512.csv.gz"
fi
rm -f "$OUT/a/build.log" "$OUT/t/build.log"
echo "done at $(( $(date +%s) - T0 )) s"
