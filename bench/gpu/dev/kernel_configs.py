"""Each kernel's launch configuration and time, ours beside cuDNN (SDPA), from a torch.profiler trace: grid, block,
registers per thread, dynamic + static shared memory, the profiler's estimated occupancy, and the time per call.
What it answers: how a peer spreads a shape over the SMs (e.g. whether cuDNN's decode kernel fills all 132 SMs where
our split grid leaves some idle) and what its CTAs hold.

Shapes: the harness's decode shapes (one query token, GQA 32/8, d128, contiguous cache, `decode_splits.py`) and
forward shapes "d<D><c|n><seqlen>" (bf16, 16k tokens, heads 2048 / d, c: causal), e.g. d128n512 d64c1024.

    PYTHONPATH=<package root> python3 bench/gpu/dev/kernel_configs.py [--decode 1x65536,8x16384] [--fwd d128n512,...]
"""
import argparse
import json
import os
import re
import sys
import tempfile

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decode_splits  # noqa: E402


def configs(fn, reps=5):
    """The kernels of fn (after a warm-up call) as (name, grid, block, registers, shared bytes, occupancy %, us per
    call), from the chrome trace of `reps` calls."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    rows = {}
    for e in events:
        if e.get("cat") != "kernel":
            continue
        a = e.get("args", {})
        key = (e["name"], tuple(a.get("grid", ())), tuple(a.get("block", ())))
        # kineto's "shared memory": static + dynamic bytes of one CTA.
        r = rows.setdefault(key, [a.get("registers per thread"), a.get("shared memory"),
                                  a.get("est. achieved occupancy %"), 0.0])
        r[3] += float(e.get("dur", 0.0)) / reps
    return [(k[0], k[1], k[2], *v) for k, v in rows.items()]


def show(tag, fn):
    for name, grid, block, regs, smem, occ, us in configs(fn):
        print(f"{tag}\tgrid={'x'.join(map(str, grid))}\tblock={'x'.join(map(str, block))}\tregs={regs}\tsmem={smem}"
              f"\tocc={occ}\t{us:.1f} us\t{name[:90]}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--decode", default="1x65536,8x16384")
    ap.add_argument("--fwd", default="d128n512,d128c512,d64n512,d64c512")
    a = ap.parse_args()
    print(f"# {torch.cuda.get_device_name()}, {torch.cuda.get_device_properties(0).multi_processor_count} SMs")
    for shape in filter(None, a.decode.split(",")):
        batch, keys = (int(x) for x in shape.split("x"))
        _, q, kc, vc, cudnn = decode_splits.decode_case(batch, keys)
        lens = torch.full((batch,), keys, dtype=torch.int32, device="cuda")
        show(f"decode {shape} cudnn", cudnn)
        show(f"decode {shape} ours", lambda: flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens))
    for shape in filter(None, a.fwd.split(",")):
        m = re.fullmatch(r"d(\d+)([cn])(\d+)", shape)
        d, causal, s = int(m.group(1)), m.group(2) == "c", int(m.group(3))
        b, h = 16384 // s, 2048 // d
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        show(f"fwd {shape} cudnn", cudnn)
        show(f"fwd {shape} ours", lambda: flashattn.flash_attn_func(q, k, v, causal=causal))


if __name__ == "__main__":
    main()
