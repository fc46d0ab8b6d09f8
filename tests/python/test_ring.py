"""Ring attention (flashattn.distributed) on CPU with gloo: 2 and 4 processes on one machine against
single-process attention over the whole sequence (forward out and lse, backward dq/dk/dv), causal and not,
sliding windows (narrower and wider than a shard, one-sided), both layouts, GQA, shard lengths that differ (a
sequence not divisible by the chunk count), head dims not multiples of 8. Tolerance: the fp32 float64-reference
rule (2x the error of fp32 torch math, plus a floor); the ring's merge reorders fp32 sums, so it is not
bit-identical to one call.
"""

from __future__ import annotations

import os
import socket
import traceback
import zlib

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
mp = pytest.importorskip("torch.multiprocessing")

if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

# (name, batch, seqlen, heads_q, heads_kv, head_dim, causal, layout, window)
CASES = [
    ("full_contiguous", 2, 40, 4, 2, 32, False, "contiguous", (-1, -1)),
    ("causal_contiguous_uneven", 1, 37, 2, 2, 64, True, "contiguous", (-1, -1)),
    ("causal_zigzag_gqa", 2, 48, 4, 1, 32, True, "zigzag", (-1, -1)),
    ("causal_zigzag_uneven_d36", 1, 45, 2, 2, 36, True, "zigzag", (-1, -1)),
    ("full_zigzag_softcap", 1, 32, 2, 2, 16, False, "zigzag", (-1, -1)),
    # Sliding windows narrower and wider than a shard, one-sided, under causal (right side 0).
    ("window_contiguous", 1, 40, 2, 2, 32, False, "contiguous", (5, 3)),
    ("window_contiguous_uneven_wide", 2, 37, 4, 2, 32, False, "contiguous", (23, 11)),
    ("window_zigzag_causal_gqa", 2, 48, 4, 1, 32, True, "zigzag", (7, -1)),
    ("window_zigzag_left_only", 1, 45, 2, 2, 16, False, "zigzag", (-1, 2)),
    ("window_zigzag_right_only_softcap", 1, 44, 2, 2, 16, False, "zigzag", (0, 9)),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _reference(q, k, v, causal, softcap, window=(-1, -1)):
    """float64 (and fp32, the 'plain' implementation) attention over the whole sequence with autograd."""
    def attend(dtype):
        qf, kf, vf = (x.detach().to(dtype).requires_grad_() for x in (q, k, v))
        group = q.shape[2] // k.shape[2]
        kk, vv = kf.repeat_interleave(group, 2), vf.repeat_interleave(group, 2)
        s = torch.einsum("bihd,bjhd->bhij", qf, kk) * q.shape[-1] ** -0.5
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        n = q.shape[1]
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        left, right = window[0], 0 if causal else window[1]
        hidden = torch.zeros(n, n, dtype=torch.bool)
        if left >= 0:
            hidden |= j < i - left
        if right >= 0:
            hidden |= j > i + right
        s = s.masked_fill(hidden, float("-inf"))
        out = torch.einsum("bhij,bjhd->bihd", torch.softmax(s, -1), vv)
        return out, torch.logsumexp(s, -1), (qf, kf, vf)
    return attend(torch.float64), attend(torch.float32)


def _shard(x, rank, world, layout):
    from flashattn.distributed import zigzag_shard

    if layout == "zigzag":
        return zigzag_shard(x, rank, world)
    return torch.tensor_split(x, world, dim=1)[rank]


def _failures(rank, name, checks):
    """The checks (what, got, float64 want, fp32 plain or None) that miss the tolerance: 2x the plain error plus a
    floor, or 1e-5 where there is no plain counterpart (lse)."""
    failures = []
    for what, got, want, pl in checks:
        err = (got.double() - want.double()).abs().max().item() if got.numel() else 0.0
        tol = 1e-5 if pl is None else 2 * (pl.double() - want.double()).abs().max().item() + \
            1e-6 * max(1.0, want.abs().max().item())
        if not err <= tol:  # NaN fails
            failures.append(f"rank {rank} {name} {what}: max error {err:.3e} > {tol:.3e}")
    return failures


def _worker(rank, world, port, results):
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # containers whose hostname does not resolve
        dist.init_process_group("gloo", rank=rank, world_size=world)
        torch.set_num_threads(1)
        from flashattn.distributed import ring_flash_attn_func

        failures = []
        for name, b, n, hq, hkv, d, causal, layout, window in CASES:
            softcap = 3.0 if "softcap" in name else 0.0
            g = torch.Generator().manual_seed(zlib.crc32(name.encode()))  # the same inputs on every rank
            q, k, v = (torch.randn(b, n, h, d, generator=g) for h in (hq, hkv, hkv))
            dout = torch.randn(b, n, hq, d, generator=g)
            (exact, exact_lse, ex_in), (plain, _, pl_in) = _reference(q, k, v, causal, softcap, window)
            exact_grads = torch.autograd.grad(exact, ex_in, dout.double())
            plain_grads = torch.autograd.grad(plain, pl_in, dout)
            ql, kl, vl = (_shard(x, rank, world, layout).clone().requires_grad_() for x in (q, k, v))
            out, lse, _ = ring_flash_attn_func(ql, kl, vl, causal=causal, softcap=softcap, window_size=window,
                                               return_attn_probs=True, layout=layout)
            grads = torch.autograd.grad(out, (ql, kl, vl), _shard(dout, rank, world, layout))
            checks = [("out", out, _shard(exact, rank, world, layout), _shard(plain, rank, world, layout)),
                      ("lse", lse.transpose(1, 2), _shard(exact_lse.transpose(1, 2), rank, world, layout),
                       None)]
            checks += [(nm, got, _shard(w, rank, world, layout), _shard(p, rank, world, layout))
                       for nm, got, w, p in zip(("dq", "dk", "dv"), grads, exact_grads, plain_grads)]
            failures += _failures(rank, name, checks)
        results[rank] = failures
        dist.destroy_process_group()
    except Exception:
        results[rank] = [f"rank {rank}: {traceback.format_exc()}"]


# Packed sequences: (name, sequence lengths, heads_q, heads_kv, head_dim, causal, layout, window). Sequences
# shorter than the chunk count leave some ranks' shards of them empty.
VARLEN_CASES = [
    ("varlen_full_contiguous", [13, 30, 5], 4, 2, 32, False, "contiguous", (-1, -1)),
    ("varlen_causal_zigzag_gqa", [13, 30, 5, 1], 4, 1, 32, True, "zigzag", (-1, -1)),
    ("varlen_window_zigzag", [21, 9, 17], 2, 2, 16, False, "zigzag", (4, 6)),
    ("varlen_causal_window_contiguous_d36", [25, 3, 16], 2, 2, 36, True, "contiguous", (5, -1)),
]


def _varlen_worker(rank, world, port, results):
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo", rank=rank, world_size=world)
        torch.set_num_threads(1)
        from flashattn.distributed import ring_flash_attn_varlen_func, varlen_shard

        failures = []
        for name, lens, hq, hkv, d, causal, layout, window in VARLEN_CASES:
            g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
            total = sum(lens)
            cu = [0]
            for n in lens:
                cu.append(cu[-1] + n)
            q, k, v = (torch.randn(total, h, d, generator=g) for h in (hq, hkv, hkv))
            dout = torch.randn(total, hq, d, generator=g)
            # The reference: each sequence alone (batch 1), concatenated.
            exact, plain, exact_lse, exact_grads, plain_grads = [], [], [], [[], [], []], [[], [], []]
            for b in range(len(lens)):
                rows = slice(cu[b], cu[b + 1])
                (e, e_lse, e_in), (p, _, p_in) = _reference(q[None, rows], k[None, rows], v[None, rows], causal, 0.0,
                                                            window)
                exact.append(e[0])
                plain.append(p[0])
                exact_lse.append(e_lse[0])
                for acc, grad in zip(exact_grads, torch.autograd.grad(e, e_in, dout[None, rows].double())):
                    acc.append(grad[0])
                for acc, grad in zip(plain_grads, torch.autograd.grad(p, p_in, dout[None, rows])):
                    acc.append(grad[0])
            exact, plain, exact_lse = torch.cat(exact), torch.cat(plain), torch.cat(exact_lse, dim=1)
            exact_grads = [torch.cat(x) for x in exact_grads]
            plain_grads = [torch.cat(x) for x in plain_grads]

            def shard(x, dim=0):
                return varlen_shard(x, cu, rank, world, layout, dim)

            ql, kl, vl = (shard(x).clone().requires_grad_() for x in (q, k, v))
            out, lse, _ = ring_flash_attn_varlen_func(ql, kl, vl, torch.tensor(cu, dtype=torch.int32), causal=causal,
                                                      window_size=window, return_attn_probs=True, layout=layout)
            grads = torch.autograd.grad(out, (ql, kl, vl), shard(dout))
            checks = [("out", out, shard(exact), shard(plain)), ("lse", lse, shard(exact_lse, 1), None)]
            checks += [(nm, got, shard(w), shard(p)) for nm, got, w, p in
                       zip(("dq", "dk", "dv"), grads, exact_grads, plain_grads)]
            failures += _failures(rank, name, checks)
        results[rank] = failures
        dist.destroy_process_group()
    except Exception:
        results[rank] = [f"rank {rank}: {traceback.format_exc()}"]


def _spawn(worker, world):
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        results = manager.dict()
        port = _free_port()
        procs = [ctx.Process(target=worker, args=(r, world, port, results)) for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=300)
        for p in procs:
            if p.is_alive():
                p.kill()
        got = dict(results)
    assert sorted(got) == list(range(world)), f"ranks that reported: {sorted(got)}"
    problems = [f for r in range(world) for f in got[r]]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("world", [2, 4])
def test_ring_varlen_matches_each_sequence(world):
    _spawn(_varlen_worker, world)


@pytest.mark.parametrize("world", [2, 4])
def test_ring_matches_whole_sequence(world):
    _spawn(_worker, world)


def test_ring_refuses_what_it_cannot_do():
    from flashattn.distributed import ring_flash_attn_func

    q = torch.zeros(1, 8, 2, 16)
    with pytest.raises(NotImplementedError, match="alibi_slopes"):
        ring_flash_attn_func(q, q, q, alibi_slopes=torch.zeros(2))
    with pytest.raises(ValueError, match="window_size"):
        ring_flash_attn_func(q, q, q, window_size=(-2, 0))
    with pytest.raises(ValueError, match="layout"):
        ring_flash_attn_func(q, q, q, layout="striped")
    from flashattn.distributed import ring_flash_attn_varlen_func

    with pytest.raises(ValueError, match="cu_seqlens"):
        ring_flash_attn_varlen_func(q[0], q[0], q[0], [0, 5, 3])
    with pytest.raises(ValueError, match="q: must be"):
        ring_flash_attn_varlen_func(q, q, q, [0, 8])


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_merge_partials_is_the_attention_over_both_parts(device, dtype):
    """flashattn.ops.merge_partials (the C ABI's fa_merge_partials, which the ring merges with) on a torch tensor
    pair: attentions of the same queries over keys [0, s) and [s, n) merge into the attention over [0, n), in
    place on strided fp32 views; rows that saw no key of a part (causal) take the other part unread."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from flashattn import ops
    from flashattn.distributed import merge_partials

    n, s, h, d = 50, 20, 3, 16
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, n, h, d, generator=gen, dtype=torch.float64) for _ in range(3))

    def attend(k0, k1):  # query i sees key j (of [k0, k1)) when j <= i; lse -inf for rows that see none
        sc = torch.einsum("bihd,bjhd->bhij", q, k[:, k0:k1]) * d ** -0.5
        i, j = torch.arange(n)[:, None], torch.arange(k0, k1)[None, :]
        sc = sc.masked_fill(j > i, float("-inf"))
        lse = torch.logsumexp(sc, -1)
        p = torch.where(torch.isfinite(lse)[..., None], torch.softmax(sc, -1), torch.zeros_like(sc)).nan_to_num()
        return torch.einsum("bhij,bjhd->bihd", p, v[:, k0:k1]), lse

    whole, whole_lse = attend(0, n)
    (oa, la), (ob, lb) = attend(0, s), attend(s, n)
    assert torch.isinf(lb[..., :s]).all()
    ob = ob.clone()
    ob[:, :s] = float("nan")  # never read: those rows' weight is 0
    # The running partial as a strided fp32 view (every other head of a wider buffer), as the ring holds it.
    wide = torch.zeros(1, n, 2 * h, d, dtype=torch.float32, device=device)
    wide_lse = torch.zeros(1, 2 * h, n, dtype=torch.float32, device=device)
    out, lse = wide[:, :, ::2], wide_lse[:, ::2]
    out.copy_(oa), lse.copy_(la)
    ops.merge_partials(out, lse, ob.to(device, dtype), lb.to(device, torch.float32))
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out.double().cpu(), whole, atol=tol, rtol=tol)
    torch.testing.assert_close(lse.double().cpu(), whole_lse, atol=1e-5, rtol=1e-5)
    assert (wide[:, :, 1::2] == 0).all() and (wide_lse[:, 1::2] == 0).all()
    # The functional form returns new fp32 tensors and leaves its inputs alone.
    oa_d, la_d = oa.to(device, dtype), la.to(device, torch.float32)
    merged, merged_lse = merge_partials(oa_d, la_d, ob.to(device, dtype), lb.to(device, torch.float32))
    assert merged.dtype == torch.float32 and torch.equal(oa_d, oa.to(device, dtype))
    torch.testing.assert_close(merged.double().cpu(), whole, atol=tol, rtol=tol)
    torch.testing.assert_close(merged_lse.double().cpu(), whole_lse, atol=1e-5, rtol=1e-5)
