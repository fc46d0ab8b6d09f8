#!/usr/bin/env bash
# Session 41: the CPU backend's 2-thread 16k rows beside torch's CPU SDPA on this machine's host (#19), one timed
# repeat a row (each takes tens of seconds), after call_tables.sh on the same warm machine.
#   bash bench/results/2026-12-06_session41/call_2t16k.sh $OUT
set -uo pipefail
OUT=$1
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
CPU_RUNS=0 CPU_SEQLENS_2T=16384 CPU_ARGS_2T="--dtypes fp32,bf16 --reps 1" bash "$REPO/bench/cpu/device_table.sh" "$OUT/cpu2t16k" 2>&1
