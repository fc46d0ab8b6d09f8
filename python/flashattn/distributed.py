"""Context parallelism: ring attention over ``torch.distributed`` for sequences sharded across ranks.

Each rank holds a shard of the sequence (dimension 1 of (B, S, H, D) tensors). Its queries stay; the K/V
shards travel around the ring (send to rank + 1, receive from rank - 1, ``batch_isend_irecv``: NCCL on CUDA,
gloo on CPU), the next shard's transfer overlapping the attention of the current one. Every step yields the
attention of the local queries over one shard with its log-sum-exp, and the partial results merge exactly:
``lse = logaddexp(lse_a, lse_b)``, ``out = out_a e^(lse_a - lse) + out_b e^(lse_b - lse)`` (fp32). The backward
runs the same ring with the final out and lse, each step's dK/dV travelling with its K/V back to the owner.

Layouts (``layout=``):
  * "contiguous": rank r holds positions [offset_r, offset_r + S_r) in rank order (any lengths).
  * "zigzag" (causal load balance): the sequence is cut into 2W chunks as ``torch.tensor_split(x, 2W, dim=1)``
    cuts it, and rank r holds chunks r and 2W-1-r, concatenated (``zigzag_shard``): every rank then does the
    same causal work. ``zigzag_unshard`` puts a gathered result back in order.

Masks: full, causal (bottom-right of the whole sequence equals top-left here: queries and keys are the same
positions) and sliding windows; softcap, GQA/MQA, any head dim of the kernels. A window's band of visible keys,
seen from one (query segment, key segment) pair of shards, is a band of the local diagonal shifted by the
segments' position offset; dropping the keys (or queries) before the band makes it touch the local diagonal, so
every pair is one top-left-aligned windowed call (``_Ring.window_pieces``). ALiBi across shards would need that
offset inside the bias and is refused (NotImplementedError).

Varlen (``ring_flash_attn_varlen_func``): packed sequences as flash_attn_varlen_func takes them; every rank holds
its shard (contiguous or zigzag) of each sequence, and each step runs one call per sequence (per segment pair
under a mask), each sequence attending only to itself.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from . import ops as _ops
from .interface import AttnOptions, _bwd_impl, _fwd_impl, _kernel_layout, _pad_head_dim
from .ops import window_pair

__all__ = ["ring_flash_attn_func", "ring_flash_attn_varlen_func", "varlen_shard", "zigzag_shard", "zigzag_unshard",
           "merge_partials"]


def zigzag_shard(x: Tensor, rank: int, world: int, dim: int = 1) -> Tensor:
    """Rank `rank`'s zigzag shard of a full sequence: chunks rank and 2*world-1-rank of 2*world."""
    chunks = torch.tensor_split(x, 2 * world, dim=dim)
    return torch.cat((chunks[rank], chunks[2 * world - 1 - rank]), dim=dim)


def zigzag_unshard(shards: Sequence[Tensor], dim: int = 1) -> Tensor:
    """The full sequence from every rank's zigzag shard (in rank order), e.g. after an all_gather."""
    world = len(shards)
    total = sum(s.shape[dim] for s in shards)
    sizes = _chunk_sizes(total, 2 * world)
    chunks: List[Optional[Tensor]] = [None] * (2 * world)
    for r, s in enumerate(shards):
        a, b = torch.split(s, [sizes[r], sizes[2 * world - 1 - r]], dim=dim)
        chunks[r], chunks[2 * world - 1 - r] = a, b
    return torch.cat(chunks, dim=dim)


