"""One backward of ours per shape (for a profiler: `ncu -k regex:bwd_kernel python3 bwd_once.py d128c4096 ...`).
A shape is d<head dim><c: causal, n: not><seqlen>, at the harness's 16k tokens and model dim 2048, bf16."""
from __future__ import annotations

import re
import sys

import torch

import flashattn


def main():
    for spec in sys.argv[1:] or ["d128c4096"]:
        hdim, causal, seqlen = re.fullmatch(r"d(\d+)([cn])(\d+)", spec).groups()
        hdim, seqlen = int(hdim), int(seqlen)
        heads, batch = 2048 // hdim, 16384 // seqlen
        q, k, v, do = (torch.randn(batch, seqlen, heads, hdim, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        o = flashattn.flash_attn_func(q, k, v, causal=causal == "c")
        torch.autograd.grad(o, (q, k, v), do)
        torch.cuda.synchronize()
        print(spec, "done", flush=True)


if __name__ == "__main__":
    main()
