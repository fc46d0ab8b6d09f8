"""Naive attention in numpy float64: the ground truth of the Python tests.

Semantics are those of flashattn.h (logits s = scale * q.k; softcap s = c * tanh(s / c); ALiBi
s -= slope * |i + off - j|; window i + off - left <= j <= i + off + right; causal = right 0;
off = Sk - Sq (bottom-right) or 0 (top-left); a row with no visible key has out 0 and lse -inf).

With ``storage=<dtype>`` it is instead "a plain low-precision implementation": logits, probabilities,
intermediate products and outputs rounded to the storage dtype as an unfused framework stores them
(as the core's Rounding::kStorage does). Its error against the exact reference sets the tolerance:
the kernel's error must be at most twice that error plus a tiny floor.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Mask:
    causal: bool = False
    top_left: bool = False
    window: tuple = (-1, -1)
    softcap: float = 0.0
    alibi: str = ""  # "", "1d" (Hq) or "2d" (B, Hq)

    def kwargs(self, alibi_slopes=None):
        """Keyword arguments of flashattn.ops.forward/backward for this mask."""
        return dict(causal=self.causal, causal_alignment="top_left" if self.top_left else "bottom_right",
                    window_size=self.window, softcap=self.softcap, alibi_slopes=alibi_slopes)


def _sequences(x, cu):
    """Per-sequence slices of a batched (B, S, H, D) or varlen (T, H, D) array."""
    if cu is None:
        return [x[b] for b in range(x.shape[0])]
    return [x[cu[b]:cu[b + 1]] for b in range(len(cu) - 1)]


class _Round:
    def __init__(self, storage):
        self.storage = storage

    def __call__(self, x):
        if self.storage is None:
            return x
        with np.errstate(over="ignore", invalid="ignore"):
            return np.asarray(x).astype(self.storage).astype(np.float64)


def _logits(qb, kb, slope, mask, scale, rnd):
    """Logits (Hq, Sq, Sk) with -inf where masked, tanh values for softcap's derivative, visibility."""
    sq, sk = qb.shape[0], kb.shape[0]
    group = qb.shape[1] // kb.shape[1]
    kk = np.repeat(kb, group, axis=1)
    s = rnd(rnd(np.einsum("ihd,jhd->hij", qb, kk)) * scale)
    th = np.zeros_like(s)
    if mask.softcap > 0:
        th = np.tanh(s / mask.softcap)
        s = rnd(mask.softcap * th)
    off = 0 if mask.top_left else sk - sq
    diag = np.arange(sq)[:, None] + off
    j = np.arange(sk)[None, :]
    if slope is not None:
        # An unfused framework stores the biased logits too, so the plain implementation rounds them.
        s = rnd(s - slope[:, None, None] * np.abs(diag - j)[None])
    left, right = mask.window
    if mask.causal:
        right = 0
    # Python ints, clamped before numpy's int64 sees them: a side of sq + sk or more reaches every key anyway.
    left, right = (min(int(w), sq + sk) for w in (left, right))
    visible = np.ones((sq, sk), dtype=bool)
    if left >= 0:
        visible &= j >= diag - left
    if right >= 0:
        visible &= j <= diag + right
    s = np.where(visible[None], s, -np.inf)
    return s, th, visible


def _softmax(s):
    """Probabilities and natural-log LSE; rows with no visible key: all 0 and -inf."""
    m = s.max(axis=-1, keepdims=True, initial=-np.inf)
    finite = np.isfinite(m)
    p = np.where(finite, np.exp(s - np.where(finite, m, 0.0)), 0.0)
    denom = p.sum(axis=-1, keepdims=True)
    p = np.where(finite, p / np.where(finite, denom, 1.0), 0.0)
    lse = np.where(finite[..., 0], m[..., 0] + np.log(np.where(finite, denom, 1.0))[..., 0], -np.inf)
    return p, lse


def _slopes(alibi, b):
    if alibi is None:
        return None
    a = np.asarray(alibi, dtype=np.float64)
    return a if a.ndim == 1 else a[b]


