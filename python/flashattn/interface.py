"""flash_attn 2.x-compatible functions on torch tensors, with autograd.

The kernels are registered as the custom ops ``flashattn::fwd`` and ``flashattn::bwd``
(``torch.library.custom_op``) with fake (meta) implementations and an autograd formula, so
``torch.compile(fullgraph=True)`` traces them without a graph break, and CUDA-graph capture works
(batched calls: the varlen path copies cu_seqlens to the host for validation, which a capture forbids).
Eager calls skip the custom-op dispatcher (a torch.autograd.Function with the same forward and backward, or
the plain forward when no input needs a gradient), which cost tens of microseconds per call.

CUDA tensors run on ``torch.cuda.current_stream()``; CPU tensors run the CPU backend with
``torch.get_num_threads()`` threads. The backward saves q, k, v, out and the log-sum-exp only.
"""

from __future__ import annotations

import inspect
import typing
from typing import NamedTuple, Optional, Tuple, Union

import torch
from torch import Tensor

from . import _C
from .ops import ALIGN_BOTTOM_RIGHT, ALIGN_TOP_LEFT, causal_alignment_code, window_pair
from .ops import _export as _dl  # torch tensors as DLPack capsules (detached), None as None

# What the public functions return: out, or (out, softmax_lse, None) with return_attn_probs.
Result = Union[Tensor, Tuple[Tensor, Tensor, None]]
Window = Tuple[int, int]

__all__ = [
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
]


def _lse_shape(q: Tensor, varlen: bool):
    if varlen and q.dim() == 3:
        return (q.shape[1], q.shape[0])
    if not varlen and q.dim() == 4:
        return (q.shape[0], q.shape[2], q.shape[1])
    return (0,)  # wrong rank: the core rejects q, naming it


# Per-call host cost adds up where kernels are short (decode steps, short sequences, small batches): the H200
# measurements are in bench/results/2026-11-30_sm90_dev/run5_host_overhead.tsv. The private torch.cuda helpers skip
# torch.cuda.device's context-manager object and current_stream's Stream object; public fallbacks keep older
# torch working.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_exchange_device = getattr(torch.cuda, "_exchange_device", None)
_maybe_exchange_device = getattr(torch.cuda, "_maybe_exchange_device", None)


def _call(fn, q: Tensor, *args, **kwargs):
    """fn(*args, **kwargs, num_threads=..., stream=...) with q's CUDA device current (CPU: torch's threads)."""
    if q.device.type != "cuda":
        return fn(*args, **kwargs, num_threads=torch.get_num_threads(), stream=0)
    index = q.device.index
    if _raw_stream is None or _exchange_device is None or _maybe_exchange_device is None:
        with torch.cuda.device(q.device):
            return fn(*args, **kwargs, num_threads=0, stream=torch.cuda.current_stream(q.device).cuda_stream)
    previous = _exchange_device(index)
    try:
        return fn(*args, **kwargs, num_threads=0, stream=_raw_stream(index))
    finally:
        _maybe_exchange_device(previous)


class AttnOptions(NamedTuple):
    """What the ops ``flashattn::fwd`` / ``flashattn::bwd`` take after their tensors, in their order: the one list
    of them. The ops' schemas, their fake implementations, the autograd context and the gradient tuple are all
    made from it, so an option is added here once."""

    cu_seqlens_q: Optional[Tensor] = None
    cu_seqlens_k: Optional[Tensor] = None
    seqused_k: Optional[Tensor] = None
    max_seqlen_q: int = 0
    max_seqlen_k: int = 0
    softmax_scale: Optional[float] = None
    causal: bool = False
    top_left: bool = False
    window_left: int = -1
    window_right: int = -1
    softcap: float = 0.0
    alibi_slopes: Optional[Tensor] = None
    dropout_p: float = 0.0
    deterministic: bool = False
    sinks: Optional[Tensor] = None
    dropout_rng: Optional[Tensor] = None


_OPTION_TYPES = typing.get_type_hints(AttnOptions)
_TENSOR_OPTIONS = tuple(n for n in AttnOptions._fields if _OPTION_TYPES[n] == Optional[Tensor])


