"""Low-level, torch-free entry points: fa_forward / fa_backward on any DLPack arrays.

Works with numpy (CPU backend), and with cupy, jax or torch arrays on CUDA (pass ``stream``).
Outputs are allocated here only for numpy inputs; for other array libraries pass ``out``/``lse``
(and ``dq``/``dk``/``dv``) yourself. Layouts and semantics are those of ``flashattn.h``:

* batched: q (B, Sq, Hq, D), k (B, Sk, Hkv, D), v (B, Sk, Hkv, Dv), out (B, Sq, Hq, Dv), lse (B, Hq, Sq)
* varlen:  q (Tq, Hq, D), k (Tk, Hkv, D), v (Tk, Hkv, Dv), out (Tq, Hq, Dv), lse (Hq, Tq), with int32
  cu_seqlens_q / cu_seqlens_k of B + 1 prefix sums.

Errors raise ValueError (an argument broke a rule; the message names it), NotImplementedError (valid
but not built, e.g. dropout) or RuntimeError (the device runtime failed).
"""

from __future__ import annotations

import sys

from . import _C

ALIGN_BOTTOM_RIGHT = int(_C.ALIGN_BOTTOM_RIGHT)
ALIGN_TOP_LEFT = int(_C.ALIGN_TOP_LEFT)

_ALIGNMENTS = {"bottom_right": ALIGN_BOTTOM_RIGHT, "top_left": ALIGN_TOP_LEFT}
_BACKENDS = {
    "auto": int(_C.BACKEND_AUTO),
    "cpu": int(_C.BACKEND_CPU),
    "cuda-sm80": int(_C.BACKEND_CUDA_SM80),
    "cuda-sm90": int(_C.BACKEND_CUDA_SM90),
}

__all__ = [
    "forward",
    "backward",
    "quantize_fp8",
    "merge_partials",
    "causal_alignment_code",
    "backend_code",
    "backend_name",
    "cuda_available",
    "built_with_cuda",
    "ALIGN_BOTTOM_RIGHT",
    "ALIGN_TOP_LEFT",
]

built_with_cuda = bool(_C.built_with_cuda)
cuda_available = _C.cuda_available


def causal_alignment_code(causal_alignment) -> int:
    """'bottom_right' (flash_attn >= 2.1, the default) or 'top_left' (flash_attn < 2.1, torch's tril)."""
    if isinstance(causal_alignment, str):
        key = causal_alignment.lower().replace("-", "_")
        if key in _ALIGNMENTS:
            return _ALIGNMENTS[key]
    raise ValueError(
        f"causal_alignment: must be 'bottom_right' or 'top_left' (got {causal_alignment!r})"
    )


def backend_code(backend) -> int:
    if isinstance(backend, str) and backend in _BACKENDS:
        return _BACKENDS[backend]
    raise ValueError(f"backend: must be one of {sorted(_BACKENDS)} (got {backend!r})")


def backend_name(q, backend="auto") -> str:
    """The backend a call with ``q`` would run: 'cpu', 'cuda-sm80', 'cuda-sm90' (or 'none')."""
    return _C.backend_name(q, backend_code(backend))


def _in_range(name, value, lo, hi):
    """value, with the argument's rule where it lies outside [lo, hi] (nanobind would say only "incompatible
    function arguments")."""
    if not lo <= value <= hi:
        raise ValueError(f"{name}: must be in [{lo}, {hi}] (got {value})")
    return value


def window_pair(window_size):
    """(left, right) from flash_attn's window_size; -1 is an unbounded side. Out-of-range sides get the argument's
    rule here, not nanobind's bare "incompatible function arguments" (the core then checks them against -1)."""
    # No try/except: torch.compile traces this on every call of the flash_attn functions.
    if (isinstance(window_size, (tuple, list)) and len(window_size) == 2 and
            not any(w is None or isinstance(w, (str, bytes)) for w in window_size)):
        return (_in_range("window_size", int(window_size[0]), -(2**63), 2**63 - 1),
                _in_range("window_size", int(window_size[1]), -(2**63), 2**63 - 1))
    raise ValueError(f"window_size: must be a pair (left, right) of ints, -1 = unbounded (got {window_size!r})")


