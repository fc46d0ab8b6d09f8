#!/usr/bin/env bash
# One device call: the bars-only training record of the checkout (bench/gpu/run.sh without the suites and
# sanitizers, bf16, every forward and backward row of targets_vs_cudnn_h200.tsv). Everything it writes goes into
# one archive (a call returns at most 8 files).
# usage: FLASHATTN_COMMIT=<hash> bash bench/results/2026-12-06_h200_session44/call_record.sh OUTDIR
set -uo pipefail
OUT=$1
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
R=/tmp/rec; rm -rf "$R"; mkdir -p "$R"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > "$R/gpu.txt" 2>&1
bash "$REPO/bench/gpu/run.sh" "$R/record" --skip ctest,ctest_cpu,check,pytest,sanitize --training bf16 \
  --budget 560 2>&1 | tail -40
tar czf "$OUT/rec.tgz" -C /tmp rec