def _attn_kwargs(o: AttnOptions) -> dict:
    """The C ABI keywords of the options both directions share (the backward adds deterministic and dsinks)."""
    return dict(cu_seqlens_q=_dl(o.cu_seqlens_q), cu_seqlens_k=_dl(o.cu_seqlens_k), seqused_k=_dl(o.seqused_k),
                max_seqlen_q=o.max_seqlen_q, max_seqlen_k=o.max_seqlen_k, softmax_scale=o.softmax_scale,
                causal=o.causal, causal_alignment=ALIGN_TOP_LEFT if o.top_left else ALIGN_BOTTOM_RIGHT,
                window_left=o.window_left, window_right=o.window_right, softcap=o.softcap,
                alibi_slopes=_dl(o.alibi_slopes), dropout_p=o.dropout_p, sinks=_dl(o.sinks),
                dropout_rng=_dl(o.dropout_rng))


def _fwd_shapes(q: Tensor, v: Tensor, o: AttnOptions):
    varlen = o.cu_seqlens_q is not None or o.cu_seqlens_k is not None
    return q.shape[:-1] + v.shape[-1:], _lse_shape(q, varlen)


def _fwd_impl(q: Tensor, k: Tensor, v: Tensor, *options) -> Tuple[Tensor, Tensor]:
    o = AttnOptions(*options)
    out_shape, lse_shape = _fwd_shapes(q, v, o)
    out = q.new_empty(out_shape)
    lse = q.new_empty(lse_shape, dtype=torch.float32)
    _call(_C.forward, q, _dl(q), _dl(k), _dl(v), _dl(out), _dl(lse), **_attn_kwargs(o))
    return out, lse


def _bwd_empty(q: Tensor, k: Tensor, v: Tensor, o: AttnOptions):
    # Without sinks an empty tensor stands for the absent gradient (a custom op returns tensors only).
    return (torch.empty(q.shape, dtype=q.dtype, device=q.device), torch.empty(k.shape, dtype=k.dtype, device=k.device),
            torch.empty(v.shape, dtype=v.dtype, device=v.device),
            torch.empty((0,) if o.sinks is None else o.sinks.shape, dtype=torch.float32, device=q.device))


def _bwd_impl(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
              *options) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    o = AttnOptions(*options)
    dq, dk, dv, dsinks = _bwd_empty(q, k, v, o)
    _call(_C.backward, q, _dl(dout), _dl(q), _dl(k), _dl(v), _dl(out), _dl(lse), _dl(dq), _dl(dk), _dl(dv),
          deterministic=o.deterministic, dsinks=None if o.sinks is None else _dl(dsinks), **_attn_kwargs(o))
    return dq, dk, dv, dsinks


def _custom_op(name: str, tensors: Tuple[str, ...], returns, impl, optional_tensors: Tuple[str, ...] = ()):
    """torch.library.custom_op of impl(*tensors, *optional_tensors, *options) under the schema (tensors...,
    optional tensors..., AttnOptions' fields)."""

    def op(*args):
        return impl(*args)

    param = inspect.Parameter.POSITIONAL_OR_KEYWORD
    op.__signature__ = inspect.Signature(
        [inspect.Parameter(t, param, annotation=Tensor) for t in tensors] +
        [inspect.Parameter(t, param, annotation=Optional[Tensor]) for t in optional_tensors] +
        [inspect.Parameter(n, param, annotation=_OPTION_TYPES[n]) for n in AttnOptions._fields],
        return_annotation=returns)
    op.__name__ = name.split("::")[-1]
    return torch.library.custom_op(name, mutates_args=())(op)


_fwd = _custom_op("flashattn::fwd", ("q", "k", "v"), Tuple[Tensor, Tensor], _fwd_impl)
_bwd = _custom_op("flashattn::bwd", ("dout", "q", "k", "v", "out", "lse"), Tuple[Tensor, Tensor, Tensor, Tensor],
                  _bwd_impl)


@_fwd.register_fake
def _fwd_fake(q, k, v, *options):
    out_shape, lse_shape = _fwd_shapes(q, v, AttnOptions(*options))
    return q.new_empty(out_shape), q.new_empty(lse_shape, dtype=torch.float32)


@_bwd.register_fake
def _bwd_fake(dout, q, k, v, out, lse, *options):
    return _bwd_empty(q, k, v, AttnOptions(*options))


def _setup_context(ctx, inputs, output):
    q, k, v = inputs[:3]
    o = AttnOptions(*inputs[3:])
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, *(getattr(o, n) for n in _TENSOR_OPTIONS))
    ctx.options = o._replace(**{n: None for n in _TENSOR_OPTIONS})  # the tensors go through save_for_backward


