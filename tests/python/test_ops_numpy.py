"""flashattn.ops (the torch-free binding) on numpy arrays: the CPU backend against a float64 reference.

Every output is poisoned with NaN before the call, inputs are fresh random values, and the error must be
at most twice that of a plain low-precision implementation (see fa_reference.py). Runs in CI: needs only
numpy and pytest.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import flashattn
from flashattn import ops

from fa_reference import Mask, assert_close, attention, max_error

DTYPES = [np.float32, np.float16]

# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, head_dim_v)
SHAPES = [
    (1, 1, 1, 1, 1, 8, 8),
    (2, 17, 17, 4, 2, 64, 64),  # GQA 2:1
    (1, 239, 128, 3, 1, 32, 40),  # MQA, Sq > Sk (bottom-right causal masks whole rows), Dv != D
    (2, 13, 77, 2, 2, 128, 128),  # Sq < Sk
    (1, 1023, 1024, 1, 1, 64, 64),
]

MASKS = {
    "none": Mask(),
    "causal": Mask(causal=True),
    "causal_top_left": Mask(causal=True, top_left=True),
    "window": Mask(window=(5, 3)),
    "window_left_causal": Mask(causal=True, window=(7, -1)),
    "softcap": Mask(softcap=5.0),
    "alibi": Mask(alibi="1d"),
    "alibi_batch_causal": Mask(alibi="2d", causal=True),
    "all": Mask(causal=True, top_left=True, window=(9, 0), softcap=3.0, alibi="1d"),
}


def _random(rng, shape, dtype, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def _poison(shape, dtype):
    return np.full(shape, np.nan, dtype=dtype)


def _slopes(rng, mask, batch, heads):
    if mask.alibi == "1d":
        return rng.uniform(0.05, 1.0, heads).astype(np.float32)
    if mask.alibi == "2d":
        return rng.uniform(0.05, 1.0, (batch, heads)).astype(np.float32)
    return None


def _problem(seed, shape, dtype):
    b, sq, sk, hq, hkv, d, dv = shape
    rng = np.random.default_rng(seed)
    q = _random(rng, (b, sq, hq, d), dtype)
    k = _random(rng, (b, sk, hkv, d), dtype)
    v = _random(rng, (b, sk, hkv, dv), dtype)
    dout = _random(rng, (b, sq, hq, dv), dtype)
    return rng, q, k, v, dout


def _check_forward(q, k, v, mask, alibi, dtype, **kw):
    out = _poison(q.shape[:-1] + (v.shape[-1],), dtype)
    lse_shape = (q.shape[1], q.shape[0]) if q.ndim == 3 else (q.shape[0], q.shape[2], q.shape[1])
    lse = _poison(lse_shape, np.float32)
    got_out, got_lse = ops.forward(q, k, v, out=out, lse=lse, **mask.kwargs(alibi), **kw)
    assert got_out is out and got_lse is lse
    ref_kw = {key: kw[key] for key in ("cu_seqlens_q", "cu_seqlens_k", "seqused_k") if key in kw}
    scale = kw.get("softmax_scale")
    exact_out, exact_lse = attention(q, k, v, mask, alibi=alibi, scale=scale, **ref_kw)
    plain_out, plain_lse = attention(q, k, v, mask, alibi=alibi, scale=scale, storage=dtype, **ref_kw)
    assert_close("out", out, exact_out, plain_out, dtype)
    assert_close("lse", lse, exact_lse, plain_lse, np.float32)
    return out, lse, exact_out, exact_lse


@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: t.__name__)
def test_forward(dtype, shape, mask_name):
    mask = MASKS[mask_name]
    rng, q, k, v, _ = _problem(1, shape, dtype)
    alibi = _slopes(rng, mask, shape[0], shape[3])
    _, lse, exact_out, exact_lse = _check_forward(q, k, v, mask, alibi, dtype)
    # Rows with no visible key (bottom-right causal with Sq > Sk, narrow windows) are out 0, lse -inf;
    # make sure the grid really has some, so that rule is exercised.
    if mask.causal and not mask.top_left and shape[1] > shape[2]:
        assert np.isneginf(exact_lse).any() and np.isneginf(lse).any()


BWD_SHAPES = [
    (1, 1, 1, 1, 1, 8, 8),
    (2, 17, 17, 4, 2, 64, 64),
    (1, 45, 31, 3, 1, 32, 40),
    (1, 19, 70, 2, 2, 128, 64),
]


@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize("shape", BWD_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: t.__name__)
def test_backward(dtype, shape, mask_name):
    mask = MASKS[mask_name]
    rng, q, k, v, dout = _problem(2, shape, dtype)
    alibi = _slopes(rng, mask, shape[0], shape[3])
    out, lse = ops.forward(q, k, v, **mask.kwargs(alibi))
    dq, dk, dv = (_poison(x.shape, dtype) for x in (q, k, v))
    ops.backward(dout, q, k, v, out, lse, dq=dq, dk=dk, dv=dv, **mask.kwargs(alibi))
    exact = attention(q, k, v, mask, alibi=alibi, dout=dout)
    plain = attention(q, k, v, mask, alibi=alibi, dout=dout, storage=dtype)
    for name, got, e, p in zip(("dq", "dk", "dv"), (dq, dk, dv), exact[2:], plain[2:]):
        assert_close(name, got, e, p, dtype)


def test_reference_gradients_match_finite_differences():
    """The analytic float64 backward of the reference against central differences of its forward."""
    rng = np.random.default_rng(3)
    b, sq, sk, hq, hkv, d = 1, 5, 7, 4, 2, 8
    q, k, v = (rng.standard_normal(s) for s in ((b, sq, hq, d), (b, sk, hkv, d), (b, sk, hkv, d)))
    dout = rng.standard_normal((b, sq, hq, d))
    alibi = rng.uniform(0.1, 0.5, hq)
    mask = Mask(causal=True, window=(3, -1), softcap=2.0, alibi="1d")
    _, _, dq, dk, dv = attention(q, k, v, mask, alibi=alibi, dout=dout, scale=0.7)
    step = 1e-6
    for x, grad in ((q, dq), (k, dk), (v, dv)):
        for idx in itertools.islice(np.ndindex(x.shape), 0, None, 7):
            saved = x[idx]
            x[idx] = saved + step
            up = (attention(q, k, v, mask, alibi=alibi, scale=0.7)[0] * dout).sum()
            x[idx] = saved - step
            down = (attention(q, k, v, mask, alibi=alibi, scale=0.7)[0] * dout).sum()
            x[idx] = saved
            assert abs((up - down) / (2 * step) - grad[idx]) < 1e-6 * max(1.0, abs(grad[idx]))


def _varlen_problem(seed, lens_q, lens_k, hq, hkv, d, dv, dtype):
    rng = np.random.default_rng(seed)
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q = _random(rng, (cu_q[-1], hq, d), dtype)
    k = _random(rng, (cu_k[-1], hkv, d), dtype)
    v = _random(rng, (cu_k[-1], hkv, dv), dtype)
    dout = _random(rng, (cu_q[-1], hq, dv), dtype)
    return rng, cu_q, cu_k, q, k, v, dout


VARLEN_LENS = [
    ([5, 0, 17, 1, 33], [9, 4, 17, 1, 20]),  # an empty query sequence, Sq > Sk and Sq < Sk
    ([64, 3], [64, 130]),
]


@pytest.mark.parametrize("mask_name", ["none", "causal", "causal_top_left", "window", "alibi_batch_causal", "all"])
@pytest.mark.parametrize("lens", VARLEN_LENS, ids=["mixed", "two"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: t.__name__)
def test_varlen(dtype, lens, mask_name):
    mask = MASKS[mask_name]
    rng, cu_q, cu_k, q, k, v, dout = _varlen_problem(4, *lens, 4, 2, 32, 32, dtype)
    alibi = _slopes(rng, mask, len(lens[0]), 4)
    kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    out, lse, _, _ = _check_forward(q, k, v, mask, alibi, dtype, **kw)
    dq, dk, dv = (_poison(x.shape, dtype) for x in (q, k, v))
    ops.backward(dout, q, k, v, out, lse, dq=dq, dk=dk, dv=dv, **kw, **mask.kwargs(alibi))
    exact = attention(q, k, v, mask, alibi=alibi, dout=dout, **kw)
    plain = attention(q, k, v, mask, alibi=alibi, dout=dout, storage=dtype, **kw)
    for name, got, e, p in zip(("dq", "dk", "dv"), (dq, dk, dv), exact[2:], plain[2:]):
        assert_close(name, got, e, p, dtype)


def test_varlen_equals_batched_per_sequence():
    """Each varlen sequence gives what a batch of one of that sequence gives (bit for bit in float32)."""
    lens_q, lens_k = [7, 30, 1], [12, 30, 50]
    _, cu_q, cu_k, q, k, v, _ = _varlen_problem(5, lens_q, lens_k, 2, 1, 64, 64, np.float32)
    out, lse = ops.forward(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True)
    for b in range(len(lens_q)):
        qb, kb, vb = q[cu_q[b]:cu_q[b + 1]][None], k[cu_k[b]:cu_k[b + 1]][None], v[cu_k[b]:cu_k[b + 1]][None]
        ob, lb = ops.forward(qb, kb, vb, causal=True)
        np.testing.assert_allclose(out[cu_q[b]:cu_q[b + 1]], ob[0], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(lse[:, cu_q[b]:cu_q[b + 1]], lb[0], rtol=1e-6, atol=1e-6)


def test_seqused_k():
    lens = [10, 20, 15]
    _, cu_q, cu_k, q, k, v, dout = _varlen_problem(6, lens, lens, 2, 2, 16, 16, np.float32)
    used = np.array([10, 3, 0], dtype=np.int32)
    kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, seqused_k=used)
    out, lse, _, exact_lse = _check_forward(q, k, v, Mask(), None, np.float32, **kw)
    assert np.isneginf(lse[:, cu_q[2]:]).all() and (out[cu_q[2]:] == 0).all()


def test_explicit_softmax_scale_and_strided_views():
    """Non-contiguous inputs and outputs (any strides, unit last dimension) and a given softmax_scale."""
    rng = np.random.default_rng(7)
    b, sq, sk, h, d = 2, 33, 40, 3, 32
    q = rng.standard_normal((b, h, sq, d)).astype(np.float32).transpose(0, 2, 1, 3)  # (B, Sq, H, D) view
    kv = rng.standard_normal((b, sk, 2, h, d)).astype(np.float32)
    k, v = kv[:, :, 0], kv[:, :, 1]  # packed kv, as flash_attn_kvpacked_func passes them
    out_storage = _poison((b, h, sq, d), np.float32)
    out = out_storage.transpose(0, 2, 1, 3)
    lse_storage = _poison((b, h, sq + 3), np.float32)  # padded rows: strided heads and batches
    lse = lse_storage[:, :, :sq]
    assert not any(x.flags.c_contiguous for x in (q, k, v, out, lse))
    ops.forward(q, k, v, out=out, lse=lse, softmax_scale=0.3, causal=True)
    exact_out, exact_lse = attention(q, k, v, Mask(causal=True), scale=0.3)
    plain_out, plain_lse = attention(q, k, v, Mask(causal=True), scale=0.3, storage=np.float32)
    assert_close("out", out, exact_out, plain_out, np.float32)
    assert_close("lse", lse, exact_lse, plain_lse, np.float32)


def test_read_only_inputs_are_accepted():
    rng, q, k, v, _ = _problem(8, (1, 9, 9, 2, 2, 16, 16), np.float32)
    for x in (q, k, v):
        x.flags.writeable = False
    out, _ = ops.forward(q, k, v)
    assert np.isfinite(out).all()


def test_merge_partials_of_two_key_ranges_is_the_whole_attention():
    """ops.merge_partials (fa_merge_partials) on numpy: forwards over keys [0, 40) and [40, 100) merged in place
    equal the forward over all 100 keys; a float32 running partial takes a float16 one; bad input is a named
    ValueError."""
    rng, q, k, v, _ = _problem(21, (2, 31, 100, 4, 2, 32, 24), np.float32)
    whole, whole_lse = ops.forward(q, k, v)
    out, lse = ops.forward(q, k[:, :40], v[:, :40])
    out_b, lse_b = ops.forward(q.astype(np.float16), k[:, 40:].astype(np.float16), v[:, 40:].astype(np.float16))
    got, got_lse = ops.merge_partials(out, lse, out_b, lse_b)
    assert got is out and got_lse is lse
    np.testing.assert_allclose(out, whole, atol=2e-3, rtol=2e-3)  # float16's rounding of part b
    np.testing.assert_allclose(lse, whole_lse, atol=2e-3, rtol=1e-4)
    with pytest.raises(ValueError, match="lse_b: shape must be"):
        ops.merge_partials(out, lse, out_b, lse_b[:, :, :5])
    with pytest.raises(ValueError, match="out: must not overlap out_b"):
        ops.merge_partials(out, lse, out, lse_b)


def test_backward_is_deterministic():
    rng, q, k, v, dout = _problem(9, (2, 70, 90, 4, 1, 64, 64), np.float32)
    out, lse = ops.forward(q, k, v, causal=True)
    first = ops.backward(dout, q, k, v, out, lse, causal=True, deterministic=True)
    second = ops.backward(dout, q, k, v, out, lse, causal=True, deterministic=True)
    for a, b in zip(first, second):
        assert np.array_equal(a, b)


def test_num_threads_does_not_change_the_result():
    rng, q, k, v, _ = _problem(10, (2, 50, 50, 2, 2, 32, 32), np.float32)
    one, _ = ops.forward(q, k, v, num_threads=1)
    many, _ = ops.forward(q, k, v, num_threads=0)
    assert max_error(one, many) <= 1e-6


def test_forward_without_lse():
    rng, q, k, v, _ = _problem(11, (1, 8, 8, 1, 1, 8, 8), np.float32)
    out = ops.forward(q, k, v, return_lse=False)
    assert out.shape == (1, 8, 1, 8) and np.isfinite(out).all()


# ------------------------------------------------------------------------------------------- errors
def _base(dtype=np.float32):
    rng = np.random.default_rng(12)
    q = _random(rng, (2, 5, 4, 16), dtype)
    k = _random(rng, (2, 6, 2, 16), dtype)
    v = _random(rng, (2, 6, 2, 16), dtype)
    return dict(q=q, k=k, v=v)


def _call(q, k, v, **kw):
    return ops.forward(q, k, v, **kw)


ERRORS = [
    # (change to the base call, exception, words the message must contain)
    ("head_dim", lambda a: a.update(q=a["q"][..., :12].copy(), k=a["k"][..., :12].copy()), ValueError,
     ["q", "head_dim"]),
    ("q_rank", lambda a: a.update(q=a["q"][0]), ValueError, ["q", "dimensions"]),
    ("q_rank_5", lambda a: a.update(q=a["q"][None]), ValueError, ["q", "at most 4"]),
    ("k_dtype", lambda a: a.update(k=a["k"].astype(np.float16)), ValueError, ["k", "dtype"]),
    ("float64", lambda a: a.update(q=a["q"].astype(np.float64)), ValueError, ["q", "float64"]),
    ("int_q", lambda a: a.update(q=a["q"].astype(np.int32)), ValueError, ["q", "dtype"]),
    ("gqa", lambda a: a.update(k=a["k"][:, :, :1].repeat(3, 2), v=a["v"][:, :, :1].repeat(3, 2)), ValueError,
     ["k", "multiple"]),
    ("v_heads", lambda a: a.update(v=a["v"][:, :, :1].copy()), ValueError, ["v", "heads"]),
    ("kv_len", lambda a: a.update(v=a["v"][:, :5].copy()), ValueError, ["v", "match"]),
    ("batch", lambda a: a.update(k=a["k"][:1].copy(), v=a["v"][:1].copy()), ValueError, ["k", "batch"]),
    ("last_stride", lambda a: a.update(q=np.concatenate([a["q"], a["q"]], -1)[..., ::2]), ValueError,
     ["q", "unit stride"]),
    ("dropout_range", lambda a: a.update(dropout_p=1.5), ValueError, ["dropout_p", "[0, 1)"]),
    ("window_left", lambda a: a.update(window_size=(-2, 0)), ValueError, ["window_left", ">= -1"]),
    ("window_right", lambda a: a.update(window_size=(-1, -5)), ValueError, ["window_right"]),
    ("window_pair", lambda a: a.update(window_size=3), ValueError, ["window_size", "pair"]),
    ("causal_window", lambda a: a.update(causal=True, window_size=(-1, 2)), ValueError, ["window_right", "causal"]),
    ("softcap", lambda a: a.update(softcap=-1.0), ValueError, ["softcap"]),
    ("scale", lambda a: a.update(softmax_scale=float("nan")), ValueError, ["softmax_scale"]),
    ("scale_zero", lambda a: a.update(softmax_scale=0.0), ValueError, ["softmax_scale"]),
    ("alignment", lambda a: a.update(causal_alignment="middle"), ValueError, ["causal_alignment"]),
    ("alibi_shape", lambda a: a.update(alibi_slopes=np.ones(3, np.float32)), ValueError, ["alibi_slopes", "shape"]),
    ("alibi_dtype", lambda a: a.update(alibi_slopes=np.ones(4, np.float16)), ValueError, ["alibi_slopes", "float32"]),
    ("out_shape", lambda a: a.update(out=np.empty((2, 5, 4, 8), np.float32)), ValueError, ["out", "shape"]),
    ("out_dtype", lambda a: a.update(out=np.empty((2, 5, 4, 16), np.float16)), ValueError, ["out", "dtype"]),
    ("lse_shape", lambda a: a.update(lse=np.empty((2, 5, 4), np.float32)), ValueError, ["lse", "shape"]),
    ("lse_dtype", lambda a: a.update(lse=np.empty((2, 4, 5), np.float16)), ValueError, ["lse", "float32"]),
    ("backend", lambda a: a.update(backend="cuda-sm90"), ValueError, ["exec.backend", "CUDA tensors"]),
    ("backend_name", lambda a: a.update(backend="tpu"), ValueError, ["backend"]),
    ("threads", lambda a: a.update(num_threads=-1), ValueError, ["num_threads"]),
]


@pytest.mark.parametrize("change,exc,words", [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_errors_name_the_argument(change, exc, words):
    args = _base()
    change(args)
    with pytest.raises(exc) as info:
        _call(**args)
    for word in words:
        assert word in str(info.value), f"{word!r} not in {str(info.value)!r}"


VARLEN_ERRORS = [
    ("only_q", dict(cu_seqlens_k=None), ValueError, ["cu_seqlens", "both"]),
    ("start", dict(cu_seqlens_q=np.array([1, 3, 5], np.int32)), ValueError, ["cu_seqlens_q", "start at 0"]),
    ("decreasing", dict(cu_seqlens_k=np.array([0, 4, 3], np.int32)), ValueError, ["cu_seqlens_k", "non-decreasing"]),
    ("total", dict(cu_seqlens_q=np.array([0, 2, 4], np.int32)), ValueError, ["cu_seqlens_q", "last entry"]),
    ("dtype", dict(cu_seqlens_q=np.array([0, 2, 5], np.int64)), ValueError, ["cu_seqlens_q", "dtype"]),
    ("entries", dict(cu_seqlens_k=np.array([0, 6], np.int32)), ValueError, ["cu_seqlens_k", "entries"]),
    ("max_seqlen", dict(max_seqlen_q=2), ValueError, ["max_seqlen_q", "longest"]),
    ("seqused_k", dict(seqused_k=np.array([1, 9], np.int32)), ValueError, ["seqused_k", "entry 1"]),
]


@pytest.mark.parametrize("change,exc,words", [e[1:] for e in VARLEN_ERRORS], ids=[e[0] for e in VARLEN_ERRORS])
def test_varlen_errors_name_the_argument(change, exc, words):
    rng = np.random.default_rng(13)
    q = _random(rng, (5, 2, 16), np.float32)
    k = _random(rng, (6, 2, 16), np.float32)
    v = _random(rng, (6, 2, 16), np.float32)
    kw = dict(cu_seqlens_q=np.array([0, 2, 5], np.int32), cu_seqlens_k=np.array([0, 3, 6], np.int32))
    kw.update(change)
    with pytest.raises(exc) as info:
        ops.forward(q, k, v, **kw)
    for word in words:
        assert word in str(info.value), f"{word!r} not in {str(info.value)!r}"


def test_backward_errors_name_the_argument():
    args = _base()
    out, lse = ops.forward(**args)
    dout = np.ones_like(out)
    with pytest.raises(ValueError, match="lse"):
        ops.backward(dout, args["q"], args["k"], args["v"], out, lse[:, :, :3].copy())
    with pytest.raises(ValueError, match="dout"):
        ops.backward(dout[:, :3].copy(), args["q"], args["k"], args["v"], out, lse)
    with pytest.raises(ValueError, match="dk"):
        ops.backward(dout, args["q"], args["k"], args["v"], out, lse, dk=np.empty((2, 6, 2, 8), np.float32))


def test_non_numpy_outputs_must_be_given():
    class Wrapped:
        """A DLPack-capable array that is not numpy: ops will not guess how to allocate its outputs."""

        def __init__(self, a):
            self.a, self.shape, self.dtype = a, a.shape, a.dtype

        def __dlpack__(self, **kw):
            return self.a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    args = _base()
    with pytest.raises(TypeError, match="out"):
        ops.forward(Wrapped(args["q"]), args["k"], args["v"])
    out = np.empty((2, 5, 4, 16), np.float32)
    lse = np.empty((2, 4, 5), np.float32)
    ops.forward(Wrapped(args["q"]), Wrapped(args["k"]), Wrapped(args["v"]), out=out, lse=lse)
    exact_out, _ = attention(args["q"], args["k"], args["v"])
    plain_out, _ = attention(args["q"], args["k"], args["v"], storage=np.float32)
    assert_close("out", out, exact_out, plain_out, np.float32)


def test_module_surface():
    assert flashattn.__version__
    assert ops.backend_name(np.zeros((1, 1, 1, 8), np.float32)) == "cpu"
    assert isinstance(ops.built_with_cuda, bool)
    if not ops.built_with_cuda:
        assert not ops.cuda_available()
