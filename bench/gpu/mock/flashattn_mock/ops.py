"""The mock's flashattn.ops.forward (run.sh --mock): the plain torch implementation written into the caller's
out/lse, whatever backend is asked for, so that bench.py's ours_sm80 and --ablations paths run end to end.
No ops.backward: check.py's NaN-buffer path stays off for the mock, as before."""
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import common  # noqa: E402

_BACKENDS = ("auto", "cpu", "cuda-sm80", "cuda-sm90")


def backend_name(q, backend="auto") -> str:
    if backend not in _BACKENDS:
        raise ValueError(f"backend: must be one of {sorted(_BACKENDS)} (got {backend!r})")
    return "mock"


def forward(q, k, v, *, out=None, lse=None, return_lse=True, softmax_scale=None, causal=False,
            window_size=(-1, -1), softcap=0.0, alibi_slopes=None, backend="auto", stream=0, **unused):
    backend_name(q, backend)
    if unused.get("cu_seqlens_q") is not None or unused.get("dropout_p"):
        raise NotImplementedError("mock ops.forward: varlen and dropout are not implemented")
    scale = softmax_scale or 1.0 / math.sqrt(q.shape[-1])
    mask = common.Mask(causal=causal, window=tuple(window_size), softcap=softcap)
    o, l = common.attention(q, k, v, mask, scale, alibi_slopes, exact=False)
    out = o.contiguous() if out is None else out.copy_(o)
    if lse is not None:
        lse.copy_(l)
    elif return_lse:
        lse = l
    return (out, lse) if return_lse else out
