"""The flash_attn-compatible torch API: autograd against float64 torch math, the custom ops under
torch.compile(fullgraph=True), CUDA-graph capture/replay, packed and varlen forms, non-contiguous inputs.

Skipped when torch is not importable, unless FLASHATTN_REQUIRE_TORCH=1 (set by scripts/python_tests.sh under CI,
whose set-up installs torch), where a missing torch is an error; the CUDA tests are skipped without a CUDA device
and a CUDA build of flashattn, so on CI's CPU machine the drop-in API, autograd, torch.library.opcheck and
torch.compile run on CPU tensors. Tolerance as everywhere: error <= 2x the error of a
plain implementation in the storage dtype (torch math in that dtype) against float64, plus a floor.
"""

from __future__ import annotations

import itertools
import os
import re

import pytest

if os.environ.get("FLASHATTN_REQUIRE_TORCH") == "1":
    import torch
else:
    torch = pytest.importorskip("torch")

import flashattn  # noqa: E402
from flashattn import (  # noqa: E402
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
    ops,
)
from flashattn.interface import AttnOptions  # noqa: E402

from fa_reference import storage_eps_by  # noqa: E402

HAS_CUDA = torch.cuda.is_available() and ops.cuda_available()
requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build of flashattn")


def _cuda_backward_built():
    """Whether the CUDA backend of this build implements the backward (the forward came first)."""
    if not HAS_CUDA:
        return False
    x = torch.randn(1, 8, 1, 64, device="cuda", dtype=torch.bfloat16)
    out, lse = torch.ops.flashattn.fwd(x, x, x, *AttnOptions())
    try:
        torch.ops.flashattn.bwd(out, x, x, x, out, lse, *AttnOptions())
    except NotImplementedError as e:
        return "backward is not implemented" not in str(e)
    return True


HAS_CUDA_BACKWARD = _cuda_backward_built()
requires_cuda_backward = pytest.mark.skipif(
    not HAS_CUDA_BACKWARD, reason="needs a CUDA build whose backend implements the backward")

# Floors of the tolerance per storage dtype: the suites' one rule (docs/testing.md), from fa_reference.
STORAGE_EPS = storage_eps_by(torch)


def math_attention(q, k, v, causal=False, top_left=False, window=(-1, -1), softcap=0.0, alibi=None, scale=None,
                   dtype=torch.float64):
    """Unfused attention in `dtype` (float64: the reference; the storage dtype: the plain implementation).
    Layout (B, S, H, D); returns (out in q's layout, lse (B, H, Sq) float32-comparable)."""
    qf, kf, vf = (x.to(dtype) for x in (q, k, v))
    group = q.shape[2] // k.shape[2]
    kf, vf = kf.repeat_interleave(group, dim=2), vf.repeat_interleave(group, dim=2)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = torch.einsum("bihd,bjhd->bhij", qf, kf) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    sq, sk = q.shape[1], k.shape[1]
    i = torch.arange(sq, device=q.device)[:, None]
    j = torch.arange(sk, device=q.device)[None, :]
    diag = i + (0 if top_left else sk - sq)
    if alibi is not None:
        slopes = alibi.to(dtype)
        slopes = slopes[None, :, None, None] if slopes.dim() == 1 else slopes[:, :, None, None]
        s = s - slopes * (diag - j).abs().to(dtype)
    left, right = window
    if causal:
        right = 0
    visible = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if left >= 0:
        visible &= j >= diag - left
    if right >= 0:
        visible &= j <= diag + right
    s = s.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(s.float() if dtype != torch.float64 else s, dim=-1)
    p = torch.softmax(s, dim=-1)
    return torch.einsum("bhij,bjhd->bihd", p, vf), lse


def max_err(got, want):
    got, want = got.detach().double(), want.detach().double()
    assert got.shape == want.shape, (got.shape, want.shape)
    if torch.isnan(got).any():
        return float("inf")
    return (got - want).abs().max().item() if got.numel() else 0.0


def assert_close(name, got, exact, plain, dtype):
    err, err_plain = max_err(got, exact), max_err(plain, exact)
    tol = 2 * err_plain + STORAGE_EPS[dtype] * max(1.0, exact.detach().abs().max().item() if exact.numel() else 1.0)
    assert err <= tol, f"{name}: max error {err:.3e} > tolerance {tol:.3e} (plain {dtype} error {err_plain:.3e})"


def test_the_check_rejects_wrong_results():
    """The comparison every test here relies on fails on a wrong mask, a wrong alignment, a wrong scale, a
    perturbation a few tolerances large and a NaN (a check that cannot fail would pass a broken kernel)."""
    q = make((1, 19, 2, 32), torch.float32, "cpu", 41, requires_grad=False)
    k, v = (make((1, 27, 2, 32), torch.float32, "cpu", s, requires_grad=False) for s in (42, 43))
    exact, _ = math_attention(q, k, v, causal=True)
    plain, _ = math_attention(q, k, v, causal=True, dtype=torch.float32)
    out = flash_attn_func(q, k, v, causal=True)
    assert_close("out", out, exact, plain, torch.float32)
    one_element = torch.arange(out.numel()).reshape(out.shape) == 5
    wrong = {
        "no mask": flash_attn_func(q, k, v),
        "top-left alignment": flash_attn_func(q, k, v, causal=True, causal_alignment="top_left"),
        "scale": flash_attn_func(q, k, v, causal=True, softmax_scale=0.9 * 32 ** -0.5),
        "one element off by 1e-4": out + 1e-4 * one_element,
        "one NaN": out.masked_fill(one_element, float("nan")),
    }
    for name, got in wrong.items():
        with pytest.raises(AssertionError):
            assert_close(name, got, exact, plain, torch.float32)


def make(shape, dtype, device, seed, requires_grad=True):
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float32).to(device=device, dtype=dtype)
    return x.requires_grad_(requires_grad)


MASKS = {
    "none": {},
    "causal": dict(causal=True),
    "causal_top_left": dict(causal=True, causal_alignment="top_left"),
    "window": dict(window_size=(6, 2)),
    "softcap": dict(softcap=4.0),
    "alibi": dict(alibi=True),
    "all": dict(causal=True, window_size=(11, -1), softcap=2.5, alibi=True),
}

# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim): Sq <= Sk, so that no row is fully masked
# (torch's softmax gives NaN there, flash_attn 0).
SHAPES = [(2, 17, 17, 4, 2, 64), (1, 33, 97, 2, 1, 128), (2, 1, 40, 2, 2, 32)]


