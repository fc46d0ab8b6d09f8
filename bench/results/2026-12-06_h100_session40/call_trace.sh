#!/usr/bin/env bash
# Session 40, one device call: on an H200 first the bars-only record run (run.sh --training bf16), then on any card
# the sm90 forward's tile-boundary trace (docs/journal/patches/fwd_trace.patch, d128, both masks) with the producer's
# stamps split at load()'s entry and the built FwdTile: where the block between a tile's last K/V issue and the next
# tile's walk goes (bench/results/2026-12-06_h100_session34/README.md, run 2).
#   FLASHATTN_COMMIT=<hash> bash bench/results/2026-12-06_h100_session40/call_trace.sh $OUT
set -uo pipefail
OUT=$1
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$REPO"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $GPU"; lscpu | grep -E "Model name|^CPU\(s\)|Flags" | sed 's/Flags:.*\(amx_bf16\).*/has \1/' | cut -c1-120
if [[ $GPU == *H200* ]]; then
  bash bench/gpu/run.sh "$OUT/record" --skip ctest,ctest_cpu,check,pytest,sanitize --training bf16 --budget 330 2>&1 |
    grep -E "Geometric|done|Build:" ; rm -rf "$OUT/record/build.log"
fi
t0=$(date +%s)
DEV_BWD_WORK=/tmp/dev-t DEV_HDIMS=128 DEV_BWD_BENCH=0 DEV_CMAKE_ARGS=-DFLASHATTN_SM90_TRACE=ON \
  bash bench/gpu/dev/with_patch.sh docs/journal/patches/fwd_trace.patch bench/gpu/dev/sm90_bwd_loop.sh "$OUT/t" none |
  tail -3
echo "trace build $(( $(date +%s) - t0 )) s"
PYTHONPATH=/tmp/dev-t/pyroot timeout 150 python3 /tmp/patched/fwd_trace/bench/gpu/dev/fwd_trace.py --hdims 128 \
  --seqlens 512,1024,4096,16384 --csv "$OUT/trace.csv" 2>&1 | grep -v -i warn
