#!/usr/bin/env bash
# Session 33, device call 2: docs/journal/patches/fwd_rescale_under_qk.patch (rescale of O under the next Q.K^T) in an
# ablation build (eager_rescale / eager_rescale_d64 keep main's order), the forward cases, then both orders A/B in one
# process at d128 and d64, 512-16k, both masks, beside cuDNN. usage: bench/results/2026-12-06_h100_session33/call_resc.sh OUTDIR
set -uo pipefail
OUT=$1; mkdir -p "$OUT"; T0=$(date +%s); left() { echo $(( ${CALL_BUDGET:-570} - ($(date +%s) - T0) )); }
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
export DEV_BWD_WORK=/tmp/dev-resc DEV_HDIMS="64;128" DEV_BWD_BENCH=0 DEV_BWD_SANITIZE=0 DEV_GTEST_S=${GT_S:-100}
export DEV_CMAKE_ARGS="-DFLASHATTN_SM90_ABLATIONS=ON -DFLASHATTN_SM90_ABLATION_VARIANTS=eager_rescale;eager_rescale_d64"
bash "$REPO/bench/gpu/dev/with_patch.sh" docs/journal/patches/fwd_rescale_under_qk.patch bench/gpu/dev/sm90_bwd_loop.sh "$OUT" 'Sm90/Forward.*:-*fp16*' || exit 1
P=/tmp/patched/fwd_rescale_under_qk
export PYTHONPATH=/tmp/dev-resc/pyroot
for d in 128 64; do
  v=eager_rescale; [[ $d == 64 ]] && v=eager_rescale_d64
  echo "== d$d A/B ($(left) s left)"; [[ $(left) -gt 40 ]] || break
  timeout $(( $(left) - 5 )) python3 $P/bench/gpu/dev/fwd_env_ab.py --env FLASHATTN_SM90_MECHANISMS --values ,$v --hdims $d \
    --seqlens 512,1024,2048,4096,16384 --csv "$OUT/resc_d$d.csv" >"$OUT/resc_d$d.log" 2>&1; echo "rc $?"
  grep -v -i warn "$OUT/resc_d$d.log" | tail -14
done
echo "done at $(( $(date +%s) - T0 )) s"