def _gradients(bwd, ctx, grad_out):
    # lse is returned for inspection (return_attn_probs) and is not differentiable, as in flash_attn:
    # its gradient is ignored.
    q, k, v, out, lse, *tensors = ctx.saved_tensors
    o = ctx.options._replace(**dict(zip(_TENSOR_OPTIONS, tensors)))
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    elif grad_out.stride(-1) != 1:
        grad_out = grad_out.contiguous()  # e.g. the expanded gradient of a sum
    dq, dk, dv, dsinks = bwd(grad_out, q, k, v, out, lse, *o)
    # One gradient per forward input: q, k, v, then one per option (only the sinks have one).
    return (dq, dk, dv) + tuple(dsinks if n == "sinks" and o.sinks is not None else None for n in AttnOptions._fields)


def _backward(ctx, grad_out, grad_lse):
    return _gradients(_bwd, ctx, grad_out)


_fwd.register_autograd(_backward, setup_context=_setup_context)


class _EagerAttention(torch.autograd.Function):
    """The custom op's forward and autograd formula without the custom-op dispatch (tens of microseconds per
    call in eager mode). torch.compile traces the custom op instead (see _attention)."""

    @staticmethod
    def forward(ctx, *inputs):
        out, lse = _fwd_impl(*inputs)
        _setup_context(ctx, inputs, (out, lse))
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        return _gradients(_bwd_impl, ctx, grad_out)


# The CUDA kernels move 16-byte vectors: every row must start on a 16-byte boundary (pointer and strides of the
# non-last dimensions). The C ABI refuses other layouts with a named error; the drop-in API copies instead, as
# flash_attn works with them.
_CUDA_VECTOR_BYTES = 16


def _kernel_layout(t: Tensor) -> Tensor:
    # The kernels take any strides with a unit-stride last dimension (as flash_attn's maybe_contiguous).
    if t.stride(-1) != 1:
        return t.contiguous()
    if t.device.type == "cuda" and t.numel() > 0:
        # Strides are known while torch.compile traces; the data pointer is not (dynamo traces neither
        # data_ptr() nor storage_offset()), so a compiled call with an offset view gets the C ABI's named error
        # instead of a copy. Eager calls check the pointer too.
        elems = max(1, _CUDA_VECTOR_BYTES // t.element_size())
        aligned = all(stride % elems == 0 for size, stride in zip(t.shape[:-1], t.stride()[:-1]) if size > 1)
        if aligned and not torch.compiler.is_compiling():
            aligned = t.data_ptr() % _CUDA_VECTOR_BYTES == 0
        if not aligned:
            return t.clone(memory_format=torch.contiguous_format)  # a fresh allocation is 512-byte aligned
    return t


_MAX_HEAD_DIM = 256  # the core's limit (src/core/validate.cpp), of the padded head dim


def _pad_head_dim(t: Tensor, name: str) -> Tensor:
    # Head dims that are not a multiple of 8 are zero-padded to the next one, as flash_attn does: zero columns
    # change neither q.k nor the first dv columns of P.V, and autograd slices the padding off the gradients. A head
    # dim that pads past the limit is refused here, by its own size (the core would name the padded one).
    extra = -t.shape[-1] % 8
    if extra and t.shape[-1] + extra > _MAX_HEAD_DIM:
        _fail(name, f"head_dim must be at most {_MAX_HEAD_DIM} (got {t.shape[-1]})")
    return t if extra == 0 else torch.nn.functional.pad(t, (0, extra))


def _dropout_rng(dropout_p, device: torch.device) -> Optional[Tensor]:
    # The mask is a function of (seed, offset, b, h, i, j) (src/core/dropout.hpp). Both are drawn on q's device by
    # torch's generator of that device, into a tensor the kernels read in place: torch.manual_seed makes dropout
    # reproducible, a CUDA graph replay draws new ones (torch's RNG is capture-safe; a host integer would be
    # baked into the graph, and every replay would drop the same probabilities), and torch.compile traces it
    # without a graph break. The backward reuses the forward's tensor.
    if not dropout_p:
        return None
    return torch.randint(0, 2 ** 62, (2,), dtype=torch.int64, device=device)


def _attention_probs(q: Tensor, k: Tensor, v: Tensor, o: AttnOptions) -> Tensor:
    """flash_attn's S_dmask: the call's softmax probabilities (B, Hq, Sq, Sk) float32 (varlen: max_seqlen_q,
    max_seqlen_k), negative where dropout dropped them, 0 past a sequence's queries or keys (fa_forward_probs).
    Computed on the host from host copies of the inputs and of the call's dropout seed and offset, so the mask is
    the one the kernels applied on any device; memory grows with Sq * Sk: for small test shapes, as in flash_attn."""
    def host(t):
        return None if t is None else t.detach().to("cpu")
    qh, kh, vh = host(q), host(k), host(v)
    oh = o._replace(**{n: host(getattr(o, n)) for n in _TENSOR_OPTIONS})
    varlen = o.cu_seqlens_q is not None
    batch = o.cu_seqlens_q.shape[0] - 1 if varlen else q.shape[0]
    seqlens = (o.max_seqlen_q, o.max_seqlen_k) if varlen else (q.shape[1], k.shape[1])
    out = qh.new_empty(_fwd_shapes(qh, vh, oh)[0])  # validated, not written
    probs = torch.empty((batch, q.shape[-2]) + seqlens, dtype=torch.float32)
    _C.forward(_dl(qh), _dl(kh), _dl(vh), _dl(out), None, **_attn_kwargs(oh), probs=_dl(probs),
               backend=_C.BACKEND_CPU, num_threads=torch.get_num_threads(), stream=0)
    return probs.to(q.device)


def _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
               causal, window_size, softcap, alibi_slopes, deterministic, causal_alignment, learnable_sink=None,
               return_attn_probs=False):
    head_dim, head_dim_v = q.shape[-1], v.shape[-1]
    q, softmax_scale = positive_scale(q, softmax_scale)
    if softmax_scale is None and head_dim % 8 != 0:
        softmax_scale = head_dim ** -0.5  # the scale of the real head dim, not of the padded one
    options = _attn_options(q, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, dropout_p,
                            softmax_scale, causal, window_size, softcap, alibi_slopes, causal_alignment,
                            learnable_sink, deterministic)
    options = options._replace(dropout_rng=_dropout_rng(options.dropout_p, q.device))
    q, k, v = (_kernel_layout(_pad_head_dim(t, name)) for t, name in ((q, "q"), (k, "k"), (v, "v")))
    inputs = (q, k, v, *options)
    if torch.compiler.is_compiling():
        out, lse = _fwd(*inputs)
    elif torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad or
                                      (learnable_sink is not None and learnable_sink.requires_grad)):
        out, lse = _EagerAttention.apply(*inputs)
    else:
        out, lse = _fwd_impl(*inputs)
    # S_dmask as flash_attn returns it: with dropout only, eager calls only (torch.compile traces None).
    probs = None
    if return_attn_probs and options.dropout_p > 0 and not torch.compiler.is_compiling():
        probs = _attention_probs(q, k, v, options)
    return (out if out.shape[-1] == head_dim_v else out[..., :head_dim_v]), lse, probs