def _chunk_sizes(total: int, n: int) -> List[int]:
    # torch.tensor_split's sizes: the first total % n chunks are one longer.
    return [total // n + (1 if i < total % n else 0) for i in range(n)]


def merge_partials(out: Tensor, lse: Tensor, out_b: Tensor, lse_b: Tensor) -> Tuple[Tensor, Tensor]:
    """Exact merge of two attentions of the same queries over disjoint key sets: out (B, S, H, D), lse (B, H, S),
    returned in fp32 (new tensors; the ring merges in place with ``flashattn.ops.merge_partials``, the C ABI's
    fa_merge_partials). A row that saw no key in one part (lse -inf) takes the other part; in neither, 0 and -inf."""
    merged, merged_lse = out.float().clone(), lse.float().clone()
    return _ops.merge_partials(merged, merged_lse, out_b, lse_b.float())


class _Ring:
    """Who holds which positions, and which (query rows, key rows) of each step attend and how."""

    def __init__(self, group, local_len: int, layout: str, device, cu_seqlens: Optional[Sequence[int]] = None):
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        lens = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(self.world)]
        dist.all_gather(lens, torch.tensor([local_len], dtype=torch.int64, device=device), group=group)
        self.lens = [int(x.item()) for x in lens]
        self.layout = layout
        # Varlen: the packed sequences' lengths; every rank holds its shard of each sequence, in sequence order.
        self.seq_lens = None
        if cu_seqlens is not None:
            self.seq_lens = [int(cu_seqlens[b + 1]) - int(cu_seqlens[b]) for b in range(len(cu_seqlens) - 1)]
            for r in range(self.world):
                want = sum(length for seq in self.varlen_segments(r) for _, length, _ in seq)
                if self.lens[r] != want:
                    raise ValueError(f"q: rank {r} holds {self.lens[r]} rows, not its shards' {want} of the sequences "
                                     f"in cu_seqlens (use varlen_shard)")
        elif layout == "zigzag":
            sizes = _chunk_sizes(sum(self.lens), 2 * self.world)
            self.split = [sizes[r] for r in range(self.world)]  # length of each rank's first chunk
            for r in range(self.world):
                if self.lens[r] != sizes[r] + sizes[2 * self.world - 1 - r]:
                    raise ValueError(f"q: rank {r} holds {self.lens[r]} positions, not its zigzag chunks' "
                                     f"{sizes[r] + sizes[2 * self.world - 1 - r]} (use zigzag_shard)")
        self.next = dist.get_global_rank(group, (self.rank + 1) % self.world) if group is not None else \
            (self.rank + 1) % self.world
        self.prev = dist.get_global_rank(group, (self.rank - 1) % self.world) if group is not None else \
            (self.rank - 1) % self.world

    def pieces(self, src: int, causal: bool):
        """(q slice, k slice, causal) triples of this rank's queries against rank `src`'s keys, [] if none."""
        n_q, n_k = self.lens[self.rank], self.lens[src]
        if not causal:
            return [(slice(0, n_q), slice(0, n_k), False)]
        if self.layout == "contiguous":
            if src == self.rank:
                return [(slice(0, n_q), slice(0, n_k), True)]
            return [(slice(0, n_q), slice(0, n_k), False)] if src < self.rank else []
        # zigzag: local = [chunk r, chunk 2W-1-r]; src holds [chunk s, chunk 2W-1-s].
        if src == self.rank:
            return [(slice(0, n_q), slice(0, n_k), True)]  # causal over the local concatenation
        if src < self.rank:
            return [(slice(0, n_q), slice(0, self.split[src]), False)]  # chunk s precedes both local chunks
        return [(slice(self.split[self.rank], n_q), slice(0, n_k), False)]  # only the late chunk sees src

    def segments(self, r: int) -> List[Tuple[int, int, int]]:
        """(local start, length, global position of the first) of each run of consecutive positions rank r holds."""
        if self.layout == "contiguous":
            return [(0, self.lens[r], sum(self.lens[:r]))]
        sizes = _chunk_sizes(sum(self.lens), 2 * self.world)
        late = 2 * self.world - 1 - r
        return [(0, sizes[r], sum(sizes[:r])), (sizes[r], sizes[late], sum(sizes[:late]))]

    def window_pieces(self, src: int, left: int, right: int):
        """(q slice, k slice, options) of this rank's queries against rank `src`'s keys under the window
        [i - left, i + right] of global positions (-1: unbounded side): one top-left-aligned windowed call per
        (query segment, key segment) pair that sees anything."""
        return _band_pieces(self.segments(self.rank), self.segments(src), left, right)

    def varlen_segments(self, r: int) -> List[List[Tuple[int, int, int]]]:
        """Per sequence: (local row, length, position in the sequence) of each run of rank r's shard of it."""
        out, row = [], 0
        for n in self.seq_lens:
            if self.layout == "contiguous":
                sizes = _chunk_sizes(n, self.world)
                runs = [(sum(sizes[:r]), sizes[r])]
            else:
                sizes = _chunk_sizes(n, 2 * self.world)
                late = 2 * self.world - 1 - r
                runs = [(sum(sizes[:r]), sizes[r]), (sum(sizes[:late]), sizes[late])]
            seq = []
            for pos, length in runs:
                seq.append((row, length, pos))
                row += length
            out.append(seq)
        return out

    def varlen_pieces(self, src: int, causal: bool, window: Tuple[int, int]):
        """The pieces of a varlen step: per sequence, its rows here against its rows of rank `src` (one call per
        sequence without a mask, one per segment pair under causal or a window)."""
        left, right = window[0], 0 if causal else window[1]
        pieces = []
        for q_seq, k_seq in zip(self.varlen_segments(self.rank), self.varlen_segments(src)):
            if left < 0 and right < 0:
                q0, qn = q_seq[0][0], sum(length for _, length, _ in q_seq)
                k0, kn = k_seq[0][0], sum(length for _, length, _ in k_seq)
                if qn and kn:
                    pieces.append((slice(q0, q0 + qn), slice(k0, k0 + kn), dict(causal=False)))
            else:
                pieces += _band_pieces(q_seq, k_seq, left, right)
        return pieces

    def exchange(self, tensors: Sequence[Tensor], src_after: int):
        """Starts sending `tensors` to the next rank and receiving the previous rank's (those of rank
        `src_after`); returns (requests, receive buffers)."""
        n = self.lens[src_after]
        bufs = [torch.empty((t.shape[0], n) + tuple(t.shape[2:]), dtype=t.dtype, device=t.device) for t in tensors]
        ops = [dist.P2POp(dist.isend, t.contiguous(), self.next, self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, b, self.prev, self.group) for b in bufs]
        # The ops (and the tensors they send) stay referenced until the requests complete.
        return (dist.batch_isend_irecv(ops), ops), bufs


