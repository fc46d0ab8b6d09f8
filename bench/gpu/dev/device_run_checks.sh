#!/bin/bash
# One device call between records: the forward GPU tests of both CUDA backends and their sanitizer subset
# (device_run_sm90.sh, no timing), the Python package's tests on the GPU, the host cost of our entry points
# next to SDPA (host_overhead.py), and racecheck of check.py's tiny cases with the plain implementation on the
# CPU plus the parts that say where the old failure came from (race_isolate.py: plain, case_plain_cpu).
# Usage (from the source root): bench/gpu/dev/device_run_checks.sh OUT_DIR BUILD_DIR
O=$1; B=$2
L=$(find "$B" -name libflashattn_capi.so | head -1)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH PYTHONUNBUFFERED=1
BENCH=0 bash bench/gpu/dev/device_run_sm90.sh "$O" "$B"
R=/tmp/checks_pyroot; rm -rf $R; mkdir -p $R; cp -r python/flashattn $R/
find "$B" -name "*.cpython-*.so" -exec cp {} $R/flashattn/ \;
PYTHONPATH=$R timeout 240 python3 -m pytest tests/python -q -x > "$O/pytest.log" 2>&1
echo "== pytest rc=$? $(tail -1 "$O/pytest.log")"
grep -E "^FAILED|Error" "$O/pytest.log" | head -10
PYTHONPATH=$R timeout 120 python3 bench/gpu/dev/host_overhead.py "$L" > "$O/host_overhead.tsv" 2>&1
echo "== host_overhead rc=$?"; cat "$O/host_overhead.tsv"
PARTS="plain case_plain_cpu" timeout 150 bash bench/gpu/dev/device_run_race.sh "$B"
export PYTHONPATH=$R
for tool in memcheck racecheck; do
  timeout 120 compute-sanitizer --tool $tool --kernel-name kns=flashattn python3 bench/gpu/check.py --tiny \
    --plain-on-cpu > "/tmp/check_tiny_$tool.log" 2>&1
  echo "== check.py --tiny --plain-on-cpu $tool rc=$? $(grep -hE 'SUMMARY|Internal Sanitizer Error|passed,' /tmp/check_tiny_$tool.log | tr '\n' ' ')"
done
