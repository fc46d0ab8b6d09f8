"""One decode call of ours and one of cuDNN per shape, for a profiler (`ncu -k regex:'fwd_kernel|flash_fprop|combine|
reduction' python3 decode_once.py 1x65536 32x8192`): decode_splits.py's case (one query token, GQA 32/8, d128,
bf16, contiguous cache, the plan's split count), each call made twice (the second one warm). A shape is
<batch>x<keys>."""

from __future__ import annotations

import os
import sys

import torch

import flashattn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_splits import decode_case  # noqa: E402


def main():
    for spec in sys.argv[1:] or ["1x65536"]:
        batch, keys = (int(x) for x in spec.split("x"))
        _, q, kc, vc, cudnn = decode_case(batch, keys)
        lens = torch.full((batch,), keys, dtype=torch.int32, device="cuda")
        for _ in range(2):
            flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, num_splits=0)
            cudnn()
        torch.cuda.synchronize()
        print(spec, "done", flush=True)


if __name__ == "__main__":
    main()
