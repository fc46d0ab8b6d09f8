#!/bin/bash
# compute-sanitizer racecheck on each part of check.py's tiny case 2 (bench/gpu/dev/race_isolate.py), with the
# Python package composed from python/flashattn and the carried build's extension.
# Logs stay in /tmp/race_<part>.log (the summaries and any failure's context go to stdout).
# Usage (from the source root): bench/gpu/dev/device_run_race.sh BUILD_DIR
B=$1
R=/tmp/race_pyroot; rm -rf $R; mkdir -p $R; cp -r python/flashattn $R/
find "$B" -name "*.cpython-*.so" -exec cp {} $R/flashattn/ \;
export PYTHONPATH=$R PYTORCH_NO_CUDA_MEMORY_CACHING=1
for part in ${PARTS:-ref fwd ops_fwd fwd_bwd ops_fwd_bwd det_bwd case case_no_poison case_no_plain}; do
  timeout 60 compute-sanitizer --tool racecheck --kernel-name kns=flashattn python3 bench/gpu/dev/race_isolate.py $part \
    > "/tmp/race_$part.log" 2>&1
  rc=$?
  echo "== racecheck $part rc=$rc $(grep -hE 'RACECHECK SUMMARY|Internal Sanitizer Error|done$' "/tmp/race_$part.log" | tr '\n' ' ')"
  [ $rc = 0 ] || grep -vE "^=+ *$" "/tmp/race_$part.log" | grep -B2 -A12 -m1 -E "Race|Error|hazard" | head -40
done