def _result(out, lse, return_attn_probs, probs=None):
    # flash_attn returns (out, softmax_lse, S_dmask); S_dmask: _attention_probs (None without dropout).
    return (out, lse, probs) if return_attn_probs else out


def _fail(argument: str, rule: str):
    """A named error of the Python layer ("argument: rule", the core's form)."""
    raise ValueError(f"{argument}: {rule}")


def _number(name: str, x, kind):
    """kind(x) (float or int) of a scalar argument, naming it where x is no number. Only the clearly wrong types are
    refused: under torch.compile x may be a SymInt or SymFloat, which kind() takes."""
    if x is None or isinstance(x, (str, bytes, list, tuple, dict, set)):
        raise TypeError(f"{name}: must be a number (got {type(x).__name__})")
    value = kind(x)
    if kind is int and isinstance(value, int) and not -(2 ** 63) <= value < 2 ** 63:
        _fail(name, f"must fit in 64 bits (got {value})")
    return value


def _optional_tensor(name: str, t) -> None:
    if t is not None and not isinstance(t, Tensor):
        raise TypeError(f"{name}: must be a torch.Tensor or None (got {type(t).__name__})")


def flash_attn_window(window_size, causal) -> Window:
    """flash_attn's window rules (its mha_fwd / mha_bwd): a negative side is unbounded (-1 for the core), and causal
    sets the right side to 0 whatever was given."""
    left, right = window_pair(window_size)
    return max(left, -1), 0 if causal else max(right, -1)


def flash_attn_softcap(softcap) -> float:
    """flash_attn applies softcap only where it is > 0: a negative (or NaN) one is off, as 0 is."""
    value = _number("softcap", softcap, float)
    return value if value > 0 else 0.0