def check_attention(device, dtype, shape, mask, backward=True):
    b, sq, sk, hq, hkv, d = shape
    q = make((b, sq, hq, d), dtype, device, 1)
    k, v = make((b, sk, hkv, d), dtype, device, 2), make((b, sk, hkv, d), dtype, device, 3)
    dout = make((b, sq, hq, d), dtype, device, 4, requires_grad=False)
    mask = dict(mask)
    # Slopes from their own generator, as the inputs are: one draw per case, whatever ran before it.
    alibi = (torch.rand(hq, generator=torch.Generator().manual_seed(5), dtype=torch.float32) * 0.5 + 0.1).to(device) \
        if mask.pop("alibi", False) else None
    out, lse, probs = flash_attn_func(q, k, v, alibi_slopes=alibi, return_attn_probs=True, **mask)
    assert probs is None and lse.dtype == torch.float32 and lse.shape == (b, hq, sq)
    grads = torch.autograd.grad(out, (q, k, v), dout) if backward else ()

    ref_kw = dict(causal=mask.get("causal", False), top_left=mask.get("causal_alignment") == "top_left",
                  window=mask.get("window_size", (-1, -1)), softcap=mask.get("softcap", 0.0), alibi=alibi)
    results = {}
    for label, math_dtype in (("exact", torch.float64), ("plain", dtype)):
        o, l = math_attention(q, k, v, dtype=math_dtype, **ref_kw)
        results[label] = (o, l) + (torch.autograd.grad(o, (q, k, v), dout.to(math_dtype)) if backward else ())
    names = ("out", "lse", "dq", "dk", "dv")
    for i, (name, got) in enumerate(zip(names, (out, lse) + grads)):
        assert_close(name, got, results["exact"][i], results["plain"][i], torch.float32 if name == "lse" else dtype)


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_autograd_cpu(shape, mask):
    check_attention("cpu", torch.float32, shape, MASKS[mask])


@pytest.mark.parametrize("mask", ["none", "causal", "all"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_autograd_cpu_16_bit(dtype, mask):
    """bfloat16 crosses DLPack as its own type code (numpy has none, so only torch tests it on the CPU)."""
    check_attention("cpu", dtype, SHAPES[0], MASKS[mask])


@requires_cuda
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_forward_cuda(dtype, shape, mask):
    check_attention("cuda", dtype, shape, MASKS[mask], backward=False)


@requires_cuda_backward
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_autograd_cuda(dtype, shape, mask):
    check_attention("cuda", dtype, shape, MASKS[mask])


def _devices_dtypes():
    return [pytest.param("cpu", torch.float32, id="cpu-float32"),
            pytest.param("cuda", torch.bfloat16, id="cuda-bfloat16", marks=requires_cuda)]


def can_backward(device):
    """The gradient parts of the tests below run where the backend has a backward (the CUDA one came
    later); test_autograd_cuda's skip reports when it has not."""
    return device == "cpu" or HAS_CUDA_BACKWARD


DEVICES_DTYPES = _devices_dtypes()


@pytest.mark.parametrize("device,dtype", DEVICES_DTYPES)
def test_non_contiguous_inputs(device, dtype):
    """Transposed (B, H, S, D) storage and a non-unit last stride give the same result as contiguous inputs."""
    b, s, h, d = 2, 29, 4, 64
    q = make((b, h, s, d), dtype, device, 5).transpose(1, 2)
    k = make((b, s, h, 2 * d), dtype, device, 6)[..., ::2]
    v = make((b, h, s, d), dtype, device, 7).transpose(1, 2)
    assert not q.is_contiguous() and k.stride(-1) == 2
    out = flash_attn_func(q, k, v, causal=True)
    qc, kc, vc = (x.detach().contiguous().requires_grad_() for x in (q, k, v))
    out_c = flash_attn_func(qc, kc, vc, causal=True)
    assert torch.equal(out, out_c)
    if can_backward(device):
        grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))  # expanded (stride 0) dout
        grads_c = torch.autograd.grad(out_c, (qc, kc, vc), torch.ones_like(out_c))
        for a, c in zip(grads, grads_c):
            assert torch.equal(a, c)


@pytest.mark.parametrize("device,dtype", DEVICES_DTYPES)
def test_flash_attn_window_and_scale_rules(device, dtype):
    """What flash_attn's checks let through runs here too, with its meaning (its mha_fwd / mha_bwd): causal sets
    window_size[1] = 0 whatever was given, a negative window side is unbounded, softcap applies only where > 0,
    dropout only for p > 0, and any softmax_scale runs (the kernels take q negated for a negative one, zeroed for 0)."""
    b, s, h, d = 1, 23, 2, 64
    q, k, v = (make((b, s, h, d), dtype, device, seed) for seed in (11, 12, 13))

    def same(given, meant):  # deterministic: bit-equal gradients from two calls on CUDA too
        out = flash_attn_func(q, k, v, deterministic=True, **given)
        ref = flash_attn_func(q, k, v, deterministic=True, **meant)
        assert torch.equal(out, ref), (given, meant)
        if can_backward(device):
            grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
            for a, c in zip(grads, torch.autograd.grad(ref, (q, k, v), torch.ones_like(ref))):
                assert torch.equal(a, c), (given, meant)

    same(dict(causal=True, window_size=(5, 3)), dict(causal=True, window_size=(5, 0)))
    same(dict(causal=True, window_size=(-1, 7)), dict(causal=True))
    same(dict(window_size=(-2, 0)), dict(window_size=(-1, 0)))
    same(dict(window_size=(-5, -9)), dict())
    same(dict(softcap=-1.0), dict())
    same(dict(softcap=float("nan"), causal=True), dict(causal=True))
    same(dict(dropout_p=-0.1), dict())
    for scale in (-0.3, 0.0):
        out = flash_attn_func(q, k, v, softmax_scale=scale, causal=True, softcap=2.0)
        exact, _ = math_attention(q, k, v, causal=True, softcap=2.0, scale=scale)
        plain, _ = math_attention(q, k, v, causal=True, softcap=2.0, scale=scale, dtype=dtype)
        assert_close(f"softmax_scale {scale}", out, exact, plain, dtype)
    if can_backward(device):
        out = flash_attn_func(q, k, v, softmax_scale=-0.3, deterministic=True)
        (dq,) = torch.autograd.grad(out, (q,), torch.ones_like(out))
        q_neg = (-q).detach().requires_grad_()
        out_neg = flash_attn_func(q_neg, k, v, softmax_scale=0.3, deterministic=True)
        (dq_neg,) = torch.autograd.grad(out_neg, (q_neg,), torch.ones_like(out_neg))
        assert torch.equal(out, out_neg) and torch.equal(dq, -dq_neg)


