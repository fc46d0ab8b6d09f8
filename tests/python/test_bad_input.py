"""Bad input through the numpy binding (issue 16): a named ValueError or a correct result, never a crash.

The targeted tests pin one rule each; test_fuzz runs the seeded generator of fuzz_cases.py, one child
process per case (FA_FUZZ_PY_CASES cases, default 120; the deep tier sets more).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from flashattn import ops

from fa_reference import Mask, assert_close, attention


def _qkv(b=1, sq=9, sk=11, hq=4, hkv=2, d=16, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, sq, hq, d)).astype(dtype)
    k = rng.standard_normal((b, sk, hkv, d)).astype(dtype)
    v = rng.standard_normal((b, sk, hkv, d)).astype(dtype)
    return q, k, v


@pytest.mark.parametrize("empty", ["batch", "seqlen_q", "seqlen_k"])
def test_empty_problems_are_valid(empty):
    # numpy gives zero-size arrays zero strides; they used to be refused with a "unit stride" message.
    b, sq, sk = (0 if empty == "batch" else 2), (0 if empty == "seqlen_q" else 5), (0 if empty == "seqlen_k" else 7)
    q, k, v = _qkv(b, sq, sk)
    out, lse = ops.forward(q, k, v)
    assert out.shape == (b, sq, 4, 16) and lse.shape == (b, 4, sq)
    assert np.all(out == 0) and np.all(np.isneginf(lse))
    dq, dk, dv = ops.backward(np.ones_like(out), q, k, v, out, lse)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    assert np.all(dq == 0)


def test_output_aliasing_an_input_is_refused():
    q, k, v = _qkv(sq=11, hq=2)
    with pytest.raises(ValueError, match="out: must not overlap v in memory"):
        ops.forward(q, k, v, out=v.reshape(1, 11, 2, 16))
    out = np.empty((1, 11, 2, 16), np.float32)
    lse = out.reshape(-1)[:22].reshape(1, 2, 11)  # a view into out's storage
    with pytest.raises(ValueError, match="lse: must not overlap out in memory"):
        ops.forward(q, k, v, out=out, lse=lse)


def test_gradient_aliasing_is_refused():
    q, k, v = _qkv()
    out, lse = ops.forward(q, k, v)
    with pytest.raises(ValueError, match="dq: must not overlap q in memory"):
        ops.backward(np.ones_like(out), q, k, v, out, lse, dq=q)
    dk = np.empty_like(k)
    with pytest.raises(ValueError, match="dv: must not overlap dk in memory"):
        ops.backward(np.ones_like(out), q, k, v, out, lse, dk=dk, dv=dk)


def test_packed_gradients_are_not_overlap():
    q, k, v = _qkv(sk=9, hkv=4)
    dout = np.random.default_rng(3).standard_normal(q.shape).astype(np.float32)
    out, lse = ops.forward(q, k, v)
    want = ops.backward(dout, q, k, v, out, lse)
    dqkv = np.full((1, 9, 3, 4, 16), np.nan, np.float32)
    got = ops.backward(dout, q, k, v, out, lse, dq=dqkv[:, :, 0], dk=dqkv[:, :, 1], dv=dqkv[:, :, 2])
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("window", [(2**63 - 1, 2**63 - 1), (2**63 - 1, 0), (3, 2**62)])
def test_huge_windows_mean_unbounded(window):
    q, k, v = _qkv()
    got, got_lse = ops.forward(q, k, v, window_size=window)
    unbounded = tuple(-1 if w >= 11 else w for w in window)
    want, want_lse = ops.forward(q, k, v, window_size=unbounded)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got_lse, want_lse)


def test_huge_thread_counts_are_clamped():
    q, k, v = _qkv()
    out, lse = ops.forward(q, k, v, num_threads=100000)
    exact, _ = attention(q, k, v, Mask())
    plain, _ = attention(q, k, v, Mask(), storage=np.float32)
    assert_close("out", out, exact, plain, np.float32)
    with pytest.raises(ValueError, match=r"num_threads: must be in \[0, 2147483647\]"):
        ops.forward(q, k, v, num_threads=2**31)
    with pytest.raises(ValueError, match="window_size: must be in"):
        ops.forward(q, k, v, window_size=(2**63, -1))


def test_binding_messages_name_the_argument():
    q, k, v = _qkv()
    out = np.empty_like(q)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out: must be writable"):
        ops.forward(q, k, v, out=out)
    with pytest.raises(ValueError, match="q: must be in native byte order"):
        ops.forward(q.astype(q.dtype.newbyteorder()), k, v)
    o, lse = ops.forward(q, k, v)
    with pytest.raises(ValueError, match="lse: required by the backward"):
        ops.backward(np.ones_like(o), q, k, v, o, None)
    cu = np.array([0, 9], np.int64)
    with pytest.raises(ValueError, match=r"cu_seqlens_q: dtype must be int32 \(prefix sums of sequence lengths\)"):
        ops.forward(q[0], k[0, :9], v[0, :9], cu_seqlens_q=cu, cu_seqlens_k=cu.astype(np.int32))
    with pytest.raises(ValueError, match=r"alibi_slopes: dtype must be float32 \(one slope per head\) \(got float64\)"):
        ops.forward(q, k, v, alibi_slopes=np.ones(4))


def test_quantize_fp8_arguments_are_named():
    # A non-array x used to fail on x.shape (AttributeError), a seed of None inside int().
    from flashattn import quantize_fp8

    with pytest.raises(TypeError, match=r"x: must be an array \(torch, numpy or DLPack\) \(got list\)"):
        quantize_fp8([1.0, 2.0])
    x = np.ones((1, 2, 1, 8), np.float32)
    with pytest.raises(TypeError, match=r"seed: must be an int \(got NoneType\)"):
        quantize_fp8(x, hadamard=True, seed=None)
    out, descale = quantize_fp8(x)
    assert out.shape == x.shape and descale.shape == (1, 1)


def test_fuzz():
    cases = int(os.environ.get("FA_FUZZ_PY_CASES", "120"))
    seed = int(os.environ.get("FA_FUZZ_SEED", "1"))
    script = os.path.join(os.path.dirname(__file__), "fuzz_cases.py")
    # A fresh interpreter forks the cases: it never runs a kernel itself (a fork of a process that has run
    # OpenMP regions can hang in libgomp).
    run = subprocess.run([sys.executable, script, str(seed), str(cases)], capture_output=True, text=True, timeout=3600)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