def positive_scale(q, softmax_scale):
    """(q, softmax_scale) with a scale the kernels take: their online softmax keeps the maximum of the unscaled scores,
    so the core wants a scale > 0, where flash_attn takes any. softmax(c s) = softmax(|c| (-s)) for c < 0: q negated,
    exact under softcap (tanh is odd) and ALiBi (its bias is not scaled); for c = 0 every score is 0: q zeroed, scale
    1. The gradient reaches q through the negation (or is 0, as with scale 0). Not finite: left to the core's error."""
    if softmax_scale is None:
        return q, None
    c = _number("softmax_scale", softmax_scale, float)
    if c < 0:
        return -q, -c
    if c == 0:
        return q * 0, 1.0
    return q, c


def _attn_options(q, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                  causal, window_size, softcap, alibi_slopes, causal_alignment, learnable_sink,
                  deterministic=False) -> AttnOptions:
    """The flash_attn arguments as the ops' AttnOptions, each checked where the core would not name it as the
    caller did (the core calls learnable_sink "sinks")."""
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k), ("seqused_k", seqused_k),
                    ("alibi_slopes", alibi_slopes), ("learnable_sink", learnable_sink)):
        _optional_tensor(name, t)
    if learnable_sink is not None:
        if learnable_sink.dim() != 1 or learnable_sink.shape[0] != q.shape[-2]:
            _fail("learnable_sink", f"must have shape ({q.shape[-2]},), a logit per query head "
                                    f"(got {tuple(learnable_sink.shape)})")
        if learnable_sink.device != q.device:
            _fail("learnable_sink", f"must be on q's device ({q.device}, got {learnable_sink.device})")
    left, right = flash_attn_window(window_size, causal)
    return AttnOptions(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k,
                       max_seqlen_q=_number("max_seqlen_q", max_seqlen_q, int),
                       max_seqlen_k=_number("max_seqlen_k", max_seqlen_k, int),
                       softmax_scale=None if softmax_scale is None else _number("softmax_scale", softmax_scale, float),
                       causal=bool(causal), top_left=causal_alignment_code(causal_alignment) == ALIGN_TOP_LEFT,
                       window_left=left, window_right=right, softcap=flash_attn_softcap(softcap),
                       alibi_slopes=alibi_slopes, dropout_p=max(_number("dropout_p", dropout_p, float), 0.0),
                       deterministic=bool(deterministic),
                       sinks=None if learnable_sink is None else learnable_sink.float().contiguous())


