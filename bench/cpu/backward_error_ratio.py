"""The CPU fp32 backward's error against tests/python/test_torch.py's tolerance (2x the plain fp32 implementation's
error vs float64, plus one storage ulp), as a ratio, worst over seeds: an accuracy A/B for kernel changes, where
the test itself draws one input per case. usage: python bench/cpu/backward_error_ratio.py [SEEDS]"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "python"))
import test_torch as T  # noqa: E402

from flashattn import flash_attn_func  # noqa: E402


def ratios(seed, shape, mask):
    """err / tolerance of out, dq, dk, dv for one draw (inputs and ALiBi slopes from `seed`)."""
    b, sq, sk, hq, hkv, d = shape
    q = T.make((b, sq, hq, d), torch.float32, "cpu", 4 * seed + 1)
    k = T.make((b, sk, hkv, d), torch.float32, "cpu", 4 * seed + 2)
    v = T.make((b, sk, hkv, d), torch.float32, "cpu", 4 * seed + 3)
    dout = T.make((b, sq, hq, d), torch.float32, "cpu", 4 * seed + 4, requires_grad=False)
    mask = dict(mask)
    alibi = None
    if mask.pop("alibi", False):
        alibi = torch.rand(hq, generator=torch.Generator().manual_seed(seed), dtype=torch.float32) * 0.5 + 0.1
    out = flash_attn_func(q, k, v, alibi_slopes=alibi, **mask)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref_kw = dict(causal=mask.get("causal", False), top_left=mask.get("causal_alignment") == "top_left",
                  window=mask.get("window_size", (-1, -1)), softcap=mask.get("softcap", 0.0), alibi=alibi)
    res = {}
    for label, dt in (("exact", torch.float64), ("plain", torch.float32)):
        o, _ = T.math_attention(q, k, v, dtype=dt, **ref_kw)
        res[label] = (o,) + torch.autograd.grad(o, (q, k, v), dout.to(dt))
    r = []
    for i, got in enumerate((out,) + grads):
        ex, pl = res["exact"][i], res["plain"][i]
        tol = 2 * T.max_err(pl, ex) + T.STORAGE_EPS[torch.float32] * max(1.0, ex.detach().abs().max().item())
        r.append(T.max_err(got, ex) / tol)
    return r


def main():
    seeds = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    torch.set_num_threads(1)
    for name in ("all", "softcap", "alibi"):
        worst = [0.0] * 4
        for seed in range(seeds):
            for shape in T.SHAPES:
                worst = [max(a, b) for a, b in zip(worst, ratios(seed, shape, T.MASKS[name]))]
        print(f"{name}: worst err/tolerance over {seeds} seeds x {len(T.SHAPES)} shapes: out dq dk dv =",
              " ".join(f"{w:.3f}" for w in worst), flush=True)


if __name__ == "__main__":
    main()
