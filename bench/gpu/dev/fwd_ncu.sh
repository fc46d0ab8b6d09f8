#!/usr/bin/env bash
# The sm90 forward beside cuDNN's under Nsight Compute, in one device call: the small build of sm90_bwd_loop.sh (ci
# kernels, sm90 head dims DEV_HDIMS (default "64;128"), the Python package; no tests), then one ncu report (--set
# full) of our forward kernel and cuDNN's per shape of DEV_FWD_NCU (fwd_once.py makes each call twice: the second is
# the warm one), their headline metrics, and every metric as CSV (ncu_fwd_raw.csv: instructions, pipe utilisation,
# stall reasons per kernel).
# usage: bench/gpu/dev/fwd_ncu.sh OUTDIR   (DEV_FWD_NCU, default "d128c4096 d128n4096 d64c1024")
set -uo pipefail
OUT=$1
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
export DEV_BWD_WORK=${DEV_BWD_WORK:-/tmp/dev-bwd} DEV_HDIMS=${DEV_HDIMS:-64;128}
DEV_BWD_BENCH=0 bash "$REPO/bench/gpu/dev/sm90_bwd_loop.sh" "$OUT" none
cd "$REPO/bench/gpu/dev" || exit 1
SHAPES=${DEV_FWD_NCU:-d128c4096 d128n4096 d64c1024}
PYTHONPATH=$DEV_BWD_WORK/pyroot timeout 300 ncu --clock-control none --set full -k regex:'fwd_kernel|flash_fprop' \
  -f -o "$OUT/fwd_ncu" python3 fwd_once.py $SHAPES >"$OUT/ncu_fwd.log" 2>&1
echo "ncu rc $?"; tail -3 "$OUT/ncu_fwd.log"
ncu -i "$OUT/fwd_ncu.ncu-rep" --page details >"$OUT/ncu_fwd_details.txt" 2>&1
ncu -i "$OUT/fwd_ncu.ncu-rep" --page raw --csv >"$OUT/ncu_fwd_raw.csv" 2>&1
grep -E "^  [a-z_].*\(|Duration|Compute \(SM\) Throughput|Issue Slots Busy|Executed Ipc Active|Warp Cycles Per Issued|No Eligible|Registers Per|Achieved Occupancy" \
  "$OUT/ncu_fwd_details.txt" | cut -c1-150 | head -150