def _check_input(name: str, t, dims: int, layout: str, condition: str = "") -> None:
    """A tensor argument, before any of its shape or dtype is read: a non-tensor or a 0-d tensor would otherwise
    fail inside Python's indexing with no argument named. `condition`: when the layout applies ("with ...")."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{name}: must be a torch.Tensor (got {type(t).__name__})")
    if t.dim() != dims:
        _fail(name, f"{condition + ' ' if condition else ''}must be a {dims}-D tensor {layout} (got {t.dim()}-D)")


def _check_qkv(q, k, v, varlen: bool, paged: bool = False) -> None:
    condition = ""
    if varlen:
        _check_input("q", q, 3, "(total_q, heads, head_dim)")
        kv_dims, kv_layout = (4, "(num_pages, page_size, heads_kv, {})") if paged else (3, "(total_k, heads_kv, {})")
        condition = "with block_table" if paged else ""
    else:
        _check_input("q", q, 4, "(batch, seqlen_q, heads, head_dim)")
        kv_dims, kv_layout = 4, "(batch, seqlen_k, heads_kv, {})"
    _check_input("k", k, kv_dims, kv_layout.format("head_dim"), condition)
    _check_input("v", v, kv_dims, kv_layout.format("head_dim_v"), condition)


def _unpacked(name: str, t, dims: int, axis: int, count: int, layout: str) -> Tuple[Tensor, ...]:
    """The views of a packed kv / qkv argument (no copy), after its layout is checked."""
    _check_input(name, t, dims, layout)
    if t.shape[axis] != count:
        _fail(name, f"must be {layout}: dimension {axis} must have size {count} (got {t.shape[axis]})")
    return t.unbind(axis)


def _fp8_bytes(t: Tensor) -> Tensor:
    """A float8_e4m3fn tensor as its bytes (uint8 view): torch's DLPack export and its indexing ops take no float8
    tensor. Other tensors as they are (the core names a wrong dtype)."""
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def _check_no_factors(q: Tensor, q_descale, k_descale, v_descale) -> None:
    """FP8's dequantisation factors given with 16-bit inputs: a named error, as the core's."""
    for name, f in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if f is not None:
            _fail(name, f"is for float8_e4m3fn q/k/v only (got {q.dtype})")


def _gather_pages(k: Tensor, v: Tensor, block_table: Tensor, cu_seqlens_k: Tensor) -> Tuple[Tensor, Tensor]:
    """flash_attn's paged varlen K/V as packed varlen rows: k, v (num_pages, page_size, Hkv, D/Dv); key t of
    sequence b is slot t % page_size of page block_table[b, t // page_size], and sequence b has
    cu_seqlens_k[b + 1] - cu_seqlens_k[b] keys. The kernels read packed rows, so the used slots are gathered (one
    read and write of those keys; an index operation, so autograd reaches the pages). Reads cu_seqlens_k and the
    used page indices on the host, as the varlen path does anyway."""
    if k.dim() != 4 or v.dim() != 4:
        _fail("k" if k.dim() != 4 else "v", "with block_table must be (num_pages, page_size, heads_kv, head_dim)")
    if v.shape[:3] != k.shape[:3]:
        _fail("v", f"with block_table must have k's pages, page size and heads {tuple(k.shape[:3])}")
    if not isinstance(block_table, Tensor) or block_table.dtype != torch.int32 or block_table.dim() != 2:
        _fail("block_table", "must be a 2-D int32 tensor (batch, max_pages)")
    if block_table.device != k.device:
        _fail("block_table", f"must be on k's device ({k.device}, got {block_table.device})")
    if cu_seqlens_k.dim() != 1 or cu_seqlens_k.dtype != torch.int32 or cu_seqlens_k.device != k.device:
        _fail("cu_seqlens_k", f"must be a 1-D int32 tensor on k's device ({k.device})")
    batch = cu_seqlens_k.shape[0] - 1
    if block_table.shape[0] != batch:
        _fail("block_table", f"must have a row per sequence ({batch}, got {block_table.shape[0]})")
    num_pages, page_size = k.shape[0], k.shape[1]
    cu = cu_seqlens_k.to(torch.int64)
    lens = cu[1:] - cu[:-1]
    pages_used = (lens + page_size - 1) // page_size
    first, total, shortest, most_pages = torch.stack(
        (cu[0], cu[-1], lens.min(), pages_used.max()) if batch > 0 else (cu[0], cu[-1], cu[0], cu[0])).tolist()
    if first != 0:
        _fail("cu_seqlens_k", f"must start at 0 (got {first})")
    if shortest < 0:
        _fail("cu_seqlens_k", "must be non-decreasing")
    if page_size < 1:
        _fail("k", "with block_table needs pages of at least one slot")
    if most_pages > block_table.shape[1]:
        _fail("block_table", f"has {block_table.shape[1]} pages per sequence; a sequence of cu_seqlens_k needs "
                             f"{most_pages} pages of {page_size}")
    seq = torch.repeat_interleave(torch.arange(batch, device=k.device), lens, output_size=total)
    pos = torch.arange(total, device=k.device) - cu[:-1][seq]
    page = block_table.to(torch.int64)[seq, torch.div(pos, page_size, rounding_mode="floor")]
    if total > 0 and bool(((page < 0) | (page >= num_pages)).any()):
        _fail("block_table", f"page indices of used pages must be in [0, {num_pages})")
    rows = page * page_size + pos % page_size
    return k.flatten(0, 1)[rows], v.flatten(0, 1)[rows]


def _fwd_fp8_impl(q: Tensor, k: Tensor, v: Tensor, q_descale: Optional[Tensor], k_descale: Optional[Tensor],
                  v_descale: Optional[Tensor], *options) -> Tuple[Tensor, Tensor]:
    """FP8 q/k/v (their bytes as uint8: torch's DLPack has no float8 code) with their factors; out bfloat16."""
    o = AttnOptions(*options)
    out_shape, lse_shape = _fwd_shapes(q, v, o)
    out = torch.empty(out_shape, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    _call(_C.forward, q, _dl(_fp8_bytes(q)), _dl(_fp8_bytes(k)), _dl(_fp8_bytes(v)), _dl(out), _dl(lse), fp8=True,
          q_descale=_dl(q_descale), k_descale=_dl(k_descale), v_descale=_dl(v_descale), **_attn_kwargs(o))
    return out, lse


# The FP8 forward as a custom op (forward only: no autograd formula), so that torch.compile traces it.
_fwd_fp8 = _custom_op("flashattn::fwd_fp8", ("q", "k", "v"), Tuple[Tensor, Tensor], _fwd_fp8_impl,
                      optional_tensors=("q_descale", "k_descale", "v_descale"))


@_fwd_fp8.register_fake
def _fwd_fp8_fake(q, k, v, q_descale, k_descale, v_descale, *options):
    out_shape, lse_shape = _fwd_shapes(q, v, AttnOptions(*options))
    return q.new_empty(out_shape, dtype=torch.bfloat16), q.new_empty(lse_shape, dtype=torch.float32)


def _fp8_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, dropout_p,
                   softmax_scale, causal, window_size, softcap, alibi_slopes, causal_alignment, learnable_sink,
                   q_descale, k_descale, v_descale):
    """FP8 inputs (torch.float8_e4m3fn q, k, v): forward only, as FlashAttention-3's; out bfloat16."""
    if any(t.requires_grad for t in (q, k, v)) and torch.is_grad_enabled():
        _fail("q", "float8_e4m3fn attention is forward only (no gradient), as in FlashAttention-3")
    options = _attn_options(q, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, dropout_p,
                            softmax_scale, causal, window_size, softcap, alibi_slopes, causal_alignment,
                            learnable_sink)
    inputs = (q, k, v, q_descale, k_descale, v_descale, *options)
    return _fwd_fp8(*inputs) if torch.compiler.is_compiling() else _fwd_fp8_impl(*inputs)


def flash_attn_func(q: Tensor, k: Tensor, v: Tensor, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                    causal: bool = False, window_size: Window = (-1, -1), softcap: float = 0.0,
                    alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                    return_attn_probs: bool = False, *, causal_alignment: str = "bottom_right",
                    learnable_sink: Optional[Tensor] = None, q_descale: Optional[Tensor] = None,
                    k_descale: Optional[Tensor] = None, v_descale: Optional[Tensor] = None) -> Result:
    """Attention of q (B, Sq, Hq, D) against k (B, Sk, Hkv, D), v (B, Sk, Hkv, Dv); returns out (B, Sq, Hq, Dv).

    As flash_attn.flash_attn_func. Extensions: ``causal_alignment`` "bottom_right" (default, flash_attn >= 2.1)
    or "top_left"; ``learnable_sink`` (Hq): a sink logit per query head in every row's softmax denominator
    (gpt-oss; FlashAttention-4's keyword), differentiable. With return_attn_probs, returns (out, softmax_lse
    (B, Hq, Sq) float32, S_dmask): S_dmask None without dropout, else the probabilities (B, Hq, Sq, Sk), negative
    where dropped (_attention_probs; small shapes). FP8: q, k, v torch.float8_e4m3fn with the float32
    dequantisation factors ``q_descale`` (B, Hkv) or (B, Hq), ``k_descale``, ``v_descale`` (B, Hkv) of
    FlashAttention-3's flash_attn_func (flashattn.quantize_fp8 makes them); forward only, out bfloat16.
    """
    _check_qkv(q, k, v, varlen=False)
    if q.dtype == torch.float8_e4m3fn:
        out, lse = _fp8_attention(q, k, v, None, None, None, 0, 0, dropout_p, softmax_scale, causal, window_size,
                                  softcap, alibi_slopes, causal_alignment, learnable_sink, q_descale, k_descale,
                                  v_descale)
        return _result(out, lse, return_attn_probs)
    _check_no_factors(q, q_descale, k_descale, v_descale)
    out, lse, probs = _attention(q, k, v, None, None, None, 0, 0, dropout_p, softmax_scale, causal, window_size,
                                 softcap, alibi_slopes, deterministic, causal_alignment, learnable_sink,
                                 return_attn_probs)
    return _result(out, lse, return_attn_probs, probs)


def flash_attn_kvpacked_func(q: Tensor, kv: Tensor, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                             causal: bool = False, window_size: Window = (-1, -1), softcap: float = 0.0,
                             alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                             return_attn_probs: bool = False, *, causal_alignment: str = "bottom_right") -> Result:
    """kv (B, Sk, 2, Hkv, D): k = kv[:, :, 0], v = kv[:, :, 1] (strided views, no copy)."""
    k, v = _unpacked("kv", kv, 5, 2, 2, "(batch, seqlen_k, 2, heads_kv, head_dim)")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs, causal_alignment=causal_alignment)


def flash_attn_qkvpacked_func(qkv: Tensor, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                              causal: bool = False, window_size: Window = (-1, -1), softcap: float = 0.0,
                              alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                              return_attn_probs: bool = False, *, causal_alignment: str = "bottom_right") -> Result:
    """qkv (B, S, 3, H, D): q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]."""
    q, k, v = _unpacked("qkv", qkv, 5, 2, 3, "(batch, seqlen, 3, heads, head_dim)")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size,
                           softcap, alibi_slopes, deterministic, return_attn_probs, causal_alignment=causal_alignment)