def attention(q, k, v, mask=None, *, scale=None, alibi=None, cu_seqlens_q=None, cu_seqlens_k=None,
              seqused_k=None, dout=None, storage=None):
    """Forward (out, lse) and, when dout is given, the gradients (dq, dk, dv), all float64 numpy.

    out/dq/dk/dv have the layout of the inputs; lse is (B, Hq, Sq) batched or (Hq, Tq) varlen.
    """
    mask = Mask() if mask is None else mask
    rnd = _Round(storage)
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    dout = None if dout is None else np.asarray(dout, dtype=np.float64)
    varlen = cu_seqlens_q is not None
    hq, hkv, d = q.shape[-2], k.shape[-2], q.shape[-1]
    group = hq // hkv
    scale = d ** -0.5 if scale is None else scale
    out = np.zeros(q.shape[:-1] + (v.shape[-1],))
    lse = np.zeros((hq, q.shape[0]) if varlen else (q.shape[0], hq, q.shape[1]))
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    qs, ks, vs = _sequences(q, cu_seqlens_q), _sequences(k, cu_seqlens_k), _sequences(v, cu_seqlens_k)
    outs, dqs = _sequences(out, cu_seqlens_q), _sequences(dq, cu_seqlens_q)
    dks, dvs = _sequences(dk, cu_seqlens_k), _sequences(dv, cu_seqlens_k)
    douts = _sequences(dout, cu_seqlens_q) if dout is not None else None
    for b in range(len(qs)):
        used = ks[b].shape[0] if seqused_k is None else int(seqused_k[b])
        qb, kb, vb = qs[b], ks[b][:used], vs[b][:used]
        s, th, _ = _logits(qb, kb, _slopes(alibi, b), mask, scale, rnd)
        p, lse_b = _softmax(s)
        p = rnd(p)
        vv = np.repeat(vb, group, axis=1)
        outs[b][...] = rnd(np.einsum("hij,jhd->ihd", p, vv))
        if varlen:
            lse[:, cu_seqlens_q[b]:cu_seqlens_q[b + 1]] = lse_b
        else:
            lse[b] = lse_b
        if dout is None:
            continue
        db = douts[b]
        dp = rnd(np.einsum("ihd,jhd->hij", db, vv))
        row = (p * dp).sum(axis=-1, keepdims=True)
        dcap = 1.0 - th * th if mask.softcap > 0 else 1.0
        ds = rnd(p * (dp - row) * dcap * scale)
        kk = np.repeat(kb, group, axis=1)
        dqs[b][...] = np.einsum("hij,jhd->ihd", ds, kk)
        sk = kb.shape[0]
        dks[b][:used] = np.einsum("hij,ihd->jhd", ds, qb).reshape(sk, hkv, group, d).sum(axis=2)
        dvs[b][:used] = np.einsum("hij,ihd->jhd", p, db).reshape(sk, hkv, group, vb.shape[-1]).sum(axis=2)
    result = (rnd(out), lse)
    if dout is not None:
        result += (rnd(dq), rnd(dk), rnd(dv))
    return result


def max_error(got, want):
    """Max |got - want| over entries; NaN anywhere, or a mismatch of infinities, is an infinite error."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        raise AssertionError(f"shape {got.shape} != {want.shape}")
    if np.isnan(got).any():
        return np.inf
    inf_w = np.isinf(want)
    if not np.array_equal(np.isinf(got), inf_w) or not np.array_equal(got[inf_w], want[inf_w]):
        return np.inf
    if not (~inf_w).any():
        return 0.0
    return float(np.abs(got[~inf_w] - want[~inf_w]).max())


# The floor of the tolerance, per storage dtype by name: the suites' one rule (docs/testing.md; the core's
# reference::Comparison, bench/gpu/common.tolerance). One unit of rounding of the 16-bit formats; for float32 a
# floor far below any real defect that covers float32 accumulation over long rows. The torch suites key it by
# torch dtype (storage_eps_by(torch)).
STORAGE_EPS_BY_NAME = {"bfloat16": 2.0 ** -7, "float16": 2.0 ** -10, "float32": 1e-6}
STORAGE_EPS = {np.float16: STORAGE_EPS_BY_NAME["float16"], np.float32: STORAGE_EPS_BY_NAME["float32"]}


def storage_eps_by(module) -> dict:
    """STORAGE_EPS_BY_NAME keyed by the dtype objects of an array module (torch: torch.bfloat16, ...)."""
    return {getattr(module, name): eps for name, eps in STORAGE_EPS_BY_NAME.items() if hasattr(module, name)}


def tolerance(exact, plain, dtype):
    finite = np.asarray(exact)[np.isfinite(exact)]
    magnitude = max(1.0, float(np.abs(finite).max())) if finite.size else 1.0
    return 2 * max_error(plain, exact) + STORAGE_EPS[dtype] * magnitude


def assert_close(name, got, exact, plain, dtype):
    """ours <= 2 x (plain low-precision's error) + the floor; NaN never passes."""
    err = max_error(got, exact)
    tol = tolerance(exact, plain, dtype)
    assert err <= tol, (f"{name}: max error {err:.3e} > tolerance {tol:.3e} "
                        f"(plain {dtype.__name__} error {max_error(plain, exact):.3e})")
