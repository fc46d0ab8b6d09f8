#!/usr/bin/env bash
# Session 33, device call 5: the dynamic schedule's tile counter kept at zero per stream (no memset per causal call).
# Ablation build (its FLASHATTN_SM90_COUNTER_MEMSET=1 restores the memset before every launch), d64/d128: the counter
# test, the sm90 forward cases of the dynamic schedule, the graph-capture pytest cases, memcheck and racecheck, then
# the memset A/B beside cuDNN at 512-2k. usage: bench/results/2026-12-06_h100_session33/call_counter.sh OUTDIR
set -uo pipefail
OUT=$1; mkdir -p "$OUT"; T0=$(date +%s); left() { echo $(( ${CALL_BUDGET:-480} - ($(date +%s) - T0) )); }
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
export DEV_BWD_WORK=/tmp/dev-ctr DEV_HDIMS="64;128" DEV_BWD_BENCH=0 DEV_GTEST_S=100 DEV_SAN_S=50
export DEV_SAN_FILTER='Sm90TileCounter.*:Sanitizer/Forward.*sm90*causal*:Sanitizer/Forward.*sm90*split*'
export DEV_CMAKE_ARGS="-DFLASHATTN_SM90_ABLATIONS=ON -DFLASHATTN_SM90_ABLATION_VARIANTS=eager_rescale"
bash "$REPO/bench/gpu/dev/sm90_bwd_loop.sh" "$OUT" \
  'Sm90TileCounter.*:Sm90/Forward.*causal*:Sm90/Forward.*window*:Sm90/Forward.*split*:Sm90/Forward.*packed*:Sm90/Forward.*varlen*:-*fp16*' || exit 1
export PYTHONPATH=/tmp/dev-ctr/pyroot
echo "== pytest graph ($(left) s left)"
(cd "$REPO" && timeout 90 python3 -m pytest -q -x tests/python/test_torch.py tests/python/test_kvcache.py -k "graph" >"$OUT/pytest.log" 2>&1); echo "rc $?"; tail -2 "$OUT/pytest.log"
for d in 128 64; do
  echo "== d$d memset A/B ($(left) s left)"; [[ $(left) -gt 35 ]] || break
  timeout $(( $(left) - 5 )) python3 "$REPO/bench/gpu/dev/fwd_env_ab.py" --env FLASHATTN_SM90_COUNTER_MEMSET --values ,1 --hdims $d \
    --seqlens 512,1024,2048 --csv "$OUT/memset_d$d.csv" >"$OUT/memset_d$d.log" 2>&1; echo "rc $?"; grep -v -i warn "$OUT/memset_d$d.log" | tail -7
done
echo "done at $(( $(date +%s) - T0 )) s"
