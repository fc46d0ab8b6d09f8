"""One forward variant against another in one process, through an environment switch that an ablation build reads at
every call (e.g. FLASHATTN_SM90_MECHANISMS=late_q_release: bf16 d128 takes that ablation kernel; "" the default one),
cuDNN (SDPA) beside them. bf16, batch * seqlen = 16k tokens, heads = 2048 / d, triton do_bench medians; FLOPs
4 B H S^2 D, halved when causal. Each value is timed twice, in the order given and reversed. --fp8: ours takes
float8_e4m3fn q/k/v (flashattn.quantize_fp8 of the same bf16 values, per-(batch, head) factors); cuDNN stays bf16.
--bwd: the backward instead (dQ, dK, dV of one forward through autograd, 2.5 times the forward's FLOPs; maxdiff over
the three gradients against cuDNN's), e.g. FLASHATTN_SM90_DQ_ZEROED.

    PYTHONPATH=<package root> python3 bench/gpu/dev/fwd_env_ab.py --env NAME --values a,b [--hdims 128]
                                      [--seqlens 512,...] [--fp8 | --bwd] [--csv F]
"""
import argparse
import csv
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import flashattn


def backward_of(forward, inputs, dout):
    """A function returning the gradients of the inputs for dout, through one forward's graph (run once here)."""
    out = forward()
    return lambda: torch.autograd.grad(out, inputs, dout, retain_graph=True)


def measure(d, causal, s, env, values, both_orders=True, fp8=False, bwd=False):
    """One shape (bf16, 16k tokens, heads 2048 / d): cuDNN's TFLOP/s, each value's TFLOP/s (a list: the given order,
    then with both_orders the reversed one) and the largest |ours - cuDNN| over every run ("NONFINITE" appended if any
    output was not finite)."""
    b, h = 16384 // s, 2048 // d
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=bwd) for _ in range(3))
    flops = 4 * b * h * s * s * d / (2 if causal else 1) * (2.5 if bwd else 1)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

    if bwd:
        dout = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
        cudnn_bwd = backward_of(lambda: cudnn().transpose(1, 2), (q, k, v), dout)
        ref = torch.cat([g.float().flatten() for g in cudnn_bwd()])
        cudnn_tf = flops / do_bench(cudnn_bwd, warmup=50, rep=200, return_mode="median") / 1e9
    else:
        ref = cudnn().transpose(1, 2).float()
        cudnn_tf = flops / do_bench(cudnn, warmup=50, rep=200, return_mode="median") / 1e9
    runs = {val: [] for val in values}
    diff, finite = 0.0, True
    if fp8:
        (q8, qd), (k8, kd), (v8, vd) = (flashattn.quantize_fp8(t) for t in (q, k, v))

        def fn():
            return flashattn.flash_attn_func(q8, k8, v8, causal=causal, q_descale=qd, k_descale=kd, v_descale=vd)
    elif bwd:
        fn = backward_of(lambda: flashattn.flash_attn_func(q, k, v, causal=causal), (q, k, v), dout)
    else:
        def fn():
            return flashattn.flash_attn_func(q, k, v, causal=causal)
    for val in list(values) + (list(values)[::-1] if both_orders else []):
        os.environ[env] = val
        out = torch.cat([g.float().flatten() for g in fn()]) if bwd else fn().float()
        diff = max(diff, float((out - ref).abs().max()))
        finite = finite and bool(torch.isfinite(out).all())
        runs[val].append(flops / do_bench(fn, warmup=50, rep=200, return_mode="median") / 1e9)
    os.environ.pop(env)
    return cudnn_tf, runs, f"{diff:.2e}" + ("" if finite else " NONFINITE")


def write_csv(path, rows):
    """rows (dicts with the same keys) as a CSV file at path; nothing without a path or rows."""
    if path and rows:
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--env", required=True)
    ap.add_argument("--values", required=True, help="comma-separated; an empty item sets the variable to ''")
    ap.add_argument("--hdims", default="128")
    ap.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--fp8", action="store_true", help="ours on float8_e4m3fn inputs")
    ap.add_argument("--bwd", action="store_true", help="the backward (dQ, dK, dV) instead of the forward")
    ap.add_argument("--csv", default="")
    a = ap.parse_args()
    values = a.values.split(",")
    rows = []
    print("hdim\tcausal\tseqlen\tbatch\theads\tcudnn\t" + "\t".join(f"{a.env}={v or '<empty>'}" for v in values)
          + "\tmaxdiff")
    for d in (int(x) for x in a.hdims.split(",")):
        for causal in (False, True):
            for s in (int(x) for x in a.seqlens.split(",")):
                cudnn_tf, runs, diff = measure(d, causal, s, a.env, values, fp8=a.fp8, bwd=a.bwd)
                row = dict(hdim=d, causal=int(causal), seqlen=s, batch=16384 // s, heads=2048 // d,
                           cudnn=f"{cudnn_tf:.1f}")
                for val in values:
                    row[val or "<empty>"] = "/".join(f"{t:.1f}" for t in runs[val])
                row["maxdiff"] = diff
                rows.append(row)
                print("\t".join(str(x) for x in row.values()), flush=True)
    write_csv(a.csv, rows)


if __name__ == "__main__":
    main()
