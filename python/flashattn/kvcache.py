"""``flash_attn_with_kvcache``: flash_attn 2.x's inference entry point on torch tensors.

One call (i) rotates q and the new keys (rotary embedding, interleaved or half-split, on the first
``rotary_dim`` columns), (ii) writes the new keys and values into the cache in place at ``cache_seqlens``
(contiguous or paged cache), (iii) attends q to the first ``cache_seqlens + new`` keys of each sequence.

The attention reads a contiguous cache in place (its valid length is the kernel's ``seqused_k``), with split-KV
for decode on cuda-sm90. A paged cache (``block_table``) goes to the C ABI's paged K/V (flashattn.h, Paged K/V:
the CPU and cuda-sm90 read the pages in place, sm90 with TMA or cp.async row gathers; cuda-sm80 gathers them in
its workspace).
``cache_batch_idx`` and ``cache_leftpad``, and paged caches under torch.compile or with head dims that need
padding are gathered here into a contiguous copy of the keys each sequence uses. The rotary step and the cache
write are torch operations.

Checks that need the values of device tensors (``cache_seqlens`` + new tokens within the cache, page indices
within the cache) run in eager calls that append or gather (one host synchronisation for all of them) and are
skipped while a CUDA graph is captured or torch.compile traces: there the caller guarantees them. A call that
only reads a contiguous cache checks nothing on the host: the kernels clamp each sequence's key count to the
cache (no synchronisation, capturable). ``torch.compile(fullgraph=True)`` traces a call: the attention is then
the custom op ``flashattn::fwd`` (with the plan's split count).

FP8 caches (FlashAttention-3's): q, k_cache, v_cache (and new k, v) torch.float8_e4m3fn with the float32 factors
``q_descale`` (B, Hkv) or (B, Hq), ``k_descale``, ``v_descale`` (B, Hkv) (flashattn.h, FP8); the new tokens are
appended as they are (quantised with the cache's factors by the caller, as in FlashAttention-3), out bfloat16; paged FP8
caches are read in place (gathered under torch.compile). Not with rotary (it would rotate quantised values) nor head
dims that need padding. Under torch.compile the attention is the custom op ``flashattn::fwd_fp8``.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _C
from .interface import (
    AttnOptions,
    _call,
    _check_no_factors,
    _fail,
    _fp8_bytes,
    _number,
    _optional_tensor,
    _pad_head_dim,
    flash_attn_softcap,
    flash_attn_window,
    positive_scale,
)
from .ops import _export as _dl

__all__ = ["flash_attn_with_kvcache"]


def _check_int32_vector(name: str, t: Tensor, batch: int, device: torch.device) -> None:
    if not isinstance(t, Tensor) or t.dtype != torch.int32 or t.dim() != 1 or t.shape[0] != batch:
        _fail(name, f"must be an int32 tensor of shape ({batch},)")
    if t.device != device:
        _fail(name, f"must be on q's device ({device}, got {t.device})")


def _values_checkable() -> bool:
    if torch.compiler.is_compiling():
        return False
    return not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def _rotate(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
    """x (B, S, H, D) rotated on its first 2 * cos.shape[-1] columns; cos/sin (B, S, rotary_dim / 2), fp32."""
    half = cos.shape[-1]
    rot = x[..., : 2 * half].float()
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    if interleaved:  # pairs (x0, x1), (x2, x3), ...
        x0, x1 = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)
    else:  # GPT-NeoX: (x[:half], x[half:])
        x0, x1 = rot[..., :half], rot[..., half:]
        out = torch.cat((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1)
    return torch.cat((out.to(x.dtype), x[..., 2 * half:]), dim=-1)


def _positions_cos_sin(rotary_cos: Tensor, rotary_sin: Tensor, start: Tensor, length: int, per_token: bool):
    """cos/sin rows at start[b] + i (per_token) or start[b] (every token), (B, length, rotary_dim / 2)."""
    steps = torch.arange(length, device=start.device, dtype=torch.int64) if per_token else \
        torch.zeros(length, device=start.device, dtype=torch.int64)
    pos = start.to(torch.int64)[:, None] + steps[None, :]
    pos = pos.clamp(max=rotary_cos.shape[0] - 1)  # rows past the table are only reached by invalid calls
    return rotary_cos.float()[pos], rotary_sin.float()[pos]


def flash_attn_with_kvcache(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    k: Optional[Tensor] = None,
    v: Optional[Tensor] = None,
    rotary_cos: Optional[Tensor] = None,
    rotary_sin: Optional[Tensor] = None,
    cache_seqlens: Optional[int | Tensor] = None,
    cache_batch_idx: Optional[Tensor] = None,
    cache_leftpad: Optional[Tensor] = None,
    block_table: Optional[Tensor] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: Optional[Tensor] = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
    *,
    q_descale: Optional[Tensor] = None,
    k_descale: Optional[Tensor] = None,
    v_descale: Optional[Tensor] = None,
) -> Tensor | Tuple[Tensor, Tensor]:
    """Attention of q (B, Sq, Hq, D) against a KV cache, appending k/v (B, Snew, Hkv, D/Dv) to it first.

    As flash_attn.flash_attn_with_kvcache (2.x). k_cache/v_cache: (B_cache, Sk, Hkv, D/Dv), or with
    block_table (B, max_pages) int32: (num_pages, page_size, Hkv, D/Dv) of any page size. cache_seqlens: int or
    (B,) int32, the keys already in each sequence's cache (None: the whole cache). cache_batch_idx (B,) int32: the
    cache row of each sequence. cache_leftpad (B,) int32: the first valid key of each row. rotary_cos/sin
    (seqlen_ro, rotary_dim / 2): applied to the new keys at positions cache_seqlens + i, and to q at the same
    positions when causal or windowed (otherwise all of q at cache_seqlens). num_splits: split-KV (0: the plan
    picks). Returns out (B, Sq, Hq, Dv), and softmax_lse (B, Hq, Sq) float32 with return_softmax_lse. FP8 caches:
    q_descale, k_descale, v_descale as FlashAttention-3's (the module docstring).
    """
    if not isinstance(q, Tensor) or q.dim() != 4:
        _fail("q", "must be a 4-D tensor (batch, seqlen_q, heads, head_dim)")
    batch, seqlen_q, heads_q, head_dim = q.shape
    device = q.device
    fp8 = q.dtype == torch.float8_e4m3fn
    if not fp8:
        _check_no_factors(q, q_descale, k_descale, v_descale)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, Tensor) or t.dim() != 4:
            _fail(name, "must be a 4-D tensor (batch or pages, seqlen or page_size, heads_kv, head_dim)")
        if t.device != device or t.dtype != q.dtype:
            _fail(name, f"must have q's device and dtype ({device}, {q.dtype}; got {t.device}, {t.dtype})")
        if t.stride(-1) != 1:
            _fail(name, "must have a unit-stride last dimension (it is written in place)")
    if k_cache.shape[:3] != v_cache.shape[:3]:
        _fail("v_cache", f"must match k_cache in its first three dimensions ({tuple(k_cache.shape[:3])})")
    if k_cache.shape[-1] != head_dim:
        _fail("k_cache", f"head_dim must equal q's ({head_dim}, got {k_cache.shape[-1]})")
    heads_kv, head_dim_v = k_cache.shape[2], v_cache.shape[-1]
    paged = block_table is not None
    if paged:
        if not isinstance(block_table, Tensor) or block_table.dtype != torch.int32 or block_table.dim() != 2 \
                or block_table.shape[0] != batch:
            _fail("block_table", f"must be an int32 tensor of shape ({batch}, max_pages)")
        if block_table.device != device:
            _fail("block_table", f"must be on q's device ({device}, got {block_table.device})")
        if cache_batch_idx is not None:
            _fail("cache_batch_idx", "cannot be combined with block_table (pages already map sequences)")
        if cache_leftpad is not None:
            _fail("cache_leftpad", "cannot be combined with block_table (as in flash_attn)")
        page_size = k_cache.shape[1]
        capacity = block_table.shape[1] * page_size
    else:
        capacity = k_cache.shape[1]
        if cache_batch_idx is None and k_cache.shape[0] != batch:
            _fail("k_cache", f"batch must equal q's ({batch}, got {k_cache.shape[0]}) unless cache_batch_idx maps it")
    if cache_batch_idx is not None:
        _check_int32_vector("cache_batch_idx", cache_batch_idx, batch, device)
    if cache_leftpad is not None:
        _check_int32_vector("cache_leftpad", cache_leftpad, batch, device)

    for name, t in (("k", k), ("v", v), ("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
        _optional_tensor(name, t)
    if (k is None) != (v is None):
        _fail("k" if k is None else "v", "k and v are given together (the new tokens) or not at all")
    new = 0
    if k is not None:
        if k.dim() != 4 or k.shape[0] != batch or k.shape[2] != heads_kv or k.shape[3] != head_dim:
            _fail("k", f"must have shape ({batch}, seqlen_new, {heads_kv}, {head_dim})")
        if v.dim() != 4 or v.shape[:3] != k.shape[:3] or v.shape[3] != head_dim_v:
            _fail("v", f"must have shape ({batch}, {k.shape[1]}, {heads_kv}, {head_dim_v})")
        for name, t in (("k", k), ("v", v)):
            if t.device != device or t.dtype != q.dtype:
                _fail(name, f"must have q's device and dtype ({device}, {q.dtype})")
        new = k.shape[1]
        if cache_seqlens is None:
            _fail("cache_seqlens", "must be given with new keys k/v (where to append them)")

    if cache_seqlens is None:
        seqlens = torch.full((batch,), capacity, dtype=torch.int32, device=device)
    elif isinstance(cache_seqlens, int):
        if cache_seqlens < 0:
            _fail("cache_seqlens", f"must be >= 0 (got {cache_seqlens})")
        seqlens = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=device)
    else:
        _check_int32_vector("cache_seqlens", cache_seqlens, batch, device)
        seqlens = cache_seqlens

    rotary = rotary_cos is not None or rotary_sin is not None
    if rotary and fp8:
        _fail("rotary_cos", "is not applied to float8_e4m3fn q and keys (it would rotate quantised values)")
    if fp8 and (head_dim % 8 or head_dim_v % 8):
        _fail("q", f"float8_e4m3fn head dims must be multiples of 8 (got {head_dim}, {head_dim_v}): no padding")
    if rotary:
        if rotary_cos is None or rotary_sin is None:
            _fail("rotary_cos" if rotary_cos is None else "rotary_sin", "rotary_cos and rotary_sin come together")
        if k is None:
            _fail("rotary_cos", "needs new keys k/v (the rotary embedding is applied to q and the new keys)")
        if rotary_cos.dim() != 2 or rotary_sin.shape != rotary_cos.shape:
            _fail("rotary_cos", "rotary_cos and rotary_sin must both be (seqlen_ro, rotary_dim / 2)")
        if 2 * rotary_cos.shape[1] > head_dim or rotary_cos.shape[1] == 0:
            _fail("rotary_cos", f"rotary_dim (2 * {rotary_cos.shape[1]}) must be in (0, head_dim = {head_dim}]")
        if rotary_cos.device != device or rotary_sin.device != device:
            _fail("rotary_cos", f"must be on q's device ({device})")

    left, right = flash_attn_window(window_size, causal)
    if not isinstance(num_splits, int):
        _fail("num_splits", f"must be an int, 0 = the plan picks (got {num_splits!r})")
    num_splits = max(num_splits, 0)  # flash_attn: any num_splits < 1 is its heuristic's pick
    softcap = flash_attn_softcap(softcap)
    if softmax_scale is not None:
        softmax_scale = _number("softmax_scale", softmax_scale, float)
    _optional_tensor("alibi_slopes", alibi_slopes)

    # Checks on device values, in eager calls that write the cache or gather from it (one host synchronisation
    # for all of them), and in every eager CPU call (no synchronisation to save). A plain CUDA decode call
    # (contiguous cache, nothing appended) reads none: the kernels clamp each sequence's key count to the cache.
    # Paged caches are read by the library itself (the C ABI's block_table) in eager calls whose head dims need no
    # padding, so only an append (a write) checks the table. The CUDA read paths (sm90 TMA boxes, the gathered
    # copy) are tests/gpu/paged_test.cpp's (passed on the H200: bench/results/2026-12-01_h200_session11/).
    native_paged = (paged and not torch.compiler.is_compiling() and head_dim % 8 == 0 and head_dim_v % 8 == 0)
    gathers = (paged and not native_paged) or cache_batch_idx is not None or cache_leftpad is not None
    if (new > 0 or gathers or device.type == "cpu") and _values_checkable():
        checks = [("cache_seqlens", seqlens < 0, "entries must be >= 0"),
                  ("cache_seqlens", seqlens + new > capacity,
                   f"entries + the {new} new tokens must fit the cache's {capacity} slots" if new else
                   f"entries must be at most the cache's {capacity} slots")]
        if cache_leftpad is not None:
            checks.append(("cache_leftpad", (cache_leftpad < 0) | (cache_leftpad > seqlens),
                           "entries must be in [0, cache_seqlens]"))
        if cache_batch_idx is not None:
            checks.append(("cache_batch_idx", (cache_batch_idx < 0) | (cache_batch_idx >= k_cache.shape[0]),
                           f"entries must be in [0, {k_cache.shape[0]})"))
        if rotary:
            reach = seqlens + max(new, seqlen_q if (causal or left >= 0 or right >= 0) else 1)
            checks.append(("rotary_cos", reach > rotary_cos.shape[0],
                           f"has {rotary_cos.shape[0]} positions, fewer than the rotated tokens reach"))
        if paged:
            # The pages each sequence reads or writes; read natively, only the pages the new tokens are written to.
            first = seqlens // page_size if native_paged else torch.zeros_like(seqlens)
            last = (seqlens + new + page_size - 1) // page_size
            idx = torch.arange(block_table.shape[1], device=device)[None, :]
            live = (idx >= first[:, None]) & (idx < last[:, None])
            checks.append(("block_table", live & ((block_table < 0) | (block_table >= k_cache.shape[0])),
                           f"page indices of used pages must be in [0, {k_cache.shape[0]})"))
        failed = torch.stack([bad.any() for _, bad, _ in checks]).tolist()
        for (name, _, rule), bad in zip(checks, failed):
            if bad:
                _fail(name, rule)

    # (i) rotary on q and the new keys.
    if rotary:
        cos_k, sin_k = _positions_cos_sin(rotary_cos, rotary_sin, seqlens, new, True)
        k = _rotate(k, cos_k, sin_k, rotary_interleaved)
        per_token = causal or left >= 0 or right >= 0
        cos_q, sin_q = _positions_cos_sin(rotary_cos, rotary_sin, seqlens, seqlen_q, per_token)
        q = _rotate(q, cos_q, sin_q, rotary_interleaved)

    # (ii) the new tokens into the cache, in place (FP8: as bytes).
    if new > 0:
        pos = seqlens.to(torch.int64)[:, None] + torch.arange(new, device=device)[None, :]  # (B, new)
        if paged:
            page = block_table.to(torch.int64).gather(1, torch.div(pos, page_size, rounding_mode="floor"))
            slot = pos % page_size
            _fp8_bytes(k_cache)[page, slot] = _fp8_bytes(k)
            _fp8_bytes(v_cache)[page, slot] = _fp8_bytes(v)
        else:
            rows = (torch.arange(batch, device=device) if cache_batch_idx is None
                    else cache_batch_idx.to(torch.int64))[:, None].expand(batch, new)
            _fp8_bytes(k_cache)[rows, pos] = _fp8_bytes(k)
            _fp8_bytes(v_cache)[rows, pos] = _fp8_bytes(v)
    used = seqlens + new if new else seqlens  # keys each sequence attends to (before leftpad)

    # (iii) attention over the valid keys.
    if native_paged:
        k_keys, v_keys = k_cache, v_cache
    elif paged:
        # Entries past a sequence's used pages may hold anything (their keys are past seqused_k): any valid page.
        table = block_table.to(torch.int64).clamp(0, k_cache.shape[0] - 1)
        k_keys = _fp8_bytes(k_cache)[table].flatten(1, 2)  # (B, max_pages * page_size, Hkv, D)
        v_keys = _fp8_bytes(v_cache)[table].flatten(1, 2)
    elif cache_batch_idx is not None:
        k_keys = _fp8_bytes(k_cache).index_select(0, cache_batch_idx.to(torch.int64))
        v_keys = _fp8_bytes(v_cache).index_select(0, cache_batch_idx.to(torch.int64))
    else:
        k_keys, v_keys = _fp8_bytes(k_cache), _fp8_bytes(v_cache)
    if cache_leftpad is not None:
        # Keys [leftpad, used) of each row, moved to the front.
        idx = (cache_leftpad.to(torch.int64)[:, None] + torch.arange(capacity, device=device)[None, :])
        idx = idx.clamp(max=capacity - 1)
        k_keys = k_keys.gather(1, idx[:, :, None, None].expand(-1, -1, heads_kv, head_dim))
        v_keys = v_keys.gather(1, idx[:, :, None, None].expand(-1, -1, heads_kv, head_dim_v))
        used = used - cache_leftpad
    if fp8:  # k_keys, v_keys are the caches' bytes (uint8 views or gathered copies)
        scale = None if softmax_scale is None else float(softmax_scale)
        if torch.compiler.is_compiling():  # traced: the FP8 custom op (a paged cache was gathered above)
            out, lse = torch.ops.flashattn.fwd_fp8(
                q, k_keys.view(torch.float8_e4m3fn), v_keys.view(torch.float8_e4m3fn), q_descale, k_descale,
                v_descale, *AttnOptions(seqused_k=used.to(torch.int32), softmax_scale=scale, window_left=left,
                                        window_right=right, softcap=float(softcap), alibi_slopes=alibi_slopes))
            return (out, lse) if return_softmax_lse else out
        out = torch.empty(q.shape[:-1] + (head_dim_v,), dtype=torch.bfloat16, device=device)
        lse = torch.empty((batch, heads_q, seqlen_q), dtype=torch.float32, device=device)
        _call(_C.forward, q, _dl(_fp8_bytes(q)), _dl(k_keys), _dl(v_keys), _dl(out), _dl(lse),
              seqused_k=_dl(used.to(torch.int32)), softmax_scale=scale, causal=False, window_left=left,
              window_right=right, softcap=float(softcap), alibi_slopes=_dl(alibi_slopes), num_splits=num_splits,
              block_table=_dl(block_table) if native_paged else None, fp8=True, q_descale=_dl(q_descale),
              k_descale=_dl(k_descale), v_descale=_dl(v_descale))
        return (out, lse) if return_softmax_lse else out
    q, softmax_scale = positive_scale(q, softmax_scale)  # flash_attn takes a scale <= 0 too
    if softmax_scale is None and head_dim % 8 != 0:
        softmax_scale = head_dim ** -0.5  # of the real head dim (the kernels see it padded)
    q_in, k_in, v_in = (_pad_head_dim(t, name) for t, name in ((q, "q"), (k_keys, "k_cache"), (v_keys, "v_cache")))
    q_in = q_in if q_in.stride(-1) == 1 else q_in.contiguous()
    scale = None if softmax_scale is None else float(softmax_scale)
    used = used.to(torch.int32)
    if torch.compiler.is_compiling():
        # Traced: the attention is the custom op flashattn::fwd (seqused_k = the keys in use; num_splits is the
        # plan's), the rotary and the cache append the torch operations above.
        out, lse = torch.ops.flashattn.fwd(q_in, k_in, v_in, *AttnOptions(seqused_k=used, softmax_scale=scale,
                                                                          window_left=left, window_right=right,
                                                                          softcap=float(softcap),
                                                                          alibi_slopes=alibi_slopes))
    else:
        out = q_in.new_empty(q_in.shape[:-1] + v_in.shape[-1:])
        lse = q_in.new_empty((batch, heads_q, seqlen_q), dtype=torch.float32)
        _call(_C.forward, q_in, _dl(q_in), _dl(k_in), _dl(v_in), _dl(out), _dl(lse), seqused_k=_dl(used),
              softmax_scale=scale, causal=False, window_left=left, window_right=right, softcap=float(softcap),
              alibi_slopes=_dl(alibi_slopes), num_splits=num_splits,
              block_table=_dl(block_table) if native_paged else None)
    if out.shape[-1] != head_dim_v:
        out = out[..., :head_dim_v]
    return (out, lse) if return_softmax_lse else out
