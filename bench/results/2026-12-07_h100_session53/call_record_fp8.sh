#!/usr/bin/env bash
# One device call: session 44's bars-only training record (call_record.sh: bench/gpu/run.sh without the suites and
# sanitizers, bf16, every forward and backward row of targets_vs_cudnn_h200.tsv), then, with the package that
# record built, bench.py's FP8 rows (fp8_rows: #21's TFLOP/s at d64/d128/d256 beside our bf16 and cuDNN, and the
# outlier RMSE table) into fp8.csv. Everything goes into one archive.
# usage: FLASHATTN_COMMIT=<hash> bash bench/results/2026-12-07_h100_session53/call_record_fp8.sh OUTDIR
# REC_BUDGET: run.sh's budget in seconds (default 520). The table so far is copied to OUTDIR every 10 s, so that a
# call stopped at its limit still returns it.
set -uo pipefail
OUT=$1
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
R=/tmp/rec; rm -rf "$R"; mkdir -p "$R"
( while sleep 10; do cp -f "$R/record/results.csv" "$R/fp8.csv" "$OUT/" 2>/dev/null; done ) &
COPIER=$!
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > "$R/gpu.txt" 2>&1
bash "$REPO/bench/gpu/run.sh" "$R/record" --skip ctest,ctest_cpu,check,pytest,sanitize --training bf16 \
  --budget "${REC_BUDGET:-520}" 2>&1 | tail -40
# The package the record imported (run.sh's build log: "python package: imported from DIR").
PYROOT=$(sed -n 's/.*python package: imported from //p' "$R/record/build.log" | tail -1)
if [[ -n $PYROOT ]]; then
  PYTHONPATH="$PYROOT:$REPO/bench/gpu" timeout 150 python3 - "$R/fp8.csv" <<'PYEOF' 2>&1 | tail -30
import sys
import bench, common
b = bench.Bench(sys.argv[1], warmup_ms=50, rep_ms=200)
print("# " + "  ".join(f"{k} {v}" for k, v in common.env_info().items()), flush=True)
bench.fp8_rows(b, common.load_ours("cuda"))
PYEOF
else
  echo "no package found in $R/record/build.log: no FP8 rows"
fi
kill "$COPIER" 2>/dev/null
tar czf "$OUT/rec.tgz" -C /tmp rec
