"""One forward of ours and one of cuDNN (SDPA) per shape, each made twice (the second is warm), for a profiler:
`ncu -k regex:'fwd_kernel|flash_fprop' python3 fwd_once.py d128c4096 ...`. A shape is d<head dim><c: causal,
n: not><seqlen>, at the harness's 16k tokens and model dim 2048, bf16."""

from __future__ import annotations

import re
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn


def main():
    for spec in sys.argv[1:] or ["d128c4096"]:
        hdim, causal, seqlen = re.fullmatch(r"d(\d+)([cn])(\d+)", spec).groups()
        hdim, seqlen, causal = int(hdim), int(seqlen), causal == "c"
        heads, batch = 2048 // hdim, 16384 // seqlen
        q, k, v = (torch.randn(batch, seqlen, heads, hdim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for _ in range(2):
            flashattn.flash_attn_func(q, k, v, causal=causal)
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            for _ in range(2):
                F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        torch.cuda.synchronize()
        print(spec, "done", flush=True)


if __name__ == "__main__":
    main()
