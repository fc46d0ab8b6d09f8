#!/usr/bin/env bash
# Session 33, device call 5: the dynamic schedule's tile counter kept at zero per stream (no memset per causal call)
# and its claims made a tile ahead by producer warp 1. Ablation build, d64/d128 (FLASHATTN_SM90_COUNTER_MEMSET=1
# restores the memset; late_claim / late_claim_d64 the claims by warp 0 after a tile's loads): the counter test, the
# sm90 forward cases of the dynamic schedule (also on late_claim), the graph-capture pytest cases, memcheck and
# racecheck, then the claim and memset A/Bs beside cuDNN. usage: bench/results/2026-12-06_h100_session33/call_counter.sh OUT
set -uo pipefail
OUT=$1; mkdir -p "$OUT"; T0=$(date +%s); left() { echo $(( ${CALL_BUDGET:-480} - ($(date +%s) - T0) )); }
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
export DEV_BWD_WORK=/tmp/dev-ctr DEV_HDIMS="64;128" DEV_BWD_BENCH=0 DEV_GTEST_S=90
export DEV_SAN_FILTER='Sm90TileCounter.*:Sanitizer/Forward.*sm90*causal*' DEV_SAN_S=45
export DEV_CMAKE_ARGS="-DFLASHATTN_SM90_ABLATIONS=ON -DFLASHATTN_SM90_ABLATION_VARIANTS=late_claim;late_claim_d64 -DCMAKE_CUDA_FLAGS=-Xptxas=-v"
bash "$REPO/bench/gpu/dev/sm90_bwd_loop.sh" "$OUT" \
  'Sm90TileCounter.*:Sm90/Forward.*causal*:Sm90/Forward.*window*:Sm90/Forward.*split*:Sm90/Forward.*packed*:Sm90/Forward.*varlen*:Paged*:-*fp16*' || exit 1
BIN=$(find /tmp/dev-ctr/build -name flashattn_gpu_tests -type f | head -1)
echo "== gtest on late_claim ($(left) s left)"
FLASHATTN_SM90_MECHANISMS=late_claim FLASHATTN_REQUIRE_SM90=1 timeout 40 "$BIN" \
  --gtest_filter='Sm90TileCounter.*:Sm90/Forward.*causal*:-*fp16*' >"$OUT/gtest_late_claim.log" 2>&1
echo "rc $?"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]" "$OUT/gtest_late_claim.log" | head -5
export PYTHONPATH=/tmp/dev-ctr/pyroot
echo "== pytest graph ($(left) s left)"
(cd "$REPO" && timeout 60 python3 -m pytest -q -x tests/python/test_torch.py tests/python/test_kvcache.py -k "graph" >"$OUT/pytest.log" 2>&1); echo "rc $?"; tail -2 "$OUT/pytest.log"
ab() {  # env values hdim seqlens tag
  echo "== $5 ($(left) s left)"; [[ $(left) -gt 35 ]] || return
  timeout $(( $(left) - 5 )) python3 "$REPO/bench/gpu/dev/fwd_env_ab.py" --env "$1" --values "$2" --hdims "$3" --seqlens "$4" \
    --csv "$OUT/$5.csv" >"$OUT/$5.log" 2>&1; echo "rc $?"; grep -v -i warn "$OUT/$5.log" | tail -9
}
ab FLASHATTN_SM90_MECHANISMS ,late_claim 128 512,1024,2048,8192 claim_d128
ab FLASHATTN_SM90_COUNTER_MEMSET ,1 128 512,1024,2048 memset_d128
ab FLASHATTN_SM90_MECHANISMS ,late_claim_d64 64 512,1024,2048 claim_d64
echo "done at $(( $(date +%s) - T0 )) s"
