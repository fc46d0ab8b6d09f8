#!/usr/bin/env bash
# Session 33, device call 4 (HEAD: the rescale landed): launch configurations of cuDNN's and our kernels (decode and
# short forward shapes), the decode split counts with the combine's first batch (16 against 32/33 splits), and the
# dropout cost at d128 8k with the new rescale order. usage: bench/results/2026-12-06_h100_session33/call_configs.sh OUT
set -uo pipefail
OUT=$1; mkdir -p "$OUT"; T0=$(date +%s); left() { echo $(( ${CALL_BUDGET:-560} - ($(date +%s) - T0) )); }
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
DEV_BWD_WORK=/tmp/dev-cfg DEV_HDIMS="64;128" DEV_BWD_BENCH=0 bash "$REPO/bench/gpu/dev/sm90_bwd_loop.sh" "$OUT" none || exit 1
export PYTHONPATH=/tmp/dev-cfg/pyroot
cd "$REPO/bench/gpu/dev"
echo "== configs ($(left) s left)"
timeout 120 python3 kernel_configs.py --decode 1x65536,8x16384,64x32768 \
  --fwd d128n512,d128c512,d64n512,d64c512,d128n16384 >"$OUT/configs.log" 2>&1; echo "rc $?"; grep -v -i warn "$OUT/configs.log"
echo "== splits ($(left) s left)"
timeout $(( $(left) > 200 ? 150 : $(left) - 50 )) python3 decode_splits.py --splits 0,16,32,33 --profile --csv "$OUT/splits.csv" \
  >"$OUT/splits.log" 2>&1; echo "rc $?"; grep -v -i warn "$OUT/splits.log" | grep -v "# profile" | head -30
echo "== dropout cost ($(left) s left)"
[[ $(left) -gt 40 ]] && { timeout $(( $(left) - 5 )) python3 dropout_cost.py --hdims 128 --seqlen 8192 --csv "$OUT/dropout_cost.csv" \
  >"$OUT/dropout_cost.log" 2>&1; echo "rc $?"; tail -12 "$OUT/dropout_cost.log"; }
echo "done at $(( $(date +%s) - T0 )) s"