def _band_pieces(q_segs, k_segs, left: int, right: int):
    """(q slice, k slice, options) per (query segment, key segment) pair that sees anything under the window
    [i - left, i + right] of positions (-1: unbounded side); a segment is (local row, length, position)."""
    inf = float("inf")
    pieces = []
    for qa, qn, qg in q_segs:
        for ka, kn, kg in k_segs:
            if qn == 0 or kn == 0:
                continue
            # Local query i sees local key j when lo <= j - i <= hi.
            delta = qg - kg
            lo = delta - left if left >= 0 else -inf
            hi = delta + right if right >= 0 else inf
            if hi < -(qn - 1) or lo > kn - 1:
                continue  # no (i, j) of the pair inside the band
            # Keys before the band's start (lo > 0) and queries before its first key (hi < 0) see nothing: without
            # them the band touches the local diagonal, lo <= 0 <= hi.
            s = int(lo) if lo > 0 else 0
            t = int(-hi) if hi < 0 else 0
            lo, hi, qn_, kn_ = lo - s + t, hi - s + t, qn - t, kn - s
            opts = dict(causal=False, top_left=True,
                        window_left=-1 if lo <= -(qn_ - 1) else int(-lo),
                        window_right=-1 if hi >= kn_ - 1 else int(hi))
            pieces.append((slice(qa + t, qa + qn), slice(ka + s, ka + kn), opts))
    return pieces


def _wait(pending):
    reqs, _ops = pending
    for r in reqs:
        r.wait()


def _pieces(ring: _Ring, src: int, causal: bool, window: Tuple[int, int]):
    """(q slice, k slice, mask options) of one ring step."""
    if ring.seq_lens is not None:
        return ring.varlen_pieces(src, causal, window)
    if window == (-1, -1):
        return [(qs, ks, dict(causal=c)) for qs, ks, c in ring.pieces(src, causal)]
    return ring.window_pieces(src, window[0], 0 if causal else window[1])


def _block_fwd(q, k, v, mask, scale, softcap):
    q, k, v = (_kernel_layout(t) for t in (q, k, v))
    return _fwd_impl(q, k, v, *AttnOptions(softmax_scale=scale, softcap=softcap, **mask))


