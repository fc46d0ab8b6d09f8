#!/usr/bin/env bash
# Our sm90 backward beside FlashAttention-4's and cuDNN's, in one device call: FA4 unpacked from the parts that the
# two calls before stashed (fa4_parts.sh says how), the small build of sm90_bwd_loop.sh (ci kernels, sm90 head dims
# DEV_HDIMS, default 128; no tests), the three timed in one process (bwd_peers.py, with their kernel times), then one
# Nsight Compute report (--set full) of each library's warm main kernel per shape of DEV_BWD_NCU, its headline
# metrics, every metric as CSV and the per-instruction source page (SASS with warp-state samples).
# Call 3 carries .whl and .peers/fa4/c:  bash bench/gpu/dev/bwd_peers_ncu.sh $OUT
# DEV_BWD_TIME: the timed shapes (default "d128n4096 d128c4096 d128n16384 d128c16384").
set -uo pipefail
OUT=$1
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
fa4=$(bash "$REPO/bench/gpu/dev/fa4_parts.sh" install "$REPO/.peers/fa4" 2>"$OUT/fa4_install.log") && eval "$fa4" ||
  echo "FA4 not installed: $(tail -2 "$OUT/fa4_install.log")"
export DEV_BWD_WORK=${DEV_BWD_WORK:-/tmp/dev-bwd} DEV_HDIMS=${DEV_HDIMS:-128}
DEV_BWD_BENCH=0 bash "$REPO/bench/gpu/dev/sm90_bwd_loop.sh" "$OUT" none
rm -f "$OUT/build.log"
export PYTHONPATH=$DEV_BWD_WORK/pyroot${PYTHONPATH:+:$PYTHONPATH}
cd "$REPO/bench/gpu/dev" || exit 1
timeout 200 python3 bwd_peers.py ${DEV_BWD_TIME:-d128n4096 d128c4096 d128n16384 d128c16384} --profile \
  --csv "$OUT/bwd_peers.tsv" 2>&1 | grep -v -i warn | tee "$OUT/bwd_peers.log"
SHAPES=${DEV_BWD_NCU:-d128n4096 d128c4096}
# The main kernels only (ours, FA4's, cuDNN's), so that the per-instruction source page stays small.
timeout 240 ncu --clock-control none --set full --profile-from-start off -k regex:'bwd_kernel|BackwardSm90|flash_bprop' \
  -f -o /tmp/bwd_ncu \
  python3 bwd_peers.py --once $SHAPES >"$OUT/ncu_bwd.log" 2>&1
echo "ncu rc $?"; tail -3 "$OUT/ncu_bwd.log"
ncu -i /tmp/bwd_ncu.ncu-rep --page details >"$OUT/ncu_bwd_details.txt" 2>&1
ncu -i /tmp/bwd_ncu.ncu-rep --page raw --csv >"$OUT/ncu_bwd_raw.csv" 2>&1
ncu -i /tmp/bwd_ncu.ncu-rep --page source --csv --print-source sass >"$OUT/ncu_bwd_source.csv" 2>&1
gzip -f "$OUT/ncu_bwd_raw.csv" "$OUT/ncu_bwd_source.csv"
grep -E "^  [a-zA-Z_].*\(|Duration|Compute \(SM\) Throughput|Issue Slots Busy|Executed Ipc Active|No Eligible|Registers Per|Shared Memory|L2 Cache Throughput" \
  "$OUT/ncu_bwd_details.txt" | cut -c1-160 | head -120
