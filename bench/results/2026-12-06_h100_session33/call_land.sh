#!/usr/bin/env bash
# Session 33, device call 3: the checkout with the rescale under the next Q.K^T (fwd_rescale_under_qk.patch applied),
# d64/d128/d256 with the eager_rescale ablations and ptxas -v; every sm90 forward case (bf16 and fp16), memcheck and
# racecheck on the sm90 forward's sanitizer cases, then d256 A/B beside cuDNN. usage: bench/results/2026-12-06_h100_session33/call_land.sh OUTDIR
set -uo pipefail
OUT=$1; mkdir -p "$OUT"; T0=$(date +%s); left() { echo $(( ${CALL_BUDGET:-570} - ($(date +%s) - T0) )); }
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
export DEV_BWD_WORK=/tmp/dev-land DEV_HDIMS="64;128;256" DEV_BWD_BENCH=0 DEV_GTEST_S=130 DEV_SAN_S=70
export DEV_SAN_FILTER='Sanitizer/Forward.*sm90*'
export DEV_CMAKE_ARGS="-DFLASHATTN_SM90_ABLATIONS=ON -DFLASHATTN_SM90_ABLATION_VARIANTS=eager_rescale;eager_rescale_d64;eager_rescale_d256 -DCMAKE_CUDA_FLAGS=-Xptxas=-v"
bash "$REPO/bench/gpu/dev/sm90_bwd_loop.sh" "$OUT" 'Sm90/Forward.*' || exit 1
export PYTHONPATH=/tmp/dev-land/pyroot
echo "== d256 A/B ($(left) s left)"
[[ $(left) -gt 40 ]] && { timeout $(( $(left) - 5 )) python3 "$REPO/bench/gpu/dev/fwd_env_ab.py" --env FLASHATTN_SM90_MECHANISMS --values ,eager_rescale_d256 --hdims 256 \
  --seqlens 512,2048,16384 --csv "$OUT/resc_d256.csv" >"$OUT/resc_d256.log" 2>&1; echo "rc $?"; grep -v -i warn "$OUT/resc_d256.log" | tail -8; }
echo "done at $(( $(date +%s) - T0 )) s"
