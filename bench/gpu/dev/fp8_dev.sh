#!/usr/bin/env bash
# Development loop for the FP8 forward on the GPU machine (not the record harness, run.sh): the small build of
# sm90_bwd_loop.sh (FLASHATTN_KERNELS=ci, bf16, plus the sm90 head dims 64, 128 and 256, which brings the FP8 units
# of those dims), the FP8 GPU suite (tests/gpu/fp8_test.cpp), compute-sanitizer memcheck and racecheck on its
# sanitizer cases, the Python FP8 tests on CUDA, then bench.py's FP8 rows (fp8_rows: ours FP8 / bf16 / cuDNN, and
# the accuracy rows).
# usage: bench/gpu/dev/fp8_dev.sh OUTDIR
set -uo pipefail
OUT=$1
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
export DEV_HDIMS=${DEV_HDIMS:-"64;128;256"} DEV_BWD_WORK=${DEV_BWD_WORK:-/tmp/dev-fp8} DEV_BWD_SANITIZE=1
export DEV_SAN_FILTER='Fp8Sanitizer/*' DEV_BWD_BENCH=0
# The loop's build, gtest and sanitizer steps and the Python package; its backward benchmark is skipped.
bash "$REPO/bench/gpu/dev/sm90_bwd_loop.sh" "$OUT" 'Sm90/Fp8Forward.*:Fp8Forward.*:Fp8Quantize.*:Fp8Sanitizer/*'
PY=$(command -v python3)
PYROOT=$DEV_BWD_WORK/pyroot
PYTHONPATH=$PYROOT timeout 150 "$PY" -m pytest -q -rs "$REPO/tests/python/test_fp8.py" >"$OUT/pytest_fp8.log" 2>&1
echo "pytest rc $?"; tail -15 "$OUT/pytest_fp8.log"
PYTHONPATH=$PYROOT:$REPO/bench/gpu timeout 200 "$PY" - "$OUT/fp8_bench.csv" >"$OUT/fp8_bench.log" 2>&1 <<'PYEOF'
import sys
import bench, common
b = bench.Bench(sys.argv[1], warmup_ms=50, rep_ms=200)
ours = common.load_ours("cuda")
print("# " + common.describe_ours(ours), flush=True)
bench.fp8_rows(b, ours)
PYEOF
echo "bench rc $?"; cat "$OUT/fp8_bench.log" | cut -c1-200