def _export(a):
    """torch tensors as DLPack capsules from torch's C exporter (nanobind would call Tensor.__dlpack__, Python
    code that costs several microseconds per tensor on every call); other arrays as they are. torch is not
    imported here: a torch tensor implies it is loaded."""
    if a is not None and type(a).__module__.startswith("torch"):
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(a, torch.Tensor):
            return torch.utils.dlpack.to_dlpack(a.detach())
    return a


def _fp8_storage(a):
    """(array, True) for a torch.float8_e4m3fn tensor: viewed as uint8, since torch's DLPack exporter has no float8
    code; flashattn.h reads those bytes as e4m3 when told. Other arrays: (a, False)."""
    if a is not None and type(a).__module__.startswith("torch"):
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(a, torch.Tensor) and a.dtype == torch.float8_e4m3fn:
            return a.view(torch.uint8), True
    return a, False


def _is_numpy(a) -> bool:
    return type(a).__module__ == "numpy" and type(a).__name__ == "ndarray"


def _check_numpy(arrays, outputs):
    """The rules DLPack cannot carry, checked here so that the error names the argument (nanobind would only
    say "incompatible function arguments"): native byte order, and writable outputs."""
    for name, a in arrays.items():
        if not _is_numpy(a):
            continue
        if not a.dtype.isnative:
            raise ValueError(f"{name}: must be in native byte order (got a byte-swapped {a.dtype.name} array)")
        if name in outputs and not a.flags.writeable:
            raise ValueError(f"{name}: must be writable (got a read-only array)")


def _numpy_empty(like, shape, dtype, what):
    if not _is_numpy(like):
        raise TypeError(
            f"{what}: flashattn.ops allocates outputs only for numpy inputs; pass {what} for "
            f"{type(like).__module__}.{type(like).__name__} arrays"
        )
    import numpy as np

    return np.empty(shape, dtype=dtype)


def _max_seqlen(cu_seqlens, given, name):
    if given is not None:
        return int(given)
    if cu_seqlens is None:
        return 0
    if not _is_numpy(cu_seqlens):
        raise ValueError(f"{name}: must be given with non-numpy cu_seqlens (an upper bound of the lengths)")
    import numpy as np

    return int(np.diff(cu_seqlens).max(initial=0))


def _lse_shape(q, varlen):
    shape = tuple(q.shape)
    if varlen and len(shape) == 3:
        return (shape[1], shape[0])
    if not varlen and len(shape) == 4:
        return (shape[0], shape[2], shape[1])
    # Wrong rank: the core rejects q first, naming it; any placeholder will do.
    return (0,)


def _common(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k, softmax_scale, causal,
            causal_alignment, window_size, softcap, alibi_slopes, dropout_p, backend, num_threads, stream):
    left, right = window_pair(window_size)
    _in_range("num_threads", int(num_threads), 0, 2**31 - 1)
    return dict(
        cu_seqlens_q=_export(cu_seqlens_q),
        cu_seqlens_k=_export(cu_seqlens_k),
        seqused_k=_export(seqused_k),
        max_seqlen_q=_max_seqlen(cu_seqlens_q, max_seqlen_q, "max_seqlen_q"),
        max_seqlen_k=_max_seqlen(cu_seqlens_k, max_seqlen_k, "max_seqlen_k"),
        softmax_scale=None if softmax_scale is None else float(softmax_scale),
        causal=bool(causal),
        causal_alignment=causal_alignment_code(causal_alignment),
        window_left=left,
        window_right=right,
        softcap=float(softcap),
        alibi_slopes=_export(alibi_slopes),
        dropout_p=float(dropout_p),
        backend=backend_code(backend),
        num_threads=int(num_threads),
        stream=int(stream),
    )