def flash_attn_varlen_func(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                           max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = 0.0,
                           softmax_scale: Optional[float] = None, causal: bool = False,
                           window_size: Window = (-1, -1), softcap: float = 0.0,
                           alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                           return_attn_probs: bool = False, block_table: Optional[Tensor] = None, *,
                           causal_alignment: str = "bottom_right", seqused_k: Optional[Tensor] = None,
                           learnable_sink: Optional[Tensor] = None, q_descale: Optional[Tensor] = None,
                           k_descale: Optional[Tensor] = None, v_descale: Optional[Tensor] = None) -> Result:
    """Variable-length batch: q (Tq, Hq, D), k (Tk, Hkv, D), v (Tk, Hkv, Dv), int32 cu_seqlens (B + 1).

    As flash_attn.flash_attn_varlen_func, paged K/V included: with ``block_table`` (B, max_pages) int32, k and v
    are (num_pages, page_size, Hkv, D/Dv) of any page size, sequence b's keys are the first
    cu_seqlens_k[b + 1] - cu_seqlens_k[b] slots of its pages, and gradients reach the pages. Extensions:
    ``causal_alignment``, and ``seqused_k`` (int32 (B): keys used per sequence). softmax_lse is (Hq, Tq).
    Not capturable in a CUDA graph: cu_seqlens (and, paged, the used page indices) are read on the host. FP8 q/k/v
    with ``q_descale`` / ``k_descale`` / ``v_descale`` (one row per sequence) as in flash_attn_func.
    """
    _check_qkv(q, k, v, varlen=True, paged=block_table is not None)
    fp8 = q.dtype == torch.float8_e4m3fn
    if block_table is not None:
        if fp8:  # the pages' bytes
            k, v = _gather_pages(_fp8_bytes(k), _fp8_bytes(v), block_table, cu_seqlens_k)
            k, v = k.view(torch.float8_e4m3fn), v.view(torch.float8_e4m3fn)
        else:
            k, v = _gather_pages(k, v, block_table, cu_seqlens_k)
    if fp8:
        out, lse = _fp8_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                                  dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                                  causal_alignment, learnable_sink, q_descale, k_descale, v_descale)
        return _result(out, lse, return_attn_probs)
    _check_no_factors(q, q_descale, k_descale, v_descale)
    out, lse, probs = _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                                 dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                 causal_alignment, learnable_sink, return_attn_probs)
    return _result(out, lse, return_attn_probs, probs)


