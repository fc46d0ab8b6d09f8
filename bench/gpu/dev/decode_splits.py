"""Split-KV counts for decode: the harness's decode shapes (one query token, GQA 32/8, d128, bf16, contiguous cache,
bench.py's decode_rows) through flash_attn_with_kvcache with num_splits = 0 (the plan's pick) and a sweep of counts,
beside cuDNN (SDPA) in the same process, TB/s of K+V (triton's do_bench, median). Prints one row per (shape, splits):
what the plan's choice leaves against the best count.

    PYTHONPATH=<package root> python3 bench/gpu/dev/decode_splits.py [--splits 0,1,2,...] [--csv FILE]
                                      [--env NAME --values a,b]

--env/--values: each count is also timed under each value of an environment switch that an ablation build reads at
every call (e.g. FLASHATTN_SM90_MECHANISMS=no_idle_skip; an empty value: the default kernel), in the given order and
then reversed, so that two kernels compare in one process.
--cudnn-bshd: cuDNN also on the caches' own (B, keys, H, D) layout (strided views, the layout we read), as the row
"cudnn_bshd", to separate what the head-major copies give cuDNN from what its kernel does.
--ours-head-major: ours also on head-major copies of the caches, viewed as (B, keys, H, D) (rows 256 bytes apart
instead of 2 KB), as the row "ours_hm": what the caches' layout costs our TMA loads.
--profile: each kernel's CUDA time per call of ours (the plan's count, or the first of --splits; with --env, under
each value) and of cuDNN (torch.profiler), printed as "# profile" lines beside the call's do_bench time: the rest is
launch gaps.
DEV_DECODE_D (environment, default 128): the head dim of q and the caches (paged_decode.py reads it too).
"""
import argparse
import csv
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import flashattn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import common  # noqa: E402

SHAPES = ((1, 65536), (8, 16384), (32, 8192), (128, 4096), (64, 32768))
HQ, HKV = 32, 8
D = int(os.environ.get("DEV_DECODE_D", "128"))  # the head dim (DEV_DECODE_D=64: the d64 decode tiles)


def cudnn_decode(q, kc, vc, head_major=True):
    """cuDNN's SDPA on q and the (B, keys, H, D) caches: on head-major copies of them (the layout it reads fastest)
    or, head_major=False, on transposed views of the caches themselves."""
    qt, kt, vt = q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2)
    if head_major:
        kt, vt = kt.contiguous(), vt.contiguous()

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
    return cudnn


def decode_case(batch, keys):
    """One decode shape: the K+V bytes, q (B, 1, Hq, D) and the caches (B, keys, Hkv, D) in bf16, and cuDNN's
    SDPA on head-major copies of the caches."""
    nbytes = 2 * batch * keys * HKV * D * 2
    q = torch.randn(batch, 1, HQ, D, device="cuda", dtype=torch.bfloat16)
    kc = torch.randn(batch, keys, HKV, D, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    return nbytes, q, kc, vc, cudnn_decode(q, kc, vc)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--splits", default="0,1,2,3,4,6,8,11,12,16,17,22,24,32,33,44,48,64,66")
    ap.add_argument("--csv", default="")
    ap.add_argument("--env", default="")
    ap.add_argument("--values", default="", help="with --env: comma-separated; an empty item sets it to ''")
    ap.add_argument("--cudnn-bshd", action="store_true")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--ours-head-major", action="store_true")
    a = ap.parse_args()
    splits = [int(s) for s in a.splits.split(",")]
    values = a.values.split(",") if a.env else [None]
    order = values + values[::-1] if a.env else values
    rows = []
    print("batch\tkeys\tbackend\tsplits\tus\tTB/s\tvs_cudnn", flush=True)
    for batch, keys in SHAPES:
        nbytes, q, kc, vc, cudnn = decode_case(batch, keys)
        ref = cudnn().transpose(1, 2).float()
        base = do_bench(cudnn, warmup=25, rep=200, return_mode="median")
        rows.append((batch, keys, "cudnn", "", base * 1e3, nbytes / base / 1e9, 1.0))
        print(f"{batch}\t{keys}\tcudnn\t\t{base * 1e3:.1f}\t{nbytes / base / 1e9:.2f}\t1.00", flush=True)
        if a.profile:
            common.print_kernel_times(cudnn, f"{batch}x{keys} cudnn", base * 1e3)

        def measure(name, count, fn, heads_first=False):
            """One row beside cuDNN: fn's largest difference to cuDNN's output (NaN if not finite; heads_first: fn
            returns (B, H, 1, D) as SDPA does) and its time."""
            out = fn().float()
            if heads_first:
                out = out.transpose(1, 2)
            err = (out - ref).abs().max().item() if bool(torch.isfinite(out).all()) else float("nan")
            ms = do_bench(fn, warmup=25, rep=200, return_mode="median")
            rows.append((batch, keys, name, count, ms * 1e3, nbytes / ms / 1e9, base / ms))
            print(f"{batch}\t{keys}\t{name}\t{count}\t{ms * 1e3:.1f}\t{nbytes / ms / 1e9:.2f}\t{base / ms:.3f}"
                  f"\t{'' if err < 1e-2 else f'maxdiff {err:.2e}'}", flush=True)
            return ms

        if a.cudnn_bshd:
            measure("cudnn_bshd", "", cudnn_decode(q, kc, vc, head_major=False), heads_first=True)
        lens = torch.full((batch,), keys, dtype=torch.int32, device="cuda")
        for s in splits:
            def ours():
                return flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, num_splits=s)
            for val in order:
                if a.env:
                    os.environ[a.env] = val
                ms = measure("ours" if val is None else f"ours:{val or 'default'}", s, ours)
            if a.profile and s == splits[0]:
                for val in values:  # with --env: each value's kernels (ms is the last timing's)
                    if a.env:
                        os.environ[a.env] = val
                    label = "" if val is None else f" {a.env}={val}"
                    common.print_kernel_times(ours, f"{batch}x{keys} ours splits={s}{label}", ms * 1e3)
            if a.env:
                os.environ.pop(a.env)
            if a.ours_head_major:
                kh, vh = (c.transpose(1, 2).contiguous().transpose(1, 2) for c in (kc, vc))
                measure("ours_hm", s, lambda: flashattn.flash_attn_with_kvcache(q, kh, vh, cache_seqlens=lens,
                                                                                num_splits=s))
                kh = vh = None
        q = kc = vc = None
        torch.cuda.empty_cache()
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["batch", "keys", "backend", "splits", "us", "TBps", "vs_cudnn"])
            w.writerows(rows)


if __name__ == "__main__":
    main()
