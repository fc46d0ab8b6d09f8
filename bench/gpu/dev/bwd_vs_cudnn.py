"""Backward development table: ours (AUTO) against cuDNN on the H200, bf16/fp16, the harness's shapes
(16k tokens, model dim 2048) for the head dims the sm90 backward takes, with the gradients' agreement with
cuDNN's on the timed inputs. Not the record (bench.py is): a quick read of one kernel change."""
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
    ap.add_argument("--hdims", default="64,128")
    ap.add_argument("--seqlens", default="1024,4096,16384")
    ap.add_argument("--dtypes", default="bf16")
    ap.add_argument("--profile", action="store_true",
                    help="also print the CUDA time of each kernel of our backward and of cuDNN's (torch.profiler, "
                         "10 calls)")
    a = ap.parse_args()
    ours = common.load_ours(bench.DEV)
    print("# " + common.describe_ours(ours), flush=True)
    b = bench.Bench(a.csv, warmup_ms=25, rep_ms=100)
    for dt in a.dtypes.split(","):
        for hdim in map(int, a.hdims.split(",")):
            for causal in (False, True):
                for seqlen in map(int, a.seqlens.split(",")):
                    heads, batch = bench.MODEL_DIM // hdim, bench.TOKENS // seqlen
                    q = torch.randn(batch, seqlen, heads, hdim, device=bench.DEV, dtype=common.DTYPES[dt])
                    k, v = torch.randn_like(q), torch.randn_like(q)
                    flops = 2.5 * common.attn_flops(batch, heads, seqlen, seqlen, hdim, causal, "fwd")
                    base = dict(dtype=dt, hdim=hdim, causal=int(causal), seqlen=seqlen, batch=batch, heads=heads)
                    do = torch.randn_like(q)
                    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
                    qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
                    with bench.sdpa_kernel(bench.PEERS["cudnn"]):
                        o_ref = bench.F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                    do_t = do.transpose(1, 2)
                    peer = lambda: torch.autograd.grad(o_ref, (qt, kt, vt), do_t, retain_graph=True)  # noqa: E731
                    ref = b.measure("bwd", "cudnn", peer, flops, base)
                    o = ours.module.flash_attn_func(qg, kg, vg, causal=causal)
                    mine = lambda: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)  # noqa: E731

                    def agree(got, ref=ref):
                        if ref is None:
                            return ""
                        # cuDNN's grads are (B, H, S, D) views; ours (B, S, H, D). Relative to cuDNN's largest.
                        rel = [float((g.float() - r.transpose(1, 2).float()).abs().max() / r.float().abs().max())
                               for g, r in zip(got, ref)]
                        fin = all(bool(torch.isfinite(g).all()) for g in got)
                        note = "reldiff_vs_cudnn dq/dk/dv=" + "/".join(f"{d:.1e}" for d in rel)
                        return note + ("" if fin else " NONFINITE")

                    b.measure("bwd", "ours", mine, flops, base, agree)
                    if a.profile:  # the preprocess, main and postprocess kernels of one backward
                        tag = " ".join(f"{k}={v}" for k, v in base.items())
                        common.print_kernel_times(mine, tag, reps=10)
                        common.print_kernel_times(peer, tag + " backend=cudnn", reps=10)
                    del q, k, v, peer, mine
                    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
