"""flash_attn_with_kvcache: rotary, in-place cache append (contiguous and paged), cache_batch_idx, cache_leftpad,
split-KV, against a float64 reference written independently of the implementation (per sequence, from the
caches as they were before the call).

Tolerance as everywhere: error <= 2x the error of the same computation in the storage dtype, plus a floor.
CPU always (float32 and bfloat16); CUDA (bfloat16, float16) when a CUDA build and device are present.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from flashattn import flash_attn_with_kvcache, ops  # noqa: E402

from fa_reference import storage_eps_by  # noqa: E402

HAS_CUDA = torch.cuda.is_available() and ops.cuda_available()
# Floors of the tolerance per storage dtype: the suites' one rule (docs/testing.md), from fa_reference.
EPS = storage_eps_by(torch)
CASES = [("cpu", torch.float32), ("cpu", torch.bfloat16)]
if HAS_CUDA:
    CASES += [("cuda", torch.bfloat16), ("cuda", torch.float16)]


def rand(shape, dtype, device, gen):
    return torch.randn(shape, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)


def rotate_ref(x, cos, sin, positions, interleaved, dtype):
    """x (S, H, D) at integer positions (S,): complex-number form of the rotation, in `dtype`."""
    r = cos.shape[1]
    c, s = cos[positions].to(dtype)[:, None, :], sin[positions].to(dtype)[:, None, :]
    y = x.to(dtype).clone()
    if interleaved:
        a, b = x[..., 0:2 * r:2].to(dtype), x[..., 1:2 * r:2].to(dtype)
        z = torch.complex(a, b) * torch.complex(c, s) if dtype == torch.float64 else None
        if z is not None:
            y[..., 0:2 * r:2], y[..., 1:2 * r:2] = z.real, z.imag
        else:
            y[..., 0:2 * r:2], y[..., 1:2 * r:2] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., :r].to(dtype), x[..., r:2 * r].to(dtype)
        y[..., :r], y[..., r:2 * r] = a * c - b * s, a * s + b * c
    return y


def attend_ref(q, k, v, causal, window, softcap, scale, dtype):
    """One sequence: q (Sq, Hq, D), k/v (Sk, Hkv, D), bottom-right aligned mask; out (Sq, Hq, Dv), lse (Hq, Sq)."""
    sq, sk = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    kk, vv = k.to(dtype).repeat_interleave(group, 1), v.to(dtype).repeat_interleave(group, 1)
    s = torch.einsum("ihd,jhd->hij", q.to(dtype), kk) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(sq, device=q.device)[:, None] + (sk - sq)
    j = torch.arange(sk, device=q.device)[None, :]
    left, right = window
    if causal:
        right = 0
    vis = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if left >= 0:
        vis &= j >= i - left
    if right >= 0:
        vis &= j <= i + right
    s = s.masked_fill(~vis, float("-inf"))
    lse = torch.logsumexp(s.double(), dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # rows without a visible key: 0
    return torch.einsum("hij,jhd->ihd", p, vv), lse


def reference(q, k_cache, v_cache, k, v, cos, sin, seqlens, batch_idx, leftpad, block_table, causal, window,
              softcap, interleaved, dtype):
    """The whole call in `dtype`: returns (out (B, Sq, Hq, Dv), lse (B, Hq, Sq), new k_cache, new v_cache)."""
    kc, vc = k_cache.clone(), v_cache.clone()
    batch, sq = q.shape[0], q.shape[1]
    new = 0 if k is None else k.shape[1]
    scale = q.shape[-1] ** -0.5
    outs, lses = [], []
    for b in range(batch):
        n0 = int(seqlens[b])
        qb = q[b]
        kb = None if k is None else k[b]
        if cos is not None:
            kb = rotate_ref(kb, cos, sin, torch.arange(n0, n0 + new), interleaved, torch.float64).to(q.dtype)
            per_token = causal or window != (-1, -1)
            qpos = torch.arange(n0, n0 + sq) if per_token else torch.full((sq,), n0)
            qb = rotate_ref(qb, cos, sin, qpos, interleaved, torch.float64).to(q.dtype)
        # The sequence's keys as a list of cache rows (page, slot) or (row, slot).
        rows = []
        for pos in range(n0 + new):
            if block_table is not None:
                ps = kc.shape[1]
                rows.append((int(block_table[b, pos // ps]), pos % ps))
            else:
                rows.append((b if batch_idx is None else int(batch_idx[b]), pos))
        for t in range(new):
            r, s = rows[n0 + t]
            kc[r, s], vc[r, s] = kb[t], v[b, t]
        first = 0 if leftpad is None else int(leftpad[b])
        keys = torch.stack([kc[r, s] for r, s in rows[first:]]) if len(rows) > first else kc[0, :0]
        vals = torch.stack([vc[r, s] for r, s in rows[first:]]) if len(rows) > first else vc[0, :0]
        o, lse = attend_ref(qb, keys, vals, causal, window, softcap, scale, dtype)
        outs.append(o)
        lses.append(lse)
    return torch.stack(outs), torch.stack(lses), kc, vc


def max_err(got, want):
    got, want = got.double().cpu(), want.double().cpu()
    assert got.shape == want.shape, (got.shape, want.shape)
    if torch.isnan(got).any():
        return math.inf
    return (got - want).abs().max().item() if got.numel() else 0.0


def run(device, dtype, *, batch=3, sq=1, new=1, cache_len=200, hq=8, hkv=2, d=64, dv=None, seqlens=None,
        rotary_dim=0, interleaved=True, batch_idx=False, leftpad=False, page_size=0, causal=False,
        window=(-1, -1), softcap=0.0, num_splits=0, seed=0):
    dv = d if dv is None else dv
    gen = torch.Generator().manual_seed(seed)
    seqlens = torch.tensor(seqlens if seqlens is not None else
                           [int(x) for x in torch.randint(0, cache_len - new + 1, (batch,), generator=gen)],
                           dtype=torch.int32)
    q = rand((batch, sq, hq, d), dtype, device, gen)
    k = rand((batch, new, hkv, d), dtype, device, gen) if new else None
    v = rand((batch, new, hkv, dv), dtype, device, gen) if new else None
    block_table = None
    if page_size:
        pages = (cache_len + page_size - 1) // page_size
        total = batch * pages + 3
        block_table = torch.randperm(total, generator=gen)[: batch * pages].view(batch, pages).to(torch.int32)
        k_cache = rand((total, page_size, hkv, d), dtype, device, gen)
        v_cache = rand((total, page_size, hkv, dv), dtype, device, gen)
    else:
        rows = batch + 2 if batch_idx else batch
        k_cache = rand((rows, cache_len, hkv, d), dtype, device, gen)
        v_cache = rand((rows, cache_len, hkv, dv), dtype, device, gen)
    bidx = torch.randperm(batch + 2, generator=gen)[:batch].to(torch.int32) if batch_idx else None
    lpad = torch.minimum(torch.randint(0, 20, (batch,), generator=gen, dtype=torch.int32), seqlens) if leftpad else None
    cos = sin = None
    if rotary_dim:
        angle = torch.rand(cache_len + sq, rotary_dim // 2, generator=gen, dtype=torch.float64) * 2 * math.pi
        cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)
    kc0, vc0 = k_cache.clone(), v_cache.clone()
    to = (lambda t: None if t is None else t.to(device))
    out, lse = flash_attn_with_kvcache(
        q, k_cache, v_cache, k, v, rotary_cos=to(cos), rotary_sin=to(sin), cache_seqlens=seqlens.to(device),
        cache_batch_idx=to(bidx), cache_leftpad=to(lpad), block_table=to(block_table), causal=causal,
        window_size=window, softcap=softcap, rotary_interleaved=interleaved, num_splits=num_splits,
        return_softmax_lse=True)
    args = (q.cpu(), kc0.cpu(), vc0.cpu(), None if k is None else k.cpu(), None if v is None else v.cpu(),
            None if cos is None else cos.double(), None if sin is None else sin.double(), seqlens, bidx, lpad,
            block_table, causal, window, softcap, interleaved)
    exact, exact_lse, kc_want, vc_want = reference(*args, torch.float64)
    plain, _, _, _ = reference(*args, dtype)
    err, err_plain = max_err(out, exact), max_err(plain, exact)
    tol = 2 * err_plain + EPS[dtype] * max(1.0, exact.abs().max().item())
    assert err <= tol, f"out: max error {err:.3e} > tolerance {tol:.3e} (plain {err_plain:.3e})"
    finite = torch.isfinite(exact_lse)
    assert torch.equal(torch.isfinite(lse.cpu()), finite)
    assert max_err(lse.cpu()[finite], exact_lse[finite]) <= 1e-3 * max(1.0, exact_lse[finite].abs().max().item())
    # The cache: the new tokens where they belong (rotated keys within a rounding), everything else untouched.
    tol_k = 4 * EPS[dtype] * max(1.0, kc_want.abs().max().item())
    assert max_err(k_cache, kc_want.to(dtype)) <= (tol_k if rotary_dim else 0.0)
    assert max_err(v_cache, vc_want.to(dtype)) == 0.0
    return out


@pytest.mark.parametrize("device,dtype", CASES)
def test_decode_append_gqa_causal(device, dtype):
    run(device, dtype, causal=True)


@pytest.mark.parametrize("device,dtype", CASES)
def test_no_new_tokens_window_softcap(device, dtype):
    run(device, dtype, new=0, window=(30, 0), softcap=3.0, seqlens=[0, 1, 200])


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("interleaved", [True, False])
def test_chunked_prefill_rotary(device, dtype, interleaved):
    run(device, dtype, sq=5, new=5, causal=True, rotary_dim=32, interleaved=interleaved, d=64)


@pytest.mark.parametrize("device,dtype", CASES)
def test_rotary_not_causal_rotates_q_at_cache_seqlens(device, dtype):
    run(device, dtype, sq=3, new=2, rotary_dim=64, d=64)


@pytest.mark.parametrize("device,dtype", CASES)
def test_cache_batch_idx_and_mqa(device, dtype):
    run(device, dtype, batch_idx=True, hq=4, hkv=1, new=3, sq=3, causal=True, dv=32)


@pytest.mark.parametrize("device,dtype", CASES)
def test_cache_leftpad(device, dtype):
    run(device, dtype, leftpad=True, new=2, sq=2, causal=True)


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("page_size", [1, 16, 256])
def test_paged_cache(device, dtype, page_size):
    run(device, dtype, page_size=page_size, cache_len=300, new=2, sq=2, causal=True, rotary_dim=16)


@pytest.mark.parametrize("device,dtype", CASES)
def test_head_dim_not_multiple_of_8(device, dtype):
    run(device, dtype, d=36, new=1)


@pytest.mark.skipif(not HAS_CUDA, reason="split-KV runs on cuda-sm90")
@pytest.mark.parametrize("num_splits", [1, 3, 16])
def test_num_splits_long_cache(num_splits):
    run("cuda", torch.bfloat16, batch=2, cache_len=5000, hq=32, hkv=8, d=128, num_splits=num_splits)


def test_errors_name_the_argument():
    q = torch.zeros(2, 1, 4, 64)
    kc, vc = torch.zeros(2, 10, 2, 64), torch.zeros(2, 10, 2, 64)
    k = v = torch.zeros(2, 1, 2, 64)
    with pytest.raises(ValueError, match="cache_seqlens"):
        flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=torch.tensor([10, 3], dtype=torch.int32))
    with pytest.raises(ValueError, match="cache_seqlens"):
        flash_attn_with_kvcache(q, kc, vc, k, v)  # where to append?
    with pytest.raises(ValueError, match="^v:"):
        flash_attn_with_kvcache(q, kc, vc, k, None, cache_seqlens=1)
    with pytest.raises(ValueError, match="rotary_cos"):
        flash_attn_with_kvcache(q, kc, vc, rotary_cos=torch.zeros(10, 8), rotary_sin=torch.zeros(10, 8),
                                cache_seqlens=1)
    with pytest.raises(ValueError, match="rotary_cos"):  # positions beyond the table
        flash_attn_with_kvcache(q, kc, vc, k, v, rotary_cos=torch.zeros(3, 8), rotary_sin=torch.zeros(3, 8),
                                cache_seqlens=5)
    pages = torch.zeros(4, 4, 2, 64)
    with pytest.raises(ValueError, match="block_table"):
        flash_attn_with_kvcache(q, pages, pages.clone(), k, v, cache_seqlens=1,
                                block_table=torch.tensor([[9, 0], [1, 2]], dtype=torch.int32))
    # Entries past the used pages are never read: no error.
    flash_attn_with_kvcache(q, pages, pages.clone(), cache_seqlens=2,
                            block_table=torch.tensor([[0, -5], [1, 99]], dtype=torch.int32))
    with pytest.raises(ValueError, match="block_table"):
        flash_attn_with_kvcache(q, pages, pages.clone(), k, v, cache_seqlens=1,
                                block_table=torch.tensor([[0, 1]], dtype=torch.int64))
    with pytest.raises(ValueError, match="cache_batch_idx"):
        flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=1,
                                cache_batch_idx=torch.tensor([0, 2], dtype=torch.int32))
    with pytest.raises(ValueError, match="num_splits"):
        flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=1, num_splits=1.5)
    # flash_attn takes any num_splits < 1 as its heuristic's pick.
    assert torch.equal(flash_attn_with_kvcache(q, kc, vc, cache_seqlens=3, num_splits=-2),
                       flash_attn_with_kvcache(q, kc, vc, cache_seqlens=3, num_splits=0))
    # A decode step that appends nothing, past the cache: named as the caller's argument on the CPU (the library
    # saw only its seqused_k; CUDA kernels clamp to the cache instead of synchronising to check).
    with pytest.raises(ValueError, match="^cache_seqlens: entries must be at most the cache's 10 slots"):
        flash_attn_with_kvcache(q, kc, vc, cache_seqlens=torch.tensor([11, 3], dtype=torch.int32))
    with pytest.raises(ValueError, match="^cache_seqlens: entries must be at most the cache's 8 slots"):
        flash_attn_with_kvcache(q, pages, pages.clone(), cache_seqlens=9,
                                block_table=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32))
    # Nothing was written by the refused calls.
    assert not kc.any() and not pages.any()


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build of flashattn")
def test_cuda_graph_decode_loop():
    """A decode step (append one token with rotary, attend) captured once and replayed with new inputs and
    cache_seqlens advanced between replays: no host synchronisation or allocation inside the call."""
    gen = torch.Generator().manual_seed(3)
    batch, hq, hkv, d, cap = 2, 8, 2, 64, 300
    dt = torch.bfloat16
    kc, vc = rand((batch, cap, hkv, d), dt, "cuda", gen), rand((batch, cap, hkv, d), dt, "cuda", gen)
    angle = torch.rand(cap, 16, generator=gen, dtype=torch.float64) * 2 * math.pi
    cos, sin = angle.cos().to(dt).cuda(), angle.sin().to(dt).cuda()
    lens = torch.tensor([3, 250], dtype=torch.int32, device="cuda")
    sq, sk, sv = (rand((batch, 1, h, d), dt, "cuda", gen) for h in (hq, hkv, hkv))

    def step():
        return flash_attn_with_kvcache(sq, kc, vc, sk, sv, rotary_cos=cos, rotary_sin=sin, cache_seqlens=lens,
                                       causal=True)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up (also appends: the reference starts from the caches after it)
    torch.cuda.current_stream().wait_stream(side)
    ref_kc, ref_vc = kc.clone(), vc.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for _ in range(4):
        x = [rand(t.shape, dt, "cuda", gen) for t in (sq, sk, sv)]
        for dst, src in zip((sq, sk, sv), x):
            dst.copy_(src)
        graph.replay()
        want = flash_attn_with_kvcache(x[0], ref_kc, ref_vc, x[1], x[2], rotary_cos=cos, rotary_sin=sin,
                                       cache_seqlens=lens.clone(), causal=True)
        torch.cuda.synchronize()
        assert torch.equal(out, want)
        assert torch.equal(kc, ref_kc) and torch.equal(vc, ref_vc)
        lens.add_(1)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build of flashattn")
@pytest.mark.parametrize("num_splits", [4, 16])
def test_cuda_graph_split_decode(num_splits):
    """A split-KV decode call (the forward's partials in the workspace, then the combine kernel) captured and
    replayed with new queries: each replay equals an uncaptured call bit for bit, so no replay's combine reads the
    partials of another (the queries change between replays)."""
    gen = torch.Generator().manual_seed(5)
    batch, hq, hkv, d, keys = 1, 16, 2, 128, 4096
    dt = torch.bfloat16
    kc, vc = rand((batch, keys, hkv, d), dt, "cuda", gen), rand((batch, keys, hkv, d), dt, "cuda", gen)
    q = rand((batch, 1, hq, d), dt, "cuda", gen)

    def step():
        return flash_attn_with_kvcache(q, kc, vc, num_splits=num_splits, return_softmax_lse=True)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = step()
    for _ in range(3):
        q.copy_(rand(q.shape, dt, "cuda", gen))
        graph.replay()
        want, want_lse = flash_attn_with_kvcache(q.clone(), kc, vc, num_splits=num_splits, return_softmax_lse=True)
        torch.cuda.synchronize()
        assert torch.equal(out, want) and torch.equal(lse, want_lse)
        assert not out.isnan().any()


@pytest.mark.parametrize("paged", [False, True])
def test_torch_compile_fullgraph_decode_step(paged):
    """torch.compile(fullgraph=True) traces a decode step (rotary, in-place append, attention): the same output
    and caches as the eager call (CPU, aot_eager)."""
    gen = torch.Generator().manual_seed(11)
    batch, hq, hkv, d, cap, page = 2, 4, 2, 32, 64, 16
    q, k, v = (rand((batch, 2, h, d), torch.float32, "cpu", gen) for h in (hq, hkv, hkv))
    if paged:
        kc, vc = rand((batch * cap // page, page, hkv, d), torch.float32, "cpu", gen), \
            rand((batch * cap // page, page, hkv, d), torch.float32, "cpu", gen)
        table = torch.randperm(batch * cap // page, generator=gen).view(batch, -1).to(torch.int32)
    else:
        kc, vc = (rand((batch, cap, hkv, d), torch.float32, "cpu", gen) for _ in range(2))
        table = None
    angle = torch.rand(cap, 8, generator=gen, dtype=torch.float64)
    cos, sin = angle.cos().float(), angle.sin().float()
    lens = torch.tensor([5, 40], dtype=torch.int32)

    def step(q, kc, vc, k, v, lens):
        return flash_attn_with_kvcache(q, kc, vc, k, v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=lens,
                                       block_table=table, causal=True)

    kc2, vc2 = kc.clone(), vc.clone()
    want = step(q, kc, vc, k, v, lens)
    got = torch.compile(step, fullgraph=True, backend="aot_eager")(q, kc2, vc2, k, v, lens)
    assert max_err(got, want) <= 1e-6
    assert torch.equal(kc2, kc) and torch.equal(vc2, vc)