def flash_attn_varlen_kvpacked_func(q: Tensor, kv: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                                    max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = 0.0,
                                    softmax_scale: Optional[float] = None, causal: bool = False,
                                    window_size: Window = (-1, -1), softcap: float = 0.0,
                                    alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                                    return_attn_probs: bool = False, *,
                                    causal_alignment: str = "bottom_right") -> Result:
    """kv (Tk, 2, Hkv, D)."""
    k, v = _unpacked("kv", kv, 4, 1, 2, "(total_k, 2, heads_kv, head_dim)")
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                  dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs, causal_alignment=causal_alignment)


def flash_attn_varlen_qkvpacked_func(qkv: Tensor, cu_seqlens: Tensor, max_seqlen: int, dropout_p: float = 0.0,
                                     softmax_scale: Optional[float] = None, causal: bool = False,
                                     window_size: Window = (-1, -1), softcap: float = 0.0,
                                     alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                                     return_attn_probs: bool = False, *,
                                     causal_alignment: str = "bottom_right") -> Result:
    """qkv (T, 3, H, D) with one cu_seqlens / max_seqlen for queries and keys."""
    q, k, v = _unpacked("qkv", qkv, 4, 1, 3, "(total, 3, heads, head_dim)")
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                  dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs, causal_alignment=causal_alignment)
