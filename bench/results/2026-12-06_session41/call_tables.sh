#!/usr/bin/env bash
# Session 41: on an H200, the bars-only record run (run.sh --training bf16) first; on any card, the CPU backend
# beside torch's CPU SDPA on this machine's host (#19): 16 threads at 1k/4k/16k and 2 threads at 1k/4k, median of 3.
# The 2-thread 16k rows take about 6 minutes and run in a call of their own (call_2t16k.sh).
#   FLASHATTN_COMMIT=<hash> bash bench/results/2026-12-06_session41/call_tables.sh $OUT
set -uo pipefail
OUT=$1
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$REPO"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$gpu"
if [[ $gpu == *H200* ]]; then
  bash bench/gpu/run.sh "$OUT/record" --skip ctest,ctest_cpu,check,pytest,sanitize --training bf16 --budget 300 2>&1 |
    grep -E "Geometric|done|Build:"
fi
CPU_RUNS=1 CPU_SEQLENS=1024,4096,16384 CPU_SEQLENS_2T=1024,4096 bash bench/cpu/device_table.sh "$OUT/cpu" 2>&1
