#!/usr/bin/env bash
# A quick FP8 tile experiment on the GPU machine: the d128-only development build (sm90_bwd_loop.sh with
# DEV_HDIMS=128, no sanitizers), the FP8 GPU suite's d128 cases, then the FP8 d128 rows of bench.py and the bf16 d128
# causal forward at 1k / 8k beside cuDNN (a check that the 16-bit kernels kept their speed).
# usage: bench/gpu/dev/fp8_quick.sh OUTDIR
set -uo pipefail
OUT=$1
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
export DEV_HDIMS=128 DEV_BWD_WORK=${DEV_BWD_WORK:-/tmp/dev-fp8q} DEV_BWD_SANITIZE=0 DEV_BWD_BENCH=0
bash "$REPO/bench/gpu/dev/sm90_bwd_loop.sh" "$OUT" 'Sm90/Fp8Forward.*d128*:Sm90/Fp8Forward.*long*:Sm90/Fp8Forward.*gqa*'
PY=$(command -v python3)
PYTHONPATH=$DEV_BWD_WORK/pyroot:$REPO/bench/gpu timeout 200 "$PY" - "$OUT/fp8_quick.csv" 2>&1 <<'PYEOF' | cut -c1-160
import sys
import torch
import torch.nn.functional as F
import bench, common
b = bench.Bench(sys.argv[1], warmup_ms=50, rep_ms=200)
ours = common.load_ours("cuda")
fa = ours.module
for causal in (0, 1):
    for seqlen in (2048, 16384):
        batch, heads, d = 16384 // seqlen, 16, 128
        base = dict(dtype="fp8", hdim=d, causal=causal, seqlen=seqlen, batch=batch, heads=heads)
        q, k, v = (torch.randn(batch, seqlen, heads, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        (q8, qd), (k8, kd), (v8, vd) = (fa.quantize_fp8(t) for t in (q, k, v))
        flops = common.attn_flops(batch, heads, seqlen, seqlen, d, bool(causal), "fwd")
        b.measure("fp8_fwd", "ours_fp8", lambda: fa.flash_attn_func(q8, k8, v8, causal=bool(causal), q_descale=qd,
                                                                    k_descale=kd, v_descale=vd), flops, base)
for seqlen in (1024, 8192):
    batch, heads, d = 16384 // seqlen, 16, 128
    base = dict(dtype="bf16", hdim=d, causal=1, seqlen=seqlen, batch=batch, heads=heads)
    q, k, v = (torch.randn(batch, seqlen, heads, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flops = common.attn_flops(batch, heads, seqlen, seqlen, d, True, "fwd")
    for rep in range(2):
        b.measure("fwd", "ours", lambda: fa.flash_attn_func(q, k, v, causal=True), flops, base)
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        with bench.sdpa_kernel(bench.PEERS["cudnn"]):
            b.measure("fwd", "cudnn", lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True), flops, base)
PYEOF