def _block_bwd(dout, q, k, v, out, lse, mask, scale, softcap, deterministic):
    dout, q, k, v, out = (_kernel_layout(t) for t in (dout, q, k, v, out))
    lse = lse.contiguous()
    dq, dk, dv, _ = _bwd_impl(dout, q, k, v, out, lse,
                              *AttnOptions(softmax_scale=scale, softcap=softcap, deterministic=deterministic,
                                           **mask))
    return dq, dk, dv


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, causal, window, scale, softcap, layout, deterministic, cu_seqlens):
        ring = _Ring(group, q.shape[1], layout, q.device, cu_seqlens)
        out = torch.zeros(q.shape[:-1] + v.shape[-1:], dtype=torch.float32, device=q.device)
        lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), float("-inf"), device=q.device)
        k_cur, v_cur = k, v
        for step in range(ring.world):
            src = (ring.rank - step) % ring.world
            pending = None
            if step + 1 < ring.world:  # the next shard moves while this one is attended
                pending = ring.exchange((k_cur, v_cur), (ring.rank - step - 1) % ring.world)
            for qs, ks, mask in _pieces(ring, src, causal, window):
                o_b, l_b = _block_fwd(q[:, qs], k_cur[:, ks], v_cur[:, ks], mask, scale, softcap)
                _ops.merge_partials(out[:, qs], lse[:, :, qs], o_b, l_b)  # in place, fp32
            if pending is not None:
                _wait(pending[0])
                k_cur, v_cur = pending[1]
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring, ctx.causal, ctx.window, ctx.scale, ctx.softcap = ring, causal, window, scale, softcap
        ctx.deterministic = deterministic
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        ring = ctx.ring
        dout = dout.contiguous()
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        k_cur, v_cur = k, v
        dk_cur = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
        dv_cur = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
        for step in range(ring.world):
            src = (ring.rank - step) % ring.world
            after = (ring.rank - step - 1) % ring.world  # whose shard arrives next
            kv = ring.exchange((k_cur, v_cur), after) if step + 1 < ring.world else None
            for qs, ks, mask in _pieces(ring, src, ctx.causal, ctx.window):
                dq_b, dk_b, dv_b = _block_bwd(dout[:, qs], q[:, qs], k_cur[:, ks], v_cur[:, ks], out[:, qs],
                                              lse[:, :, qs], mask, ctx.scale, ctx.softcap, ctx.deterministic)
                dq[:, qs] += dq_b.float()
                dk_cur[:, ks] += dk_b.float()
                dv_cur[:, ks] += dv_b.float()
            # The gradients gathered so far follow their K/V to the next rank; after the last step they make one
            # more hop, back to their owner (this rank then holds the shard of rank + 1).
            if ring.world > 1:
                reqs, bufs = ring.exchange((dk_cur, dv_cur), after)
                _wait(reqs)
                dk_cur, dv_cur = bufs
            if kv is not None:
                _wait(kv[0])
                k_cur, v_cur = kv[1]
        return (dq.to(q.dtype), dk_cur.to(k.dtype), dv_cur.to(v.dtype)) + (None,) * 9


def ring_flash_attn_func(q: Tensor, k: Tensor, v: Tensor, group=None, causal: bool = False,
                         softmax_scale: Optional[float] = None, window_size: Tuple[int, int] = (-1, -1),
                         softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                         return_attn_probs: bool = False, *, layout: str = "zigzag"):
    """Attention of this rank's queries over the whole sharded sequence (flash_attn_func's arguments).

    q (B, S_r, Hq, D), k (B, S_r, Hkv, D), v (B, S_r, Hkv, Dv): this rank's shard of dimension 1 in `layout`
    ("zigzag" or "contiguous"); every rank of `group` (default: the world) calls it with its shard. Returns this
    rank's rows of out (B, S_r, Hq, Dv), and with return_attn_probs (out, lse (B, Hq, S_r), None).
    Differentiable in q, k, v.
    """
    window = _ring_options(layout, window_size, alibi_slopes)
    _check_shards(q, k, v, 4, "(batch, seqlen_shard, heads, head_dim)",
                  "the shard of keys must hold the same positions as the shard of queries")
    out, lse = _ring_call(q, k, v, group, causal, window, softmax_scale, softcap, layout, deterministic, None)
    return (out, lse, None) if return_attn_probs else out