@pytest.mark.parametrize("device,dtype", DEVICES_DTYPES)
def test_packed_forms_equal_unpacked(device, dtype):
    b, s, h, d = 2, 21, 2, 32
    qkv = make((b, s, 3, h, d), dtype, device, 8)
    out = flash_attn_qkvpacked_func(qkv, causal=True)
    ref = flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], causal=True)
    assert torch.equal(out, ref)
    if can_backward(device):
        (g,) = torch.autograd.grad(out.sum(), qkv)
        assert g.shape == qkv.shape and torch.isfinite(g).all() and g.abs().sum() > 0
    q = make((b, s, 2 * h, d), dtype, device, 9)
    kv = make((b, s + 5, 2, h, d), dtype, device, 10)
    assert torch.equal(flash_attn_kvpacked_func(q, kv), flash_attn_func(q, kv[:, :, 0], kv[:, :, 1]))


def varlen_case(device, dtype, lens_q, lens_k, hq=4, hkv=2, d=64):
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32, device=device)
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32, device=device)
    q = make((int(cu_q[-1]), hq, d), dtype, device, 11)
    k = make((int(cu_k[-1]), hkv, d), dtype, device, 12)
    v = make((int(cu_k[-1]), hkv, d), dtype, device, 13)
    return cu_q, cu_k, q, k, v


@pytest.mark.parametrize("device,dtype", DEVICES_DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_matches_per_sequence(device, dtype, causal):
    lens_q, lens_k = [7, 1, 40, 16], [7, 30, 40, 16]
    cu_q, cu_k, q, k, v = varlen_case(device, dtype, lens_q, lens_k)
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                         return_attn_probs=True)
    assert lse.shape == (q.shape[1], q.shape[0])
    dout = make(out.shape, dtype, device, 14, requires_grad=False)
    backward = can_backward(device)
    if backward:
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    # Per sequence, the same kernels see the same rows; only the accumulation order may differ.
    for b in range(len(lens_q)):
        sq, sk = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        qb, kb, vb = (x.detach()[r][None].requires_grad_() for x, r in ((q, sq), (k, sk), (v, sk)))
        ob, lb, _ = flash_attn_func(qb, kb, vb, causal=causal, return_attn_probs=True)
        exact = math_attention(qb, kb, vb, causal=causal)[0]
        tol = 4 * STORAGE_EPS[dtype] * max(1.0, exact.abs().max().item())
        assert max_err(out[sq], ob[0]) <= tol and max_err(lse[:, sq], lb[0]) <= 1e-5
        if backward:
            gb = torch.autograd.grad(ob, (qb, kb, vb), dout[sq][None])
            for got, want in zip((dq[sq], dk[sk], dv[sk]), gb):
                assert max_err(got, want[0]) <= 4 * STORAGE_EPS[dtype] * max(1.0, want.abs().max().item())


@pytest.mark.parametrize("device,dtype", DEVICES_DTYPES)
def test_varlen_packed_forms(device, dtype):
    lens = [5, 18, 9]
    cu, _, q, k, v = varlen_case(device, dtype, lens, lens, hq=2, hkv=2, d=32)
    qkv = torch.stack([q.detach(), k.detach(), v.detach()], dim=1).requires_grad_()
    out = flash_attn_varlen_qkvpacked_func(qkv, cu, max(lens), causal=True)
    assert torch.equal(out, flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True))
    kv = qkv[:, 1:]
    assert torch.equal(flash_attn_varlen_kvpacked_func(q, kv, cu, cu, max(lens), max(lens)),
                       flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens)))


def test_unsupported_arguments_raise():
    q = make((1, 4, 1, 16), torch.float32, "cpu", 15)
    big = make((1, 4, 1, 264), torch.float32, "cpu", 15)
    with pytest.raises(ValueError, match="head_dim"):
        flash_attn_func(big, big, big)
    with pytest.raises(ValueError, match="causal_alignment"):
        flash_attn_func(q, q, q, causal=True, causal_alignment="diagonal")
    # A head dim padded past 256 is named by its own size, not the padded one.
    odd = make((1, 4, 1, 257), torch.float32, "cpu", 15)
    with pytest.raises(ValueError, match=re.escape("q: head_dim must be at most 256 (got 257)")):
        flash_attn_func(odd, odd, odd)


def test_malformed_tensor_arguments_are_named():
    # Non-tensors, 0-d tensors and packed tensors of the wrong layout are refused before any shape is read
    # (they used to fail inside Python's indexing: IndexError / AttributeError, no argument named).
    q = make((1, 4, 2, 16), torch.float32, "cpu", 15)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    scalar = torch.tensor(1.0)
    cases = [
        (lambda: flash_attn_func(scalar, q, q), ValueError, "q: must be a 4-D tensor (batch, seqlen_q, heads, "
                                                            "head_dim) (got 0-D)"),
        (lambda: flash_attn_func(q, scalar, q), ValueError, "k: must be a 4-D tensor"),
        (lambda: flash_attn_func(q, q, None), TypeError, "v: must be a torch.Tensor (got NoneType)"),
        (lambda: flash_attn_func("q", q, q), TypeError, "q: must be a torch.Tensor (got str)"),
        (lambda: flash_attn_varlen_func(scalar, q[0], q[0], cu, cu, 4, 4), ValueError,
         "q: must be a 3-D tensor (total_q, heads, head_dim) (got 0-D)"),
        (lambda: flash_attn_varlen_func(q[0], q, q[0], cu, cu, 4, 4), ValueError,
         "k: must be a 3-D tensor (total_k, heads_kv, head_dim) (got 4-D)"),
        (lambda: flash_attn_kvpacked_func(q, q.unsqueeze(2)), ValueError,
         "kv: must be (batch, seqlen_k, 2, heads_kv, head_dim): dimension 2 must have size 2 (got 1)"),
        (lambda: flash_attn_qkvpacked_func(q), ValueError, "qkv: must be a 5-D tensor"),
        (lambda: flash_attn_varlen_kvpacked_func(q[0], q[0], cu, cu, 4, 4), ValueError, "kv: must be a 4-D tensor"),
        (lambda: flash_attn_varlen_qkvpacked_func(q[0].unsqueeze(1), cu, 4), ValueError,
         "qkv: must be (total, 3, heads, head_dim): dimension 1 must have size 3 (got 1)"),
        # Scalars and optional tensors of the wrong type, and the sink by its Python name (the core's is "sinks").
        (lambda: flash_attn_func(q, q, q, softcap=None), TypeError, "softcap: must be a number (got NoneType)"),
        (lambda: flash_attn_func(q, q, q, softmax_scale="x"), TypeError, "softmax_scale: must be a number"),
        (lambda: flash_attn_func(q, q, q, alibi_slopes=[0.1, 0.2]), TypeError,
         "alibi_slopes: must be a torch.Tensor or None (got list)"),
        (lambda: flash_attn_func(q, q, q, learnable_sink=torch.zeros(3)), ValueError,
         "learnable_sink: must have shape (2,), a logit per query head (got (3,))"),
        (lambda: flash_attn_varlen_func(q[0], q[0], q[0], [0, 4], cu, 4, 4), TypeError,
         "cu_seqlens_q: must be a torch.Tensor or None (got list)"),
        (lambda: flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, None, 4), TypeError,
         "max_seqlen_q: must be a number (got NoneType)"),
        (lambda: flash_attn_with_kvcache(q[:, :1], q, q.clone(), softcap=None), TypeError, "softcap: must be a number"),
        (lambda: flash_attn_with_kvcache(q[:, :1], q, q.clone(), k=[1.0], v=[2.0], cache_seqlens=1), TypeError,
         "k: must be a torch.Tensor or None (got list)"),
        (lambda: flash_attn_func(q, q, q, window_size=("a", 0)), ValueError, "window_size: must be a pair"),
        (lambda: flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 10**30, 4), ValueError,
         "max_seqlen_q: must fit in 64 bits"),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match=re.escape(message)):
            call()
    # A window side beyond int64 is named as ops.forward names it (it used to fail in the binding's conversion).
    with pytest.raises(ValueError, match=re.escape("window_size: must be in [")):
        flash_attn_func(q, q, q, window_size=(10**30, 0))