def forward(q, k, v, *, out=None, lse=None, return_lse=True, cu_seqlens_q=None, cu_seqlens_k=None,
            max_seqlen_q=None, max_seqlen_k=None, seqused_k=None, softmax_scale=None, causal=False,
            causal_alignment="bottom_right", window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
            dropout_p=0.0, sinks=None, dropout_seed=0, dropout_offset=0, dropout_rng=None, num_splits=0,
            backend="auto", num_threads=0, stream=0, q_descale=None, k_descale=None, v_descale=None, fp8=False):
    """Attention forward. Returns ``(out, lse)``, or ``out`` when ``return_lse`` is False.

    FP8 (flashattn.h): q, k, v torch.float8_e4m3fn tensors (or, for any array library, their bytes as uint8 with
    ``fp8=True``), out bfloat16, optional float32 dequantisation factors ``q_descale`` (B, Hkv) or (B, Hq),
    ``k_descale`` / ``v_descale`` (B, Hkv), as FlashAttention-3's; :func:`quantize_fp8` makes such inputs.

    softmax_scale None means 1/sqrt(head_dim). max_seqlen_* default to the longest sequence of numpy
    cu_seqlens. num_threads: CPU worker threads (0 = all). stream: a cudaStream_t as an int for CUDA arrays.
    num_splits: split-KV on cuda-sm90 (0 = the plan picks, 1 = none; a hint elsewhere). sinks: float32 (Hq)
    learnable sink logits that join each row's softmax denominator (flashattn.h). dropout_p > 0 drops
    probabilities by the mask of (dropout_seed, dropout_offset) (src/core/dropout.hpp), or of the two entries
    of ``dropout_rng`` (int64, on q's device; CUDA kernels read it in place, so a captured CUDA graph may refill
    it between replays; the integers must then be 0); the backward takes the same seed and offset.
    """
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    (q, fq), (k, fk), (v, fv) = _fp8_storage(q), _fp8_storage(k), _fp8_storage(v)
    fp8 = bool(fp8) or fq or fk or fv
    if out is None:
        if fp8:
            raise TypeError("out: pass a bfloat16 out for FP8 inputs (flashattn.ops allocates numpy outputs only)")
        out = _numpy_empty(q, tuple(q.shape[:-1]) + (v.shape[-1],), q.dtype, "out")
    if lse is None and return_lse:
        import numpy as np

        lse = _numpy_empty(q, _lse_shape(q, varlen), np.float32, "lse")
    _check_numpy(dict(q=q, k=k, v=v, out=out, lse=lse, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                      seqused_k=seqused_k, alibi_slopes=alibi_slopes, sinks=sinks, dropout_rng=dropout_rng),
                 ("out", "lse"))
    _C.forward(_export(q), _export(k), _export(v), _export(out), _export(lse), num_splits=int(num_splits),
               sinks=_export(sinks), dropout_seed=int(dropout_seed), dropout_offset=int(dropout_offset),
               dropout_rng=_export(dropout_rng), fp8=fp8,
               q_descale=_export(q_descale), k_descale=_export(k_descale), v_descale=_export(v_descale),
               **_common(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k, softmax_scale, causal,
                         causal_alignment, window_size, softcap, alibi_slopes, dropout_p, backend, num_threads,
                         stream))
    return (out, lse) if return_lse else out


def backward(dout, q, k, v, out, lse, *, dq=None, dk=None, dv=None, cu_seqlens_q=None, cu_seqlens_k=None,
             max_seqlen_q=None, max_seqlen_k=None, seqused_k=None, softmax_scale=None, causal=False,
             causal_alignment="bottom_right", window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
             dropout_p=0.0, sinks=None, dsinks=None, dropout_seed=0, dropout_offset=0, dropout_rng=None,
             deterministic=False, backend="auto", num_threads=0, stream=0):
    """Attention backward from the forward's ``out`` and ``lse``. Returns ``(dq, dk, dv)``, and with ``sinks``
    ``(dq, dk, dv, dsinks)`` (dsinks: float32 (Hq), the sinks' gradient)."""
    for name, a in (("dout", dout), ("q", q), ("k", k), ("v", v), ("out", out), ("lse", lse)):
        if a is None:
            raise ValueError(f"{name}: required by the backward (got None)"
                             + ("; pass the lse the forward returned" if name == "lse" else ""))
    if dq is None:
        dq = _numpy_empty(q, q.shape, q.dtype, "dq")
    if dk is None:
        dk = _numpy_empty(k, k.shape, k.dtype, "dk")
    if dv is None:
        dv = _numpy_empty(v, v.shape, v.dtype, "dv")
    if sinks is not None and dsinks is None:
        import numpy as np

        dsinks = _numpy_empty(q, (q.shape[-2],), np.float32, "dsinks")
    _check_numpy(dict(dout=dout, q=q, k=k, v=v, out=out, lse=lse, dq=dq, dk=dk, dv=dv, cu_seqlens_q=cu_seqlens_q,
                      cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k, alibi_slopes=alibi_slopes, sinks=sinks,
                      dsinks=dsinks, dropout_rng=dropout_rng), ("dq", "dk", "dv", "dsinks"))
    _C.backward(_export(dout), _export(q), _export(k), _export(v), _export(out), _export(lse), _export(dq),
                _export(dk), _export(dv), deterministic=bool(deterministic), sinks=_export(sinks),
                dsinks=_export(dsinks), dropout_seed=int(dropout_seed), dropout_offset=int(dropout_offset),
                dropout_rng=_export(dropout_rng),
                **_common(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k, softmax_scale, causal,
                          causal_alignment, window_size, softcap, alibi_slopes, dropout_p, backend, num_threads,
                          stream))
    return (dq, dk, dv) if sinks is None else (dq, dk, dv, dsinks)