def _ring_options(layout: str, window_size, alibi_slopes) -> Tuple[int, int]:
    """The checks of the options both ring functions take; returns the window."""
    if layout not in ("zigzag", "contiguous"):
        raise ValueError(f"layout: must be 'zigzag' or 'contiguous' (got {layout!r})")
    window = window_pair(window_size)
    if window[0] < -1 or window[1] < -1:
        raise ValueError(f"window_size: each side must be >= -1, -1 = unbounded (got {tuple(window_size)})")
    if alibi_slopes is not None:
        raise NotImplementedError("alibi_slopes: ALiBi across shards is not supported by ring attention")
    return window


def _check_shards(q, k, v, rank: int, shape: str, same_positions: str):
    """q, k, v have `rank` dimensions (`shape` says which), and k and v the positions of q (the dimension before
    the heads)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != rank:
            raise ValueError(f"{name}: must be {shape}")
    rows = rank - 3
    if k.shape[rows] != q.shape[rows] or v.shape[rows] != q.shape[rows]:
        raise ValueError(f"k: {same_positions}")


def _ring_call(q, k, v, group, causal, window, softmax_scale, softcap, layout, deterministic, cu_seqlens):
    """The ring over (B, S_r, H, D) shards (varlen: B = 1 and cu_seqlens): head dims padded to a multiple of 8 (the
    scale of the real one), out sliced back to v's head dim."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("group: torch.distributed is not initialised (init_process_group first)")
    head_dim_v = v.shape[-1]
    scale = softmax_scale
    if scale is None and q.shape[-1] % 8 != 0:
        scale = q.shape[-1] ** -0.5
    q, k, v = (_pad_head_dim(t, name) for t, name in ((q, "q"), (k, "k"), (v, "v")))
    out, lse = _RingAttention.apply(q, k, v, group, bool(causal), window, None if scale is None else float(scale),
                                    float(softcap), layout, bool(deterministic), cu_seqlens)
    return (out if out.shape[-1] == head_dim_v else out[..., :head_dim_v]), lse


def varlen_shard(x: Tensor, cu_seqlens, rank: int, world: int, layout: str = "zigzag", dim: int = 0) -> Tensor:
    """Rank `rank`'s rows of packed sequences (cu_seqlens: their prefix sums): its shard of each sequence (the
    contiguous or zigzag cut of ``tensor_split``), concatenated in sequence order."""
    cu = [int(c) for c in cu_seqlens]
    parts = []
    for b in range(len(cu) - 1):
        seq = x.narrow(dim, cu[b], cu[b + 1] - cu[b])
        parts.append(zigzag_shard(seq, rank, world, dim) if layout == "zigzag"
                     else torch.tensor_split(seq, world, dim=dim)[rank])
    return torch.cat(parts, dim=dim)


def ring_flash_attn_varlen_func(q: Tensor, k: Tensor, v: Tensor, cu_seqlens, group=None, causal: bool = False,
                                softmax_scale: Optional[float] = None, window_size: Tuple[int, int] = (-1, -1),
                                softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None,
                                deterministic: bool = False, return_attn_probs: bool = False, *,
                                layout: str = "zigzag"):
    """Ring attention over packed sequences (flash_attn_varlen_func's layout): q (T_r, Hq, D), k/v (T_r, Hkv, D/Dv)
    are this rank's rows, its shard of every sequence (``varlen_shard``); cu_seqlens (B + 1) the prefix sums of the
    whole sequences' lengths, the same on every rank (read on the host). Each sequence attends only to itself.
    Returns out (T_r, Hq, Dv), and with return_attn_probs (out, lse (Hq, T_r), None). Differentiable in q, k, v."""
    window = _ring_options(layout, window_size, alibi_slopes)
    _check_shards(q, k, v, 3, "(rows, heads, head_dim), the packed rows of this rank",
                  "the rows of keys must be the positions of the rows of queries")
    cu = [int(c) for c in (cu_seqlens.tolist() if isinstance(cu_seqlens, Tensor) else cu_seqlens)]
    if len(cu) < 1 or cu[0] != 0 or any(b < a for a, b in zip(cu, cu[1:])):
        raise ValueError("cu_seqlens: must start at 0 and be non-decreasing (prefix sums of the sequence lengths)")
    out, lse = _ring_call(q[None], k[None], v[None], group, causal, window, softmax_scale, softcap, layout,
                          deterministic, tuple(cu))
    return (out[0], lse[0], None) if return_attn_probs else out[0]
