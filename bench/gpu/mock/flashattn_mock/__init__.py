"""A stand-in for `flashattn` for testing the harness itself (run.sh --mock, which puts bench/gpu/mock on
PYTHONPATH and sets FLASHATTN_BENCH_PACKAGE=flashattn_mock; its own name keeps it from shadowing the real
package): flash_attn 2.x's two entry points
computed by the harness's own plain low-precision torch implementation (common.attention). It passes the
correctness rule by construction (its error is the plain implementation's), so a run with it shows that
every step of the harness works end to end; its numbers say nothing about our kernels. Never installed.
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import common  # noqa: E402

__version__ = "mock (harness self-test: torch plain implementation, not our kernels)"


def _check(q, k, v, alibi_slopes):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in (torch.float16, torch.bfloat16):
            raise TypeError(f"{name}: dtype must be float16 or bfloat16, got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name}: must be on {q.device}, got {t.device}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"k: head dim {k.shape[-1]} must equal q's {q.shape[-1]}")
    if q.shape[-2] % k.shape[-2]:
        raise ValueError(f"k: heads {k.shape[-2]} must divide q's heads {q.shape[-2]}")


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    _check(q, k, v, alibi_slopes)
    if dropout_p:
        raise NotImplementedError("dropout_p: dropout is not implemented")
    scale = softmax_scale or 1.0 / math.sqrt(q.shape[-1])
    mask = common.Mask(causal=causal, window=tuple(window_size), softcap=softcap)
    out, lse = common.attention(q, k, v, mask, scale, alibi_slopes, exact=False)
    out = out.contiguous()
    return (out, lse, None) if return_attn_probs else out


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False):
    _check(q, k, v, alibi_slopes)
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    outs, lses = [], []
    for b in range(len(cq) - 1):
        sl = alibi_slopes[b] if alibi_slopes is not None and alibi_slopes.dim() == 2 else alibi_slopes
        o, l, _ = flash_attn_func(q[None, cq[b]:cq[b + 1]], k[None, ck[b]:ck[b + 1]], v[None, ck[b]:ck[b + 1]],
                                  dropout_p, softmax_scale, causal, window_size, softcap, sl, deterministic, True)
        outs.append(o[0])
        lses.append(l[0])
    out, lse = torch.cat(outs, 0), torch.cat(lses, 1)
    return (out, lse, None) if return_attn_probs else out

from . import ops  # noqa: E402,F401  (flashattn.ops.forward for bench.py's ours_sm80 and --ablations rows)
