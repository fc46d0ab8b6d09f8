"""Our backward beside FlashAttention-4's (PyPI flash-attn-4, CuTe DSL, sm90) and cuDNN's (torch SDPA), in one
process, bf16, the harness's shapes (16k tokens, model dim 2048). A shape is d<head dim><c: causal, n: not><seqlen>.

  timing (triton do_bench medians, every library on the same inputs, the libraries' order reversed for the second
  pass; TFLOP/s from 2.5 * 4 B H S^2 D, halved when causal):
    PYTHONPATH=<our package>:<FA4 site> python3 bench/gpu/dev/bwd_peers.py d128n4096 d128c4096 [--csv F]
  one warm backward per library and shape inside cudaProfilerStart/Stop (after an unprofiled one), for a profiler:
    ncu --profile-from-start off python3 bench/gpu/dev/bwd_peers.py --once d128c4096
  --profile: each library's kernels and their times per backward (torch.profiler).

FA4 is left out (with a note) where it does not import: bench/gpu/dev/fa4_parts.sh says how it gets onto the device."""
from __future__ import annotations

import argparse
import csv
import os
import re
import sys

import torch

import flashattn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # bench/gpu
import bench  # noqa: E402  (the record harness's closures of ours, the SDPA peers and FA4, and its FA4 import)
import common  # noqa: E402

if bench.fa4_func is None:
    print("# FA4 not available (flash_attn.cute does not import)", file=sys.stderr)


def shape(spec):
    hdim, causal, seqlen = re.fullmatch(r"d(\d+)([cn])(\d+)", spec).groups()
    hdim, seqlen = int(hdim), int(seqlen)
    return hdim, causal == "c", seqlen, 2048 // hdim, 16384 // seqlen


def backwards(spec):
    """name -> a callable that runs one backward (each library's forward runs once here), on shared inputs."""
    hdim, causal, seqlen, heads, batch = shape(spec)
    q, k, v = (torch.randn(batch, seqlen, heads, hdim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = {"ours": bench.ours_fns(flashattn, q, k, v, causal)[1]}
    if bench.fa4_func is not None:
        out["fa4"] = bench.fa4_fns(q, k, v, causal)[1]
    out["cudnn"] = bench.peer_fns(bench.PEERS["cudnn"], q, k, v, causal)[1]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("shapes", nargs="*", default=["d128n4096", "d128c4096"])
    ap.add_argument("--once", action="store_true", help="one profiled backward per library and shape; no timing")
    ap.add_argument("--profile", action="store_true", help="also each library's kernel times (torch.profiler)")
    ap.add_argument("--csv")
    a = ap.parse_args()
    rows = []
    for spec in a.shapes:
        fns = backwards(spec)
        if a.once:
            for name, fn in fns.items():
                fn()
                torch.cuda.synchronize()
                torch.cuda.profiler.start()
                fn()
                torch.cuda.synchronize()
                torch.cuda.profiler.stop()
                print(spec, name, "done", flush=True)
            continue
        from triton.testing import do_bench

        hdim, causal, seqlen, heads, batch = shape(spec)
        flops = 2.5 * 4 * batch * heads * seqlen * seqlen * hdim / (2 if causal else 1)
        for fn in fns.values():  # warm-up (FA4 compiles at its first call)
            fn()
        times = {name: [] for name in fns}
        for order in (list(fns), list(fns)[::-1]):
            for name in order:
                times[name].append(do_bench(fns[name], warmup=25, rep=100))
        row = {"shape": spec}
        for name, ts in times.items():
            row[name] = "/".join(f"{flops / t / 1e9:.1f}" for t in ts)
        rows.append(row)
        print("\t".join(f"{k}={v}" for k, v in row.items()), flush=True)
        if a.profile:
            for name, fn in fns.items():
                common.print_kernel_times(fn, f"{spec} {name}", reps=10)
        del fns
        torch.cuda.empty_cache()
    if a.csv and rows:
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter="\t")
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
