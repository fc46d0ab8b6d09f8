"""Dropout development table: ours (AUTO) with and without dropout_p = 0.1, forward and backward, bf16, one sequence
of 8k tokens at model dim 2048 (issue #18's shape at d128; d64 and d256 beside it), causal and not, cuDNN's times
on the same inputs for scale. Not the record (bench.py --features=dropout is): a quick read of one kernel change."""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bench  # noqa: E402
import common  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--csv", required=True)
    ap.add_argument("--hdims", default="64,128,256")
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--p", type=float, default=0.1)
    ap.add_argument("--mechanisms", default="",
                    help="comma-separated FLASHATTN_SM90_MECHANISMS values (an ablation build's dropout variants, "
                         "e.g. dropout_draw_at_top): the dropout forward once more under each, as ours_dropout_<value>")
    a = ap.parse_args()
    ours = common.load_ours(bench.DEV)
    print("# " + common.describe_ours(ours), flush=True)
    fa = ours.module
    b = bench.Bench(a.csv, warmup_ms=25, rep_ms=100)
    s = a.seqlen
    for hdim in map(int, a.hdims.split(",")):
        h = bench.MODEL_DIM // hdim
        for causal in (False, True):
            base = dict(dtype="bf16", hdim=hdim, causal=int(causal), seqlen=s, batch=1, heads=h)
            q, k, v = (torch.randn(1, s, h, hdim, device=bench.DEV, dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            flops = common.attn_flops(1, h, s, s, hdim, causal, "fwd")
            qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
            with bench.sdpa_kernel(bench.PEERS["cudnn"]):
                b.measure("fwd", "cudnn", lambda: bench.F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal),
                          flops, base)
                o_ref = bench.F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
            do = torch.randn(1, s, h, hdim, device=bench.DEV, dtype=torch.bfloat16)
            do_t = do.transpose(1, 2)
            b.measure("bwd", "cudnn", lambda: torch.autograd.grad(o_ref, (qt, kt, vt), do_t, retain_graph=True),
                      2.5 * flops, base)
            for name, extra in (("ours", {}), ("ours_dropout", {"dropout_p": a.p})):
                b.measure("fwd", name, lambda: fa.flash_attn_func(q, k, v, causal=causal, **extra), flops, base)
                for mech in filter(None, a.mechanisms.split(",") if extra else ()):
                    os.environ["FLASHATTN_SM90_MECHANISMS"] = mech
                    try:
                        b.measure("fwd", f"{name}_{mech}", lambda: fa.flash_attn_func(q, k, v, causal=causal, **extra),
                                  flops, base)
                    finally:
                        os.environ.pop("FLASHATTN_SM90_MECHANISMS", None)
                o = fa.flash_attn_func(q, k, v, causal=causal, **extra)
                b.measure("bwd", name, lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True), 2.5 * flops,
                          base)
            q = k = v = qt = kt = vt = o = o_ref = do = do_t = None  # noqa: F841
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