@pytest.mark.parametrize("device,dtype", DEVICES_DTYPES)
def test_head_dim_not_multiple_of_8(device, dtype):
    """flash_attn pads such head dims; so do we: the result and the gradients equal those of explicitly zero-padded
    inputs with the real head dim's scale, sliced back."""
    b, s, h, d, dv = 2, 23, 2, 12, 20
    q, k, v = (make((b, s, h, x), dtype, device, seed, True) for x, seed in ((d, 21), (d, 22), (dv, 23)))
    out = flash_attn_func(q, k, v, causal=True)
    assert out.shape == (b, s, h, dv)
    pad = torch.nn.functional.pad
    qp, kp, vp = (pad(x.detach(), (0, -x.shape[-1] % 8)).requires_grad_() for x in (q, k, v))
    out_p = flash_attn_func(qp, kp, vp, causal=True, softmax_scale=d ** -0.5)[..., :dv]
    assert torch.equal(out, out_p)
    if can_backward(device):
        g = torch.randn_like(out)
        grads = torch.autograd.grad(out, (q, k, v), g)
        grads_p = torch.autograd.grad(out_p, (qp, kp, vp), g)
        for a, c in zip(grads, grads_p):
            assert torch.equal(a, c[..., :a.shape[-1]])


def opcheck_args(device, dtype, requires_grad):
    q, k, v = (make((2, 9, 2, 16), dtype, device, s, requires_grad) for s in (16, 17, 18))
    sinks = make((2,), torch.float32, device, 19, requires_grad)
    return (q, k, v, *AttnOptions(causal=True, sinks=sinks))


@pytest.mark.parametrize("device,dtype", DEVICES_DTYPES)
def test_opcheck(device, dtype):
    """torch.library.opcheck: schema, fake (meta) implementation, autograd registration, dispatch."""
    args = opcheck_args(device, dtype, requires_grad=can_backward(device))
    torch.library.opcheck(torch.ops.flashattn.fwd.default, args)
    out, lse = torch.ops.flashattn.fwd(*args)
    dout = torch.randn_like(out)
    # The backward has no derivative of its own (no double backward), so it is checked without grads.
    q, k, v = (x.detach() for x in args[:3])
    options = AttnOptions(*args[3:])
    if can_backward(device):
        plain = options._replace(sinks=options.sinks.detach())
        torch.library.opcheck(torch.ops.flashattn.bwd.default, (dout, q, k, v, out.detach(), lse.detach(), *plain))
    # Dropout: the seed and offset as the int64 tensor option (the same tensor: the same mask on every call).
    rng = torch.tensor([5, 7], dtype=torch.int64, device=device)
    dropout = options._replace(sinks=options.sinks.detach(), dropout_p=0.3, dropout_rng=rng)
    torch.library.opcheck(torch.ops.flashattn.fwd.default, (q, k, v, *dropout))
    if can_backward(device):
        out, lse = torch.ops.flashattn.fwd(q, k, v, *dropout)
        torch.library.opcheck(torch.ops.flashattn.bwd.default, (dout, q, k, v, out, lse, *dropout))


