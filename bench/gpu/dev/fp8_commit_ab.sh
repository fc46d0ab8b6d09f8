#!/usr/bin/env bash
# The FP8 forward of two trees on one card (#21). FP8 d128 16k ran at 888-893 TFLOP/s at d1e681d (session 13) and at
# 857-868 in the records since session 26, with the same main-loop instruction mix (journal, session 45), so only
# an A/B on one card says whether the drop is code or card.
# 1. Each tree gets its own development build: its sm90_bwd_loop.sh, d128 only, the Python package, no suites.
# 2. Each tree is timed in its own process: the FP8 d128 forward at 16k, without a mask and causal, and cuDNN's bf16
#    d128 16k forward as the card's anchor.
# 3. The trees alternate three times (A B A B A B), so that a drift of the clocks shows in both.
# 4. In its first round each tree also gives bench.fp8_rows' RMSE on the outlier recipe (fp8_rmse.csv).
# usage: bench/gpu/dev/fp8_commit_ab.sh OUTDIR OLD_TREE
#   OLD_TREE: an untracked folder of the checkout, so that the device call carries it, e.g.
#   `mkdir old && git archive d1e681d | tar -x -C old`. Its .whl is linked to the checkout's.
# FP8AB_OLD_TESTS: a gtest filter the old tree's build runs (default none: build only); fp8_patch_ab.sh sets it.
set -uo pipefail
OUT=$1; OLD=$(cd "$2" && pwd)
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
[[ -e $OLD/.whl ]] || ln -s "$REPO/.whl" "$OLD/.whl"
for t in old:"$OLD" cur:"$REPO"; do
  name=${t%%:*} tree=${t#*:}
  start=$(date +%s)
  filter=none
  [[ $name == old ]] && filter=${FP8AB_OLD_TESTS:-none}
  DEV_HDIMS=128 DEV_BWD_WORK=/tmp/fp8ab-$name DEV_BWD_SANITIZE=0 DEV_BWD_BENCH=0 \
    bash "$tree/bench/gpu/dev/sm90_bwd_loop.sh" "$OUT/$name" "$filter" >"$OUT/$name.log" 2>&1
  echo "$name: build rc $? in $(($(date +%s) - start)) s"
done
for round in 1 2 3; do
  for name in old cur; do
    PYTHONPATH=/tmp/fp8ab-$name/pyroot:$REPO/bench/gpu timeout 120 python3 - "$name" "$round" "$OUT/fp8_rmse.csv" \
      >>"$OUT/fp8_commit_ab.csv" <<'PYEOF'
# The harness's protocol (bench.py: triton do_bench medians, 50 ms warm-up, 200 ms of repeats) and FLOP convention
# (common.attn_flops).
import sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench
import common
import flashattn as fa

name, round_, rmse_csv = sys.argv[1], sys.argv[2], sys.argv[3]
if round_ == "1":
    # bench.fp8_rows' accuracy rows (the outlier recipe): tree,variant,RMSE into fp8_rmse.csv.
    import bench
    with open(rmse_csv, "a") as f:
        try:
            for variant, rmse in bench.fp8_outlier_rmse(fa, ("fp8_per_head", "fp8_hadamard")).items():
                f.write(f"{name},{variant},{rmse:.4e}\n")
        except Exception as e:  # noqa: BLE001 (the timing below still runs)
            f.write(f"{name},error,{type(e).__name__}: {str(e)[:80]}\n")
seqlen, batch, heads, d = 16384, 1, 16, 128
q, k, v = (torch.randn(batch, seqlen, heads, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
(q8, qd), (k8, kd), (v8, vd) = (fa.quantize_fp8(t) for t in (q, k, v))
for causal in (False, True):
    flops = common.attn_flops(batch, heads, seqlen, seqlen, d, causal, "fwd")
    t = do_bench(lambda: fa.flash_attn_func(q8, k8, v8, causal=causal, q_descale=qd, k_descale=kd, v_descale=vd),
                 warmup=50, rep=200, return_mode="median")
    print(f"{name},{round_},fp8,{int(causal)},{t:.4f},{flops / t / 1e9:.1f}", flush=True)
qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    t = do_bench(lambda: F.scaled_dot_product_attention(qt, kt, vt), warmup=50, rep=200, return_mode="median")
flops = common.attn_flops(batch, heads, seqlen, seqlen, d, False, "fwd")
print(f"{name},{round_},cudnn_bf16,0,{t:.4f},{flops / t / 1e9:.1f}", flush=True)
PYEOF
    echo "$name round $round rc $?"
  done
done
echo "RMSE on the outlier recipe (tree,variant,RMSE):"; cat "$OUT/fp8_rmse.csv" 2>/dev/null
# tree,round,kernel,causal,ms,TFLOP/s; the medians per tree and the ratio cur / old.
python3 - "$OUT/fp8_commit_ab.csv" <<'PYEOF'
import csv, statistics, sys
rows = list(csv.reader(open(sys.argv[1])))
keys = sorted({(r[2], r[3]) for r in rows})
for kernel, causal in keys:
    med = {n: statistics.median(float(r[5]) for r in rows if r[0] == n and (r[2], r[3]) == (kernel, causal))
           for n in ("old", "cur") if any(r[0] == n and (r[2], r[3]) == (kernel, causal) for r in rows)}
    line = "  ".join(f"{n} {v:.1f}" for n, v in med.items())
    ratio = f"  cur/old {med['cur'] / med['old']:.3f}" if len(med) == 2 else ""
    print(f"{kernel} causal {causal}: {line}{ratio} TFLOP/s")
PYEOF