def quantize_fp8(x, *, out=None, descale=None, hadamard=False, seed=0, stream=0):
    """FP8 quantisation (flashattn.h, fa_quantize_fp8): x (B, S, H, D) float32/float16/bfloat16 -> ``(out,
    descale)``, out e4m3 (torch.float8_e4m3fn for torch inputs; uint8 bytes for numpy) and descale (B, H) float32
    with x' ~= out * descale. ``hadamard``: rotate along D first (a power of two), with signs from ``seed``; quantise
    q and k with the same seed (q.k^T is unchanged), v without. Outputs are allocated for numpy and torch inputs.
    """
    if not hasattr(x, "shape"):
        raise TypeError(f"x: must be an array (torch, numpy or DLPack) (got {type(x).__name__})")
    if seed is None or isinstance(seed, (str, bytes, float)):
        raise TypeError(f"seed: must be an int (got {type(seed).__name__})")
    torch = sys.modules.get("torch") if type(x).__module__.startswith("torch") else None
    if torch is not None and isinstance(x, torch.Tensor):
        if x.dim() > 0 and x.stride(-1) != 1:
            x = x.contiguous()  # the C ABI reads rows with a unit-stride last dimension
        if out is None:
            out = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
        if descale is None:
            descale = torch.empty((x.shape[0], x.shape[2]) if x.dim() == 4 else (0,), dtype=torch.float32,
                                  device=x.device)
        if x.device.type == "cuda" and not stream:
            stream = torch.cuda.current_stream(x.device).cuda_stream
    else:
        import numpy as np

        if out is None:
            out = _numpy_empty(x, tuple(x.shape), np.uint8, "out")
        if descale is None:
            descale = _numpy_empty(x, (x.shape[0], x.shape[2]) if len(x.shape) == 4 else (0,), np.float32, "descale")
    raw, _ = _fp8_storage(out)
    _check_numpy(dict(x=x, out=raw, descale=descale), ("out", "descale"))
    _C.quantize_fp8(_export(x), _export(raw), _export(descale), hadamard=bool(hadamard), seed=int(seed),
                    stream=int(stream))
    return out, descale


def merge_partials(out, lse, out_b, lse_b, *, stream=0):
    """Merges the attention partial (out_b, lse_b) into (out, lse) in place (flashattn.h, fa_merge_partials): both
    are attentions of the same queries over disjoint key sets, and (out, lse) becomes the attention over their
    union, ``lse' = logaddexp(lse, lse_b)``, ``out' = out e^(lse - lse') + out_b e^(lse_b - lse')`` in float32.
    Layouts are the forward's outputs' (batched out (B, S, H, Dv), lse (B, H, S); varlen (T, H, Dv), (H, T)); out
    float32/float16/bfloat16 (float32 keeps a running sum unrounded), lse float32; strided views are fine. A part
    with lse -inf saw no key and is not read. Returns ``(out, lse)``."""
    torch = sys.modules.get("torch") if type(out).__module__.startswith("torch") else None
    if torch is not None and isinstance(out, torch.Tensor) and out.device.type == "cuda" and not stream:
        stream = torch.cuda.current_stream(out.device).cuda_stream
    _check_numpy(dict(out=out, lse=lse, out_b=out_b, lse_b=lse_b), ("out", "lse"))
    _C.merge_partials(_export(out), _export(lse), _export(out_b), _export(lse_b), stream=int(stream))
    return out, lse