class TinyAttention(torch.nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, s, dim = x.shape
        qkv = self.qkv(x).view(b, s, 3, self.heads, dim // self.heads)
        out = flash_attn_qkvpacked_func(qkv, causal=True, softcap=3.0)
        return self.proj(out.reshape(b, s, dim))


@pytest.mark.parametrize("device,dtype,backend", [
    pytest.param("cpu", torch.float32, "aot_eager", id="cpu-aot_eager"),
    pytest.param("cpu", torch.float32, "inductor", id="cpu-inductor"),
    pytest.param("cuda", torch.bfloat16, "inductor", id="cuda-inductor", marks=requires_cuda),
])
def test_torch_compile_fullgraph_inference(device, dtype, backend):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = TinyAttention(128, 2).to(device=device, dtype=dtype)
    x = make((2, 37, 128), dtype, device, 19, requires_grad=False)
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    with torch.no_grad():
        y_eager, y = model(x), compiled(x)
    assert max_err(y, y_eager) <= 4 * STORAGE_EPS[dtype] * max(1.0, y_eager.abs().max().item())


@pytest.mark.parametrize("device,dtype,backend", [
    pytest.param("cpu", torch.float32, "aot_eager", id="cpu-aot_eager"),
    # Inductor on the CPU generates and compiles C++ (about 25 s on CI's 2 cores): the custom ops' fake
    # implementations and autograd registration under the real compiler, without a GPU.
    pytest.param("cpu", torch.float32, "inductor", id="cpu-inductor"),
    pytest.param("cuda", torch.bfloat16, "inductor", id="cuda-inductor", marks=requires_cuda_backward),
])
def test_torch_compile_fullgraph(device, dtype, backend):
    """fullgraph=True fails on any graph break; the compiled model must match eager, gradients included."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = TinyAttention(128, 2).to(device=device, dtype=dtype)
    x = make((2, 37, 128), dtype, device, 19)
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    y_eager = model(x)
    g_eager = torch.autograd.grad(y_eager.sum(), (x, *model.parameters()))
    y = compiled(x)
    g = torch.autograd.grad(y.sum(), (x, *model.parameters()))
    # Same kernels; inductor may fuse the surrounding pointwise ops differently (one rounding apart).
    tol = 4 * STORAGE_EPS[dtype]
    assert max_err(y, y_eager) <= tol * max(1.0, y_eager.abs().max().item())
    for a, b in zip(g, g_eager):
        assert max_err(a, b) <= tol * max(1.0, b.abs().max().item())


def capture(step):
    """A CUDA graph of step() and the outputs of its capture: two warm-up calls on a side stream first, as
    torch.cuda.graphs requires."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_results = step()
    return graph, static_results


@requires_cuda
def test_cuda_graph_forward_capture_and_replay():
    dtype, device = torch.bfloat16, "cuda"
    shape = (2, 64, 4, 64)
    static = [make(shape, dtype, device, s, requires_grad=False) for s in (50, 51, 52)]
    graph, static_out = capture(lambda: flash_attn_func(*static, causal=True, window_size=(32, -1)))
    for seed in (60, 70):
        fresh = [make(shape, dtype, device, seed + i, requires_grad=False) for i in range(3)]
        for s, f in zip(static, fresh):
            s.copy_(f)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_out, flash_attn_func(*fresh, causal=True, window_size=(32, -1)))


@requires_cuda_backward
def test_cuda_graph_capture_and_replay():
    """Forward and backward captured in one CUDA graph; replays on new inputs match eager calls."""
    dtype, device = torch.bfloat16, "cuda"
    shape = (2, 64, 4, 64)
    static = [make(shape, dtype, device, s) for s in (20, 21, 22)]
    static_dout = make(shape, dtype, device, 23, requires_grad=False)

    def step():
        out = flash_attn_func(*static, causal=True)
        return (out,) + torch.autograd.grad(out, static, static_dout)

    graph, static_results = capture(step)
    for seed in (30, 40):
        fresh = [make(shape, dtype, device, seed + i, requires_grad=False) for i in range(3)]
        dout = make(shape, dtype, device, seed + 3, requires_grad=False)
        with torch.no_grad():
            for s, f in zip(static, fresh):
                s.copy_(f)
            static_dout.copy_(dout)
        graph.replay()
        torch.cuda.synchronize()
        q, k, v = (f.clone().requires_grad_() for f in fresh)
        out = flash_attn_func(q, k, v, causal=True)
        eager = (out,) + torch.autograd.grad(out, (q, k, v), dout)
        for name, a, b in zip(("out", "dq", "dk", "dv"), static_results, eager):
            assert torch.equal(a, b), name


@requires_cuda
def test_runs_on_the_current_stream():
    q, k, v = (make((1, 256, 8, 128), torch.bfloat16, "cuda", s, requires_grad=False) for s in (24, 25, 26))
    expected = flash_attn_func(q, k, v)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out = flash_attn_func(q, k, v)
    torch.cuda.current_stream().wait_stream(stream)
    assert torch.equal(out, expected)


@requires_cuda
def test_cuda_errors():
    q = make((1, 8, 2, 64), torch.bfloat16, "cuda", 27, requires_grad=False)
    with pytest.raises(ValueError, match="k: must be on the same device as q"):
        flash_attn_func(q, q.cpu(), q)
    with pytest.raises(NotImplementedError, match="float32"):
        flash_attn_func(q.float(), q.float(), q.float())


@pytest.mark.skipif(not torch.cuda.is_available() or ops.built_with_cuda,
                    reason="for a CPU-only build on a machine with a CUDA device")
def test_cuda_tensors_on_a_cpu_only_build():
    q = torch.randn(1, 8, 2, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match="no CUDA backend"):
        flash_attn_func(q, q, q)


def test_lazy_torch_import():
    assert "flash_attn_func" in dir(flashattn)
    with pytest.raises(AttributeError):
        flashattn.no_such_function  # noqa: B018


def sink_attention(q, k, v, sink, causal, top_left, window, dtype):
    """Attention with a learnable sink in `dtype`: the sink is one more logit per (head, row) whose value vector is 0.
    Returns out (B, Sq, Hq, Dv) and lse (B, Hq, Sq)."""
    qf, kf, vf = (x.to(dtype) for x in (q, k, v))
    group = q.shape[2] // k.shape[2]
    kf, vf = kf.repeat_interleave(group, dim=2), vf.repeat_interleave(group, dim=2)
    s = torch.einsum("bihd,bjhd->bhij", qf, kf) * q.shape[-1] ** -0.5
    sq, sk = q.shape[1], k.shape[1]
    i = torch.arange(sq, device=q.device)[:, None] + (0 if top_left else sk - sq)
    j = torch.arange(sk, device=q.device)[None, :]
    left, right = window
    right = 0 if causal else right
    visible = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if left >= 0:
        visible &= j >= i - left
    if right >= 0:
        visible &= j <= i + right
    s = s.masked_fill(~visible, float("-inf"))
    col = sink.to(dtype)[None, :, None, None].expand(s.shape[0], -1, sq, 1)
    full = torch.cat((s, col), dim=-1)
    p = torch.softmax(full, dim=-1)[..., :sk]
    return torch.einsum("bhij,bjhd->bihd", p, vf), torch.logsumexp(full.double(), dim=-1)


@pytest.mark.parametrize("device,dtype", [("cpu", torch.float32), ("cpu", torch.bfloat16)] +
                         ([("cuda", torch.bfloat16), ("cuda", torch.float16)] if HAS_CUDA else []))
@pytest.mark.parametrize("mask", [dict(), dict(causal=True), dict(window=(5, 1)), dict(causal=True, top_left=True)])
def test_learnable_sink(device, dtype, mask):
    """out, lse and the gradients of q, k, v and the sink against float64 math with the sink as an extra column.
    Bottom-right causal with Sq > Sk leaves rows without a visible key: out 0 and lse = the sink there."""
    b, sq, sk, hq, hkv, d = (2, 23, 17, 4, 2, 64)
    q = make((b, sq, hq, d), dtype, device, 1)
    k, v = make((b, sk, hkv, d), dtype, device, 2), make((b, sk, hkv, d), dtype, device, 3)
    sink = (torch.randn(hq, generator=torch.Generator().manual_seed(5)) * 2).to(device).requires_grad_(True)
    dout = make((b, sq, hq, d), dtype, device, 4, requires_grad=False)
    causal, top_left, window = mask.get("causal", False), mask.get("top_left", False), mask.get("window", (-1, -1))
    out, lse, _ = flash_attn_func(q, k, v, causal=causal, window_size=window, return_attn_probs=True,
                                  causal_alignment="top_left" if top_left else "bottom_right", learnable_sink=sink)
    exact, exact_lse = sink_attention(q, k, v, sink, causal, top_left, window, torch.float64)
    plain, _ = sink_attention(q, k, v, sink, causal, top_left, window, dtype)
    assert_close("out", out, exact, plain, dtype)
    assert max_err(lse, exact_lse) <= 1e-3 * max(1.0, exact_lse.abs().max().item())
    if not can_backward(device):
        return
    grads = torch.autograd.grad(out, (q, k, v, sink), dout)
    want = torch.autograd.grad(exact, (q, k, v, sink), dout.double())
    want_plain = torch.autograd.grad(plain, (q, k, v, sink), dout.to(plain.dtype))
    for name, g, w, pl in zip(("dq", "dk", "dv", "dsink"), grads, want, want_plain):
        assert g.dtype == (torch.float32 if name == "dsink" else dtype)
        assert_close(name, g, w, pl, dtype if name != "dsink" else torch.bfloat16 if dtype != torch.float32 else dtype)


@pytest.mark.parametrize("device,dtype", DEVICES_DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout(device, dtype, causal, p):
    """Dropout (the CPU backend; on CUDA the GPU family's dropout kernels). With V = I the output is the
    dropped-out probability matrix itself, which reveals the mask; the mask depends only on the seed and the
    coordinates, so a second call with the same seed and a random V must equal float64 math with that mask,
    forward and backward. The seed comes from torch's generator: the same torch.manual_seed gives the same
    output, another one another mask. The tolerance is the storage dtype's (the C++ suites hold the kernels to
    the plain low-precision error; this test is about the mask)."""
    b, sq, sk, hq, hkv, d = 2, 16, 24, 4, 2, 32
    tol = 1e-5 if dtype == torch.float32 else 8 * STORAGE_EPS[dtype]
    q = make((b, sq, hq, d), dtype, device, 21)
    k = make((b, sk, hkv, d), dtype, device, 22)
    eye = torch.eye(sk, dtype=dtype, device=device).expand(b, hkv, sk, sk).transpose(1, 2).contiguous()
    torch.manual_seed(5)
    z = flash_attn_func(q.detach(), k.detach(), eye, dropout_p=p, causal=causal)  # (B, Sq, Hq, Sk)
    exact_p, _ = math_attention(q, k, eye, causal=causal)  # float64 probabilities (V = I)
    keep = z != 0
    assert max_err(z, exact_p * keep / (1 - p)) <= tol / (1 - p)
    visible = exact_p.detach() > 0
    rate = keep[visible].float().mean().item()
    assert abs(rate - (1 - p)) < 0.08, rate  # ~3000 visible entries: a loose check (the C++ test is the tight one)

    v = make((b, sk, hkv, d), dtype, device, 23)
    dout = make((b, sq, hq, d), dtype, device, 24, requires_grad=False)
    torch.manual_seed(5)
    out = flash_attn_func(q, k, v, dropout_p=p, causal=causal)
    probs, _ = math_attention(q, k, eye, causal=causal)  # differentiable float64 P
    mask = keep.double() / (1 - p)
    want = torch.einsum("bihj,bjhd->bihd", probs * mask, v.double().repeat_interleave(hq // hkv, dim=2))
    assert max_err(out, want) <= tol * max(1.0, want.abs().max().item())
    if can_backward(device):
        grads = torch.autograd.grad(out, (q, k, v), dout)
        want_grads = torch.autograd.grad(want, (q, k, v), dout.double())
        for name, g, w in zip(("dq", "dk", "dv"), grads, want_grads):
            assert max_err(g, w) <= 2 * tol * max(1.0, w.abs().max().item()), name
    torch.manual_seed(5)
    assert torch.equal(flash_attn_func(q, k, v, dropout_p=p, causal=causal), out)
    torch.manual_seed(6)
    assert not torch.equal(flash_attn_func(q, k, v, dropout_p=p, causal=causal), out)
    if device == "cuda":  # the same mask as the CPU backend's for the same seed (core/dropout.hpp's rule)
        seed, offset = 0x5EED, 77
        z_cuda = dropout_probs(q, k, eye, p, causal, dropout_seed=seed, dropout_offset=offset)
        z_cpu = dropout_probs(q.cpu().float(), k.cpu().float(), eye.cpu().float(), p, causal, dropout_seed=seed,
                              dropout_offset=offset)
        assert torch.equal((z_cuda != 0).cpu(), z_cpu != 0)


@pytest.mark.parametrize("device,dtype", DEVICES_DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_return_attn_probs_dropout(device, dtype, causal):
    """return_attn_probs with dropout returns flash_attn's S_dmask: (B, Hq, Sq, Sk) float32 on q's device, |S| the
    softmax probabilities, negative where the call dropped them: sum_j |S_ij| keep_ij / (1 - p) v_j is the call's
    out. Varlen: (B, Hq, max_seqlen_q, max_seqlen_k), 0 past each sequence. Without dropout: None."""
    b, sq, sk, hq, hkv, d, p = 2, 19, 27, 4, 2, 32, 0.3
    tol = 1e-5 if dtype == torch.float32 else 8 * STORAGE_EPS[dtype]
    q = make((b, sq, hq, d), dtype, device, 31, requires_grad=False)
    k, v = (make((b, sk, hkv, d), dtype, device, s, requires_grad=False) for s in (32, 33))
    out, lse, s_dmask = flash_attn_func(q, k, v, dropout_p=p, causal=causal, return_attn_probs=True)
    assert s_dmask.shape == (b, hq, sq, sk) and s_dmask.dtype == torch.float32 and s_dmask.device == q.device
    eye = torch.eye(sk, dtype=torch.float64, device=device).expand(b, hkv, sk, sk).transpose(1, 2)
    exact_p, _ = math_attention(q, k, eye, causal=causal)  # (B, Sq, Hq, Sk) float64 probabilities
    assert max_err(s_dmask.abs().transpose(1, 2), exact_p) <= 1e-6
    keep = ~torch.signbit(s_dmask)
    visible = exact_p.transpose(1, 2) > 0
    assert abs(keep[visible].float().mean().item() - (1 - p)) < 0.08
    want = torch.einsum("bhij,bjhd->bihd", s_dmask.abs().double() * keep / (1 - p),
                        v.double().repeat_interleave(hq // hkv, dim=2))
    assert max_err(out, want) <= tol * max(1.0, want.abs().max().item())
    assert flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)[2] is None

    lens_q, lens_k = [5, 0, 9], [7, 3, 12]
    cu_q = torch.tensor([0, 5, 5, 14], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 7, 10, 22], dtype=torch.int32, device=device)
    qv = make((14, hq, d), dtype, device, 34, requires_grad=False)
    kv_, vv = (make((22, hkv, d), dtype, device, s, requires_grad=False) for s in (35, 36))
    out, _, s_dmask = flash_attn_varlen_func(qv, kv_, vv, cu_q, cu_k, 9, 12, dropout_p=p, causal=causal,
                                             return_attn_probs=True)
    assert s_dmask.shape == (3, hq, 9, 12)
    for i, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        seq = s_dmask[i]
        assert not seq[:, lq:].any() and not seq[:, :, lk:].any()
        if lq == 0 or lk == 0:
            continue
        kept = seq[:, :lq, :lk].abs().double() * ~torch.signbit(seq[:, :lq, :lk]) / (1 - p)
        vs = vv[cu_k[i]:cu_k[i] + lk].double().repeat_interleave(hq // hkv, dim=1)
        want = torch.einsum("hij,jhd->ihd", kept, vs)
        assert max_err(out[cu_q[i]:cu_q[i] + lq], want) <= tol * max(1.0, want.abs().max().item())


def dropout_probs(q, k, eye, p, causal, **rng):
    """flashattn.ops.forward with V = I (the dropped-out probabilities) and an explicit seed/offset or rng tensor."""
    q, k = q.detach(), k.detach()
    out = torch.empty(q.shape[:-1] + eye.shape[-1:], dtype=q.dtype, device=q.device)
    lse = torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32, device=q.device)
    stream = torch.cuda.current_stream().cuda_stream if q.is_cuda else 0
    ops.forward(q, k, eye, out=out, lse=lse, dropout_p=p, causal=causal, stream=stream, **rng)
    return out


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=requires_cuda_backward)])
def test_dropout_rng_tensor(device):
    """attn.dropout_rng, (seed, offset) as an int64 tensor on q's device (read in place by the CUDA kernels, on the
    host for CPU calls), draws the mask of the same two integers, forward and backward, bit for bit. It takes their
    place: given with a nonzero seed or offset, or of another dtype, shape or device, it is a named error."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    b, sq, sk, h, d, p = 2, 40, 56, 2, 64, 0.3
    q, dout = (make((b, sq, h, d), dtype, device, s, requires_grad=False) for s in (61, 62))
    k, v = (make((b, sk, h, d), dtype, device, s, requires_grad=False) for s in (63, 64))
    seed, offset = 0x123456789ABCDEF, (3 << 40) + 77
    rng = torch.tensor([seed, offset], dtype=torch.int64, device=device)
    stream = torch.cuda.current_stream().cuda_stream if device == "cuda" else 0

    def run(**draw):
        out = torch.empty_like(q)
        lse = torch.empty((b, h, sq), dtype=torch.float32, device=device)
        ops.forward(q, k, v, out=out, lse=lse, dropout_p=p, causal=True, stream=stream, **draw)
        grads = ops.backward(dout, q, k, v, out, lse, dq=torch.empty_like(q), dk=torch.empty_like(k),
                             dv=torch.empty_like(v), dropout_p=p, causal=True, stream=stream, **draw)
        return (out,) + tuple(grads)

    by_ints = run(dropout_seed=seed, dropout_offset=offset)
    by_tensor = run(dropout_rng=rng)
    for name, a, c in zip(("out", "dq", "dk", "dv"), by_ints, by_tensor):
        assert torch.equal(a, c), name
    assert not torch.equal(run(dropout_seed=seed, dropout_offset=offset + 1)[0], by_ints[0])
    out = torch.empty_like(q)
    bad = [
        (dict(dropout_rng=rng, dropout_seed=seed), "dropout_rng: takes the place of dropout_seed"),
        (dict(dropout_rng=rng.int()), "dropout_rng: dtype must be int64"),
        (dict(dropout_rng=torch.zeros(3, dtype=torch.int64, device=device)), "dropout_rng: shape must be (2)"),
    ]
    if device == "cuda":
        bad.append((dict(dropout_rng=rng.cpu()), "dropout_rng: must be on the same device as q"))
    for draw, message in bad:
        with pytest.raises(ValueError, match=re.escape(message)):
            ops.forward(q, k, v, out=out, dropout_p=p, return_lse=False, stream=stream, **draw)


@requires_cuda_backward
def test_cuda_graph_dropout_draws_per_replay():
    """Dropout in a captured CUDA graph (forward and backward): each replay draws a new seed and offset on the
    device (torch's capture-safe generator, into the tensor the kernels read; a host seed would be baked into the
    graph and every replay would drop the same probabilities). With V = I the output is the dropped-out
    probability matrix, so each replay is checked against float64 math with its own mask, gradients included
    (the backward reads the forward's tensor)."""
    dtype, device, p = torch.bfloat16, "cuda", 0.3
    b, sq, sk, h, d = 1, 32, 48, 2, 64
    q = make((b, sq, h, d), dtype, device, 81)
    k = make((b, sk, h, d), dtype, device, 82)
    eye = torch.eye(sk, dtype=dtype, device=device).expand(b, h, sk, sk).transpose(1, 2).contiguous()
    dout = make((b, sq, h, sk), dtype, device, 83, requires_grad=False)

    def step():
        z = flash_attn_func(q, k, eye, dropout_p=p)
        return (z,) + torch.autograd.grad(z, (q, k), dout)

    graph, static = capture(step)
    probs, _ = math_attention(q, k, eye)
    masks = []
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        z, dq, dk = (t.clone() for t in static)
        keep = z != 0
        masks.append(keep)
        want = probs * keep.double() / (1 - p)
        tol = 8 * STORAGE_EPS[dtype]
        assert max_err(z, want) <= tol / (1 - p)
        want_dq, want_dk = torch.autograd.grad(want, (q, k), dout.double(), retain_graph=True)
        assert max_err(dq, want_dq) <= 2 * tol * max(1.0, want_dq.abs().max().item())
        assert max_err(dk, want_dk) <= 2 * tol * max(1.0, want_dk.abs().max().item())
    assert not torch.equal(masks[0], masks[1])


@pytest.mark.parametrize("device,backend", [
    pytest.param("cpu", "aot_eager", id="cpu-aot_eager"),
    pytest.param("cuda", "inductor", id="cuda-inductor", marks=requires_cuda_backward),
])
def test_torch_compile_dropout(device, backend):
    """Dropout under torch.compile(fullgraph=True): the seed is a device tensor drawn by torch's generator in the
    graph (no host integer, no graph break); each call draws a new mask, and the output and gradients are those
    of float64 math with the mask the call drew (V = I reveals it)."""
    torch._dynamo.reset()
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    b, sq, sk, h, d, p = 1, 24, 40, 2, 32, 0.4
    q = make((b, sq, h, d), dtype, device, 91)
    k = make((b, sk, h, d), dtype, device, 92)
    eye = torch.eye(sk, dtype=dtype, device=device).expand(b, h, sk, sk).transpose(1, 2).contiguous()
    dout = make((b, sq, h, sk), dtype, device, 93, requires_grad=False)
    compiled = torch.compile(lambda q, k, v: flash_attn_func(q, k, v, dropout_p=p, causal=True), fullgraph=True,
                             backend=backend)
    probs, _ = math_attention(q, k, eye, causal=True)
    tol = 1e-5 if dtype == torch.float32 else 8 * STORAGE_EPS[dtype]
    masks = []
    for _ in range(2):
        z = compiled(q, k, eye)
        dq, dk = torch.autograd.grad(z, (q, k), dout)
        keep = z.detach() != 0
        masks.append(keep)
        want = probs * keep.double() / (1 - p)
        assert max_err(z, want) <= tol / (1 - p)
        want_dq, want_dk = torch.autograd.grad(want, (q, k), dout.double(), retain_graph=True)
        assert max_err(dq, want_dq) <= 2 * tol * max(1.0, want_dq.abs().max().item())
        assert max_err(dk, want_dk) <= 2 * tol * max(1.0, want_dk.abs().max().item())
    assert not torch.equal(masks[0], masks[1])


def paged_from_packed(k, v, cu, page_size, gen):
    """A paged cache holding packed varlen k, v (T, H, D): each sequence's keys in its own random pages (some
    pages unused, the rest filled with noise), and the block table; pages per sequence padded with -1."""
    lens = (cu[1:] - cu[:-1]).tolist()
    pages = [(n + page_size - 1) // page_size for n in lens]
    num_pages = sum(pages) + 3
    order = torch.randperm(num_pages, generator=gen).tolist()
    kc = torch.randn((num_pages, page_size) + k.shape[1:], generator=gen).to(k.dtype)
    vc = torch.randn((num_pages, page_size) + v.shape[1:], generator=gen).to(v.dtype)
    table = torch.full((len(lens), max(pages) + 1), -1, dtype=torch.int32)
    for b, n in enumerate(lens):
        for t in range(n):
            page = order[sum(pages[:b]) + t // page_size]
            table[b, t // page_size] = page
            kc[page, t % page_size] = k[int(cu[b]) + t]
            vc[page, t % page_size] = v[int(cu[b]) + t]
    return kc, vc, table


@pytest.mark.parametrize("page_size", [1, 3, 16])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_paged_equals_packed(page_size, causal):
    """flash_attn_varlen_func with a block_table reads the same keys as the packed call (bit-equal outputs) and
    sends the packed call's key/value gradients to the pages' slots (zero elsewhere)."""
    gen = torch.Generator().manual_seed(page_size * 2 + causal)
    lens_q, lens_k = [3, 0, 7, 5, 2], [9, 4, 7, 17, 0]  # an empty query and an empty key sequence
    cu_q = torch.tensor([0] + list(itertools.accumulate(lens_q)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(itertools.accumulate(lens_k)), dtype=torch.int32)
    q = torch.randn(sum(lens_q), 4, 16, generator=gen)
    k, v = torch.randn(sum(lens_k), 2, 16, generator=gen), torch.randn(sum(lens_k), 2, 16, generator=gen)
    kc, vc, table = paged_from_packed(k, v, cu_k, page_size, gen)
    qp, kp, vp = (t.clone().requires_grad_() for t in (q, k, v))
    kcp, vcp, qq = kc.clone().requires_grad_(), vc.clone().requires_grad_(), q.clone().requires_grad_()
    ref = flash_attn_varlen_func(qp, kp, vp, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal)
    out = flash_attn_varlen_func(qq, kcp, vcp, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                 block_table=table)
    assert torch.equal(out, ref)
    dout = torch.randn(out.shape, generator=gen)
    ref.backward(dout)
    out.backward(dout)
    assert torch.equal(qq.grad, qp.grad)
    used = torch.zeros(kc.shape[:2], dtype=torch.bool)
    for b, n in enumerate(lens_k):
        for t in range(n):
            used[table[b, t // page_size], t % page_size] = True
    for got, packed in ((kcp.grad, kp.grad), (vcp.grad, vp.grad)):
        assert torch.equal(got[~used], torch.zeros_like(got[~used]))
        rows = torch.cat([torch.stack([got[table[b, t // page_size], t % page_size] for t in range(n)])
                          for b, n in enumerate(lens_k) if n > 0])
        assert torch.equal(rows, packed)


def test_varlen_paged_errors_name_the_argument():
    cu = torch.tensor([0, 5, 9], dtype=torch.int32)
    q = torch.randn(9, 2, 16)
    kc, vc = torch.randn(4, 4, 2, 16), torch.randn(4, 4, 2, 16)
    table = torch.tensor([[0, 1], [2, -1]], dtype=torch.int32)
    assert flash_attn_varlen_func(q, kc, vc, cu, cu, 5, 5, block_table=table).shape == (9, 2, 16)
    bad = [
        (dict(block_table=table.long()), "block_table: must be a 2-D int32"),
        (dict(block_table=table[:1]), "block_table: must have a row per sequence"),
        (dict(block_table=table[:, :1]), "block_table: has 1 pages per sequence"),
        (dict(block_table=torch.tensor([[0, 9], [2, -1]], dtype=torch.int32)), r"block_table: page indices"),
        (dict(block_table=torch.tensor([[0, 1], [-1, 2]], dtype=torch.int32)), r"block_table: page indices"),
        (dict(k=kc[0], block_table=table), "k: with block_table must be"),
        (dict(v=vc[:, :3], block_table=table), "v: with block_table must have"),
    ]
    for kwargs, message in bad:
        args = dict(q=q, k=kc, v=vc, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=5, max_seqlen_k=5)
        args.update(kwargs)
        with pytest.raises(ValueError, match=message):
            flash_attn_varlen_func(**args)
    with pytest.raises(ValueError, match="cu_seqlens_k: must start at 0"):
        flash_attn_varlen_func(q[1:], kc, vc, cu - 1, cu - 1, 5, 5, block_table=table)
