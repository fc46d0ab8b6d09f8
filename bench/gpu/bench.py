"""Ours against torch SDPA's cuDNN and FLASH (FlashAttention-2) backends, side by side in one process.

Protocol of ../shared/anchors/sdpa_bench.py: triton do_bench median (warm-up 50 ms, 200 ms of repeats),
batch*seqlen = 16k tokens, model dim 2048 (heads = 2048 / head dim), (B, S, H, D) storage (SDPA gets the
(B, H, S, D) view), head dims 64/128/256, causal and not, seqlen 512..16k, forward and backward (backward as
torch.autograd.grad of the forward's output), FLOPs 4*B*H*S*S*D (/2 causal), bwd 2.5x. Both bf16 and fp16.
Plus: the bf16 matmul and copy ceilings, and the peak extra memory of one long shape.

Ours twice per forward shape: 'ours' is flash_attn_func (backend AUTO: cuda-sm90 on Hopper; the note
names the backend), 'ours_sm80' is flashattn.ops.forward(..., backend="cuda-sm80") into caller-owned out/lse
(the FA2-style forward, for its ratio to FA2 in the same run).

--ablations (only for a build with the sm90 ablation variants): after the main table, the sm90 bf16 d128
forward at seqlen 2048/8192/16384, causal and not (same protocol), once per variant of
FLASHATTN_SM90_MECHANISMS (read by the library at every forward call, so it is set between timings), with
cuDNN at the same shapes for reference. Rows kind=ablation, backend=variant ('default' = the variable unset).
A build without the variants ignores the variable: every variant then times the default kernel.

  python3 bench.py --csv results.csv [--quick] [--ablations] [--deadline EPOCH_S] [--dtypes bf16,fp16]
                   [--training-only] [--decode-only] [--features LIST]
Rows: kind,backend,dtype,hdim,causal,seqlen,batch,heads,ms,tflops,note  (ceilings: tflops is TFLOP/s or TB/s;
memory: ms is empty, tflops holds MiB). Every timed shape of ours is also checked against FA2's output
(note 'maxdiff_vs_fa2=...'; ablation rows against cuDNN's) so that a fast wrong kernel cannot hide in the table.
"""
from __future__ import annotations

import argparse
import csv
import inspect
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402
import report  # noqa: E402

try:  # FlashAttention-4 (PyPI flash-attn-4), a live peer where it imports: bench/gpu/dev/fa4_parts.sh puts it there
    from flash_attn.cute import flash_attn_func as fa4_func
except Exception:  # noqa: BLE001 - absent or broken: the table has no FA4 column
    fa4_func = None

torch.backends.cuda.matmul.allow_tf32 = False
DEV = "cuda"
TOKENS = 16384
MODEL_DIM = 2048
PEERS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash2": SDPBackend.FLASH_ATTENTION}
MECHANISMS_ENV = "FLASHATTN_SM90_MECHANISMS"
ABLATION_VARIANTS = ("default", "no_pingpong", "no_overlap", "not_persistent", "stages1", "block_k128",
                     "no_pingpong_no_overlap", "smem_epilogue", "late_q_release", "serial_rows",
                     "eager_store_wait", "single_q", "plain_pv_wait", "eager_rescale")
ABLATION_SEQLENS = (2048, 8192, 16384)
ABLATION_HDIM = 128
FIELDS = ["kind", "backend", "dtype", "hdim", "causal", "seqlen", "batch", "heads", "ms", "tflops", "note"]


class Bench:
    def __init__(self, path: str, warmup_ms: int, rep_ms: int):
        self.f = open(path, "w", newline="")
        self.w = csv.DictWriter(self.f, FIELDS)
        self.w.writeheader()
        self.warmup, self.rep = warmup_ms, rep_ms

    def time(self, fn) -> float:
        return do_bench(fn, warmup=self.warmup, rep=self.rep, return_mode="median")

    def measure(self, kind: str, backend: str, fn, flops: float, base: dict, note_of=None, digits: int = 1):
        """Times fn and writes its row; returns one call's result (None, with an NA row, if fn raises).
        note_of(result) adds a note (e.g. the agreement with FA2's output). flops: FLOPs (TFLOP/s column) or
        bytes (decode rows: TB/s)."""
        try:
            result = fn()
            note = note_of(result) if note_of else ""
            ms = self.time(fn)
        except Exception as e:
            self.row(kind=kind, backend=backend, ms="NA", note=f"{type(e).__name__}: {str(e)[:80]}", **base)
            return None
        self.row(kind=kind, backend=backend, ms=f"{ms:.4f}", tflops=f"{flops / ms / 1e9:.{digits}f}", note=note, **base)
        return result

    def row(self, **kw):
        r = {k: kw.get(k, "") for k in FIELDS}
        self.w.writerow(r)
        self.f.flush()
        vals = "\t".join(str(r[k]) for k in FIELDS)
        print(vals, flush=True)


def ceilings(b: Bench):
    """The bf16 matmul rate and the copy bandwidth, at the anchor script's sizes so the runs compare."""
    def matmul():
        n = 8192
        a = torch.randn(n, n, device=DEV, dtype=torch.bfloat16)
        c = torch.randn(n, n, device=DEV, dtype=torch.bfloat16)
        ms = b.time(lambda: a @ c)
        b.row(kind="ceiling", backend="matmul_bf16_8192", ms=f"{ms:.4f}", tflops=f"{2 * n ** 3 / ms / 1e9:.1f}",
              note="TFLOP/s")

    def copy():
        x = torch.randn(1024 ** 3, device=DEV, dtype=torch.bfloat16)  # 2 GiB read + 2 GiB written
        y = torch.empty_like(x)
        ms = b.time(lambda: y.copy_(x))
        b.row(kind="ceiling", backend="copy_4GiB_rw", ms=f"{ms:.4f}",
              tflops=f"{2 * x.numel() * x.element_size() / ms / 1e9:.2f}", note="TB/s")

    matmul()
    copy()
    torch.cuda.empty_cache()


def ours_fns(fa, q, k, v, causal):
    """fwd and (fwd-output, bwd) closures of ours on (B, S, H, D) tensors; bwd None if not implemented."""
    fwd = lambda: fa.flash_attn_func(q, k, v, causal=causal)  # noqa: E731
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    o = fa.flash_attn_func(qg, kg, vg, causal=causal)
    do = torch.randn_like(o)
    try:
        torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)
    except Exception as e:
        if not common.is_not_implemented(e):
            raise
        return fwd, None, f"bwd not implemented ({type(e).__name__})"
    return fwd, (lambda: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)), ""


def fa4_fns(q, k, v, causal):
    """fwd and bwd closures of FlashAttention-4 on (B, S, H, D) tensors (its forward returns (out, lse))."""
    def first(r):
        return r[0] if isinstance(r, tuple) else r

    fwd = lambda: first(fa4_func(q, k, v, causal=causal))  # noqa: E731
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    o = first(fa4_func(qg, kg, vg, causal=causal))
    do = torch.randn_like(o)
    return fwd, (lambda: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True))


def fa4_rows(b: Bench, q, k, v, causal, flops, base, fa2_out):
    """FA4's fwd and bwd rows (backend "fa4"), its output checked against FA2's as ours is; its first call per
    configuration compiles (JIT), which measure's untimed first call absorbs."""
    try:
        fwd, bwd = fa4_fns(q, k, v, causal)
    except Exception as e:  # FA4 refuses the shape
        for kind in ("fwd", "bwd"):
            b.row(kind=kind, backend="fa4", ms="NA", note=f"{type(e).__name__}: {str(e)[:80]}", **base)
        return
    b.measure("fwd", "fa4", fwd, flops, base, lambda out, ref=fa2_out: agreement(out, ref))
    b.measure("bwd", "fa4", bwd, 2.5 * flops, base)
    del fwd, bwd
    empty_cache()


def stream_of(t) -> int:
    return torch.cuda.current_stream().cuda_stream if t.is_cuda else 0


def ops_fwd(fa, q, k, v, causal, backend):
    """flashattn.ops.forward on one backend into out/lse buffers allocated once (AttributeError when the
    package has no ops.forward)."""
    ops = fa.ops
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], device=q.device, dtype=torch.float32)  # (B, H, S)
    return lambda: ops.forward(q, k, v, out=out, lse=lse, causal=causal, backend=backend,
                               stream=stream_of(q))[0]


def backend_note(fa, q, backend="auto") -> str:
    """'backend=cuda-sm90': what a call with q runs ('' when the package cannot say)."""
    try:
        return f"backend={fa.ops.backend_name(q, backend)}"
    except Exception:
        return ""


def join(*notes) -> str:
    return " ".join(n for n in notes if n)


def peer_fns(be, q, k, v, causal):
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))

    def fwd():
        with sdpa_kernel(be):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

    qg, kg, vg = (t.detach().requires_grad_() for t in (qt, kt, vt))
    with sdpa_kernel(be):
        o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
    do = torch.randn_like(o)
    return fwd, (lambda: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True))


def agreement(out, fa2_out) -> str:
    """How far our output is from FA2's on the timed inputs: a fast wrong kernel cannot hide in the table."""
    if fa2_out is None:
        return ""
    note = f"maxdiff_vs_fa2={float((out.float() - fa2_out).abs().max()):.2e}"
    return note + ("" if bool(torch.isfinite(out).all()) else " NONFINITE")


TRAINING_DTYPES = ("bf16", "fp16")  # --dtypes


def shapes(quick: bool):
    dtypes = ("bf16",) if quick else TRAINING_DTYPES
    hdims = (64, 128) if quick else (64, 128, 256)
    seqlens = (1024, 8192) if quick else (512, 1024, 2048, 4096, 8192, 16384)
    for dt in dtypes:
        for hdim in hdims:
            for causal in (False, True):
                for s in seqlens:
                    yield dt, hdim, causal, s


def attention_rows(b: Bench, ours, quick: bool, deadline: float) -> bool:
    """Times every shape; returns False when it stopped at the deadline (the rest are reported as skipped)."""
    # One shape costs about 6 timings of (warm-up + repeats) plus setup, 8 with FA4 (bf16); stop when the next might
    # not fit.
    per_shape_s = (8 if fa4_func is not None else 6) * (b.warmup + b.rep) / 1000 * 2
    for dt, hdim, causal, seqlen in shapes(quick):
        if time.time() + per_shape_s > deadline:
            print(f"# out of time: stopped before {dt} d{hdim} causal={int(causal)} seqlen={seqlen}", flush=True)
            b.row(kind="fwd", backend="ours", dtype=dt, hdim=hdim, causal=int(causal), seqlen=seqlen, ms="NA",
                  note="not measured: the run's time budget ran out")
            return False
        dtype = common.DTYPES[dt]
        heads, batch = MODEL_DIM // hdim, TOKENS // seqlen
        q = torch.randn(batch, seqlen, heads, hdim, device=DEV, dtype=dtype)
        k, v = torch.randn_like(q), torch.randn_like(q)
        flops = common.attn_flops(batch, heads, seqlen, seqlen, hdim, causal, "fwd")
        base = dict(dtype=dt, hdim=hdim, causal=int(causal), seqlen=seqlen, batch=batch, heads=heads)
        fa2_out = None
        for name, be in PEERS.items():
            try:
                fwd, bwd = peer_fns(be, q, k, v, causal)
            except Exception as e:  # the backend refuses the shape
                for kind in ("fwd", "bwd"):
                    b.row(kind=kind, backend=name, ms="NA", note=f"{type(e).__name__}: {str(e)[:80]}", **base)
                continue
            out = b.measure("fwd", name, fwd, flops, base)
            if name == "flash2" and out is not None:
                fa2_out = out.transpose(1, 2).float()
            b.measure("bwd", name, bwd, 2.5 * flops, base)
            empty_cache()
        if not ours.ok:
            for name in ("ours", "ours_sm80"):
                b.row(kind="fwd", backend=name, ms="NA", note="not available", **base)
        else:
            ours_rows(b, ours.module, q, k, v, causal, flops, base, fa2_out)
        # FA4 last in each shape and bf16 only (the targets' dtype): a fault of its kernel would poison the CUDA
        # context, and this way it cannot cost the rows of ours of its shape (those after it still).
        if fa4_func is not None and dt == "bf16":
            fa4_rows(b, q, k, v, causal, flops, base, fa2_out)
        del q, k, v, fa2_out
        empty_cache()
    return True


def ours_rows(b: Bench, fa, q, k, v, causal, flops, base, fa2_out):
    """fwd and bwd of ours (AUTO), then the cuda-sm80 forward; a failure stays in its own row."""
    try:
        fwd, bwd, why = ours_fns(fa, q, k, v, causal)
    except Exception as e:
        for kind in ("fwd", "bwd"):
            b.row(kind=kind, backend="ours", ms="NA", note=f"{type(e).__name__}: {str(e)[:80]}", **base)
    else:
        auto = backend_note(fa, q)
        b.measure("fwd", "ours", fwd, flops, base, lambda out, ref=fa2_out: join(agreement(out, ref), auto))
        if bwd is not None:
            b.measure("bwd", "ours", bwd, 2.5 * flops, base)
        else:
            b.row(kind="bwd", backend="ours", ms="NA", note=why, **base)
        del fwd, bwd
    try:
        sm80 = ops_fwd(fa, q, k, v, causal, "cuda-sm80")
    except Exception as e:  # no flashattn.ops in this package
        b.row(kind="fwd", backend="ours_sm80", ms="NA", note=f"{type(e).__name__}: {str(e)[:80]}", **base)
        return
    b.measure("fwd", "ours_sm80", sm80, flops, base, lambda out, ref=fa2_out: agreement(out, ref))


def empty_cache():
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def ablation_hdim(variant: str) -> int:
    """A variant's head dim: the _d64 / _d256 suffix of its name (src/cuda/CMakeLists.txt builds "name:options:hdim"
    variants at that head dim), else ABLATION_HDIM."""
    for d in (64, 256):
        if variant.endswith(f"_d{d}"):
            return d
    return ABLATION_HDIM


def ablation_rows(b: Bench, ours, deadline: float, variants=ABLATION_VARIANTS[1:]):
    """The sm90 bf16 forward once per FLASHATTN_SM90_MECHANISMS variant, the default kernel and cuDNN beside it, at
    each variant's head dim."""
    per_timing_s = (b.warmup + b.rep) / 1000 * 2
    saved = os.environ.get(MECHANISMS_ENV)
    shapes = [(d, c, s) for d in sorted({ablation_hdim(v) for v in variants}) for c in (False, True)
              for s in ABLATION_SEQLENS]
    try:
        for hdim, causal, seqlen in shapes:
            heads, batch = MODEL_DIM // hdim, TOKENS // seqlen
            base = dict(dtype="bf16", hdim=hdim, causal=int(causal), seqlen=seqlen, batch=batch, heads=heads)
            if time.time() + per_timing_s > deadline:
                print(f"# out of time: ablations stopped before d{hdim} causal={int(causal)} seqlen={seqlen}",
                      flush=True)
                b.row(kind="ablation", backend="default", ms="NA", note="not measured: the run's time budget ran out",
                      **base)
                return
            q = torch.randn(batch, seqlen, heads, hdim, device=DEV, dtype=torch.bfloat16)
            k, v = torch.randn_like(q), torch.randn_like(q)
            flops = common.attn_flops(batch, heads, seqlen, seqlen, hdim, causal, "fwd")
            ref = None
            try:
                cudnn = peer_fns(PEERS["cudnn"], q, k, v, causal)[0]
                out = b.measure("ablation", "cudnn", cudnn, flops, base)
                ref = out.transpose(1, 2).float() if out is not None else None
            except Exception as e:
                b.row(kind="ablation", backend="cudnn", ms="NA", note=f"{type(e).__name__}: {str(e)[:80]}", **base)
            for variant in ["default"] + [v for v in variants if ablation_hdim(v) == hdim]:
                if time.time() + per_timing_s > deadline:
                    b.row(kind="ablation", backend=variant, ms="NA", note="not measured: the run's time budget ran out",
                          **base)
                    continue
                os.environ[MECHANISMS_ENV] = "" if variant == "default" else variant
                if not ours.ok:
                    b.row(kind="ablation", backend=variant, ms="NA", note="not available", **base)
                    continue
                try:
                    fwd = ops_fwd(ours.module, q, k, v, causal, "cuda-sm90")
                except Exception as e:
                    b.row(kind="ablation", backend=variant, ms="NA", note=f"{type(e).__name__}: {str(e)[:80]}", **base)
                    continue
                b.measure("ablation", variant, fwd, flops, base,
                          lambda out, ref=ref: agreement(out, ref).replace("_vs_fa2", "_vs_cudnn"))
            del q, k, v, ref
            empty_cache()
    finally:
        if saved is None:
            os.environ.pop(MECHANISMS_ENV, None)
        else:
            os.environ[MECHANISMS_ENV] = saved


def ablation_reserve_s(b: Bench, variants=ABLATION_VARIANTS[1:]) -> float:
    """Seconds the ablation rows take: (cuDNN + the default + the variants) timings per shape and head dim, plus
    setup."""
    timings = sum(2 + sum(ablation_hdim(v) == d for v in variants) for d in {ablation_hdim(v) for v in variants})
    return len(ABLATION_SEQLENS) * 2 * timings * (b.warmup + b.rep) / 1000 * 1.5 + 10


def memory_rows(b: Bench, ours):
    """Peak memory above the inputs for one long shape (16 heads x 16k, d128, causal), fwd and fwd+bwd."""
    shape = (1, 16384, 16, 128)
    backends = {"math": SDPBackend.MATH, **PEERS}
    names = list(backends) + (["ours"] if ours.ok else [])

    def attend(name, q, k, v):
        if name == "ours":
            return ours.module.flash_attn_func(q, k, v, causal=True)
        with sdpa_kernel(backends[name]):
            qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)

    for name in names:
        for direction in ("fwd", "fwd+bwd"):
            q = torch.randn(shape, device=DEV, dtype=torch.bfloat16, requires_grad=direction != "fwd")
            k = torch.randn(shape, device=DEV, dtype=torch.bfloat16, requires_grad=direction != "fwd")
            v = torch.randn(shape, device=DEV, dtype=torch.bfloat16, requires_grad=direction != "fwd")
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            note = ""
            try:
                o = attend(name, q, k, v)
                if direction != "fwd":
                    o.sum().backward()
                torch.cuda.synchronize()
                mib = f"{(torch.cuda.max_memory_allocated() - base) / 2 ** 20:.0f}"
            except Exception as e:
                mib, note = "NA", f"{type(e).__name__}: {str(e)[:60]}"
            b.row(kind="memory", backend=name, dtype="bf16", hdim=128, causal=1, seqlen=shape[1], batch=1,
                  heads=shape[2], tflops=mib, note=f"peak_extra_MiB {direction}" + (f": {note}" if note else ""))
            del q, k, v
            o = None
            torch.cuda.empty_cache()


DECODE_SHAPES = ((1, 65536), (8, 16384), (32, 8192), (128, 4096), (64, 32768))  # (batch, cached keys)
DECODE_PAGES = (1, 16, 256)  # SGLang's page, vLLM's, FlashAttention-2's minimum


def decode_rows(b: Bench, ours, quick: bool):
    """One query token against a full KV cache, GQA 32/8, d128, bf16 (the decode protocol of
    ../shared/anchors/sdpa_bench.py, TB/s of K+V read): cuDNN (SDPA, (B, H, S, D) cache) and ours through
    flash_attn_with_kvcache with a contiguous cache ('decode'; 'ours_nosplit' with num_splits=1) and paged caches
    of 1, 16 and 256 keys per page ('decode_paged16', ...; pages in a random order). Ours is checked against cuDNN's
    output."""
    hq, hkv, d = 32, 8, 128
    for batch, seqk in DECODE_SHAPES[:2] if quick else DECODE_SHAPES:
        base = dict(dtype="bf16", hdim=d, causal=0, seqlen=seqk, batch=batch, heads=f"{hq}/{hkv}")
        nbytes = 2 * batch * seqk * hkv * d * 2
        q = torch.randn(batch, 1, hq, d, device=DEV, dtype=torch.bfloat16)
        kc = torch.randn(batch, seqk, hkv, d, device=DEV, dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
        qt, kt, vt = q.transpose(1, 2), kc.transpose(1, 2).contiguous(), vc.transpose(1, 2).contiguous()

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
        ref = b.measure("decode", "cudnn", cudnn, nbytes, base, digits=2)
        kt = vt = None  # noqa: F841 (frees the head-major copies before ours runs)
        if ours.ok and hasattr(ours.module, "flash_attn_with_kvcache"):
            kv = ours.module.flash_attn_with_kvcache
            lens = torch.full((batch,), seqk, dtype=torch.int32, device=DEV)

            def note_of(out):
                return "" if ref is None else f"maxdiff_vs_cudnn={(out.transpose(1, 2) - ref).abs().max().item():.2e}"
            b.measure("decode", "ours", lambda: kv(q, kc, vc, cache_seqlens=lens), nbytes, base, note_of, 2)
            b.measure("decode", "ours_nosplit", lambda: kv(q, kc, vc, cache_seqlens=lens, num_splits=1), nbytes,
                      base, note_of, 2)
            for page in DECODE_PAGES:
                pages = seqk // page
                perm = torch.randperm(batch * pages, device=DEV)
                table = perm.view(batch, pages).to(torch.int32)
                kp = torch.empty(batch * pages, page, hkv, d, device=DEV, dtype=torch.bfloat16)
                vp = torch.empty_like(kp)
                kp[perm] = kc.view(batch * pages, page, hkv, d)
                vp[perm] = vc.view(batch * pages, page, hkv, d)
                b.measure(f"decode_paged{page}", "ours", lambda: kv(q, kp, vp, cache_seqlens=lens, block_table=table),
                          nbytes, base, note_of, 2)
        q = kc = vc = kp = vp = None  # noqa: F841
        empty_cache()


def feature_rows(b: Bench, ours, feature: str):
    """The cost of one feature: ours with and without it, bf16 d128, 8k tokens x 1 sequence x 16 heads, causal and
    not, forward and backward, side by side (kinds '<prefix>_fwd' / '<prefix>_bwd' with report.feature_kind's
    prefix, backends 'ours' and 'ours_<feature>'). 'sink': learnable sinks (issue bar: <= 3%); 'dropout':
    dropout_p = 0.1 (<= 15%; on the H200 the sm90 dropout kernels against the plain ones)."""
    if not ours.ok:
        return
    fa = ours.module
    if feature == "sink" and "learnable_sink" not in inspect.signature(fa.flash_attn_func).parameters:
        return
    s, h, d = 8192, 16, 128
    kind = report.feature_kind(feature)
    for causal in (0, 1):
        base = dict(dtype="bf16", hdim=d, causal=causal, seqlen=s, batch=1, heads=h)
        q, k, v = (torch.randn(1, s, h, d, device=DEV, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        sink = torch.randn(h, device=DEV, requires_grad=True)
        with_it = {"learnable_sink": sink} if feature == "sink" else {"dropout_p": 0.1}
        grads_of = (q, k, v, sink) if feature == "sink" else (q, k, v)
        flops = 4 * s * s * h * d / (2 if causal else 1)
        calls = {}  # backend -> (forward, backward)
        for name, extra in (("ours", {}), (f"ours_{feature}", with_it)):
            def fwd(extra=extra):
                return fa.flash_attn_func(q, k, v, causal=bool(causal), **extra)
            try:
                o = fwd()
            except (NotImplementedError, ValueError) as e:  # a build without the feature on this GPU
                print(f"# {feature}: {e}", flush=True)
                return
            do = torch.randn_like(o)
            inputs = grads_of if extra else (q, k, v)
            calls[name] = (fwd, lambda o=o, inputs=inputs, do=do: torch.autograd.grad(o, inputs, do, retain_graph=True))
        # Timed in the order A B B A, each backend's time the mean of its two: the first timing of a pair read slow
        # (session 28: 2.7-8 %; session 29's sinks forward read 7 % faster than the plain one timed before it).
        order = list(calls) + list(calls)[::-1]
        for direction, which, work in (("fwd", 0, flops), ("bwd", 1, 2.5 * flops)):
            times = {name: [] for name in calls}
            try:
                for name in order:
                    times[name].append(b.time(calls[name][which]))
            except Exception as e:  # noqa: BLE001 (a failure is a row, not the end of the run)
                for name in calls:
                    b.row(kind=f"{kind}_{direction}", backend=name, ms="NA", note=f"{type(e).__name__}: {str(e)[:80]}",
                          **base)
                continue
            for name, (first, second) in times.items():
                ms = (first + second) / 2
                b.row(kind=f"{kind}_{direction}", backend=name, ms=f"{ms:.4f}", tflops=f"{work / ms / 1e9:.1f}",
                      note=f"mean of A B B A timings {first:.4f} / {second:.4f} ms", **base)
        q = k = v = o = do = calls = None  # noqa: F841
        empty_cache()


def fp8_rows(b: Bench, ours):
    """The FP8 forward (issue bar: non-causal 16k >= FA3's 641 / 894 / 1149 TFLOP/s at d64 / 128 / 256, and >= 1.6x
    our bf16 at d128): rows kind 'fp8_fwd', backends 'ours_fp8' (float8_e4m3fn q/k/v with per-(batch, head)
    factors, out bf16), 'ours' and 'cudnn' (bf16 inputs of the same values), at seqlen 2k and 16k, causal and not;
    then kind 'fp8_rmse' (tflops column: RMSE against float64 attention of the unquantised inputs) on the FA3
    paper's outlier recipe (N(0, 1) + N(0, 100) * Bernoulli(0.001), d128, 2k): bf16, FP8 per-(batch, head) factors,
    FP8 with the Hadamard rotation."""
    if not ours.ok or not hasattr(ours.module, "quantize_fp8"):
        return
    fa = ours.module
    for hdim in (64, 128, 256):
        for causal in (0, 1):
            for seqlen in (2048, 16384):
                heads, batch = MODEL_DIM // hdim, TOKENS // seqlen
                base = dict(dtype="fp8", hdim=hdim, causal=causal, seqlen=seqlen, batch=batch, heads=heads)
                q, k, v = (torch.randn(batch, seqlen, heads, hdim, device=DEV, dtype=torch.bfloat16) for _ in range(3))
                try:
                    (q8, qd), (k8, kd), (v8, vd) = (fa.quantize_fp8(t) for t in (q, k, v))
                except Exception as e:  # noqa: BLE001 (any failure is a row, not the end of the run)
                    b.row(kind="fp8_fwd", backend="ours_fp8", ms="NA", note=f"{type(e).__name__}: {str(e)[:80]}",
                          **base)
                    return
                flops = common.attn_flops(batch, heads, seqlen, seqlen, hdim, bool(causal), "fwd")
                ref = fa.flash_attn_func(q, k, v, causal=bool(causal)).float()

                def diff(out, ref=ref):
                    return f"maxdiff_vs_ours_bf16={float((out.float() - ref).abs().max()):.2e}"

                b.measure("fp8_fwd", "ours_fp8", lambda: fa.flash_attn_func(q8, k8, v8, causal=bool(causal),
                                                                            q_descale=qd, k_descale=kd, v_descale=vd),
                          flops, base, diff)
                b.measure("fp8_fwd", "ours", lambda: fa.flash_attn_func(q, k, v, causal=bool(causal)), flops, base)
                qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
                with sdpa_kernel(PEERS["cudnn"]):
                    b.measure("fp8_fwd", "cudnn",
                              lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal)), flops, base)
                q = k = v = q8 = k8 = v8 = ref = qt = kt = vt = None  # noqa: F841
                empty_cache()
    base = dict(dtype="fp8", hdim=128, causal=0, seqlen=2048, batch=1, heads=1)
    for name, rmse in fp8_outlier_rmse(fa).items():
        b.row(kind="fp8_rmse", backend=name, ms="", tflops=f"{rmse:.3e}", note="RMSE vs float64, outlier inputs",
              **base)


FP8_RMSE_VARIANTS = {"bf16": None, "fp8_per_head": False, "fp8_hadamard": True}


def fp8_outlier_rmse(fa, variants=tuple(FP8_RMSE_VARIANTS)):
    """RMSE against float64 attention on the FA3 paper's outlier recipe (N(0, 1) + N(0, 100) * Bernoulli(0.001), d128,
    2k, one head), per variant: bf16 inputs, FP8 with per-(batch, head) factors, FP8 with the Hadamard rotation.
    fa: the flashattn module (fp8_rows; bench/gpu/dev/fp8_commit_ab.sh compares two builds with it)."""
    gen = torch.Generator(device="cpu").manual_seed(0)

    def outliers():
        x = torch.randn(1, 2048, 1, 128, generator=gen, dtype=torch.float64)
        spikes = torch.randn(x.shape, generator=gen, dtype=torch.float64) * 10
        return x + spikes * (torch.rand(x.shape, generator=gen) < 1e-3)

    q, k, v = outliers(), outliers(), outliers()
    exact = torch.softmax(torch.einsum("bihd,bjhd->bhij", q, k) / 128 ** 0.5, -1)
    exact = torch.einsum("bhij,bjhd->bihd", exact, v)
    qc, kc, vc = (t.to(DEV) for t in (q, k, v))
    rmse = {}
    for name in variants:
        hadamard = FP8_RMSE_VARIANTS[name]
        if hadamard is None:
            out = fa.flash_attn_func(qc.bfloat16(), kc.bfloat16(), vc.bfloat16())
        else:
            (q8, qd), (k8, kd) = (fa.quantize_fp8(t.float(), hadamard=hadamard, seed=1) for t in (qc, kc))
            v8, vd = fa.quantize_fp8(vc.float())
            out = fa.flash_attn_func(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd)
        rmse[name] = float(((out.double().cpu() - exact) ** 2).mean().sqrt())
    return rmse


def main():
    global TRAINING_DTYPES
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--csv", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--ablations", action="store_true",
                    help=f"also time the sm90 forward per {MECHANISMS_ENV} variant (an ablation build only)")
    ap.add_argument("--ablation-variants", default=",".join(ABLATION_VARIANTS[1:]),
                    help="with --ablations: the variants, comma-separated (those the build has; a _d64 / _d256 name "
                         "is timed at that head dim beside the default kernel there)")
    ap.add_argument("--deadline", type=float, default=float("inf"), help="epoch seconds: stop adding shapes")
    ap.add_argument("--decode-only", action="store_true",
                    help="only the decode rows (after the ceilings), and the feature-cost rows --features names")
    ap.add_argument("--features", default="sink,dropout",
                    help="feature rows, comma-separated: sink, dropout (feature_rows), fp8 (fp8_rows); '' for none")
    ap.add_argument("--dtypes", default=",".join(TRAINING_DTYPES),
                    help="the training table's dtypes, comma-separated (bf16, fp16); --quick times bf16 alone")
    ap.add_argument("--training-only", action="store_true",
                    help="the training table alone (and the ceilings and memory rows): no decode or feature rows")
    a = ap.parse_args()
    if a.training_only and a.decode_only:
        ap.error("--training-only and --decode-only exclude each other")
    TRAINING_DTYPES = tuple(d for d in a.dtypes.split(",") if d)
    unknown = set(TRAINING_DTYPES) - set(common.DTYPES)
    if unknown or not TRAINING_DTYPES:
        ap.error(f"--dtypes: {a.dtypes!r} must list some of {', '.join(common.DTYPES)}")
    info = common.env_info()
    print("# " + "  ".join(f"{k} {v}" for k, v in info.items()), flush=True)
    ours = common.load_ours(DEV)
    print("# " + common.describe_ours(ours), flush=True)
    if os.environ.get(MECHANISMS_ENV):
        print(f"# {MECHANISMS_ENV}={os.environ[MECHANISMS_ENV]} is set: the main table's sm90 forward is that variant",
              flush=True)
    # --quick halves the repeats (its numbers are for smoke, not the record).
    b = Bench(a.csv, warmup_ms=25 if a.quick else 50, rep_ms=100 if a.quick else 200)
    t0 = time.time()
    ceilings(b)
    features = [] if a.training_only else [f for f in a.features.split(",") if f]
    if not a.training_only:
        decode_rows(b, ours, a.quick)
    for feature in features:
        if feature == "fp8":
            fp8_rows(b, ours)
        else:
            feature_rows(b, ours, feature)
    if a.decode_only:
        return
    # The main table leaves the ablations their time, so that an ablation run always gets its table.
    variants = [v for v in a.ablation_variants.split(",") if v and v != "default"]
    main_deadline = a.deadline - (ablation_reserve_s(b, variants) if a.ablations else 0)
    if attention_rows(b, ours, a.quick, main_deadline):
        memory_rows(b, ours)
    if a.ablations:
        ablation_rows(b, ours, a.deadline, variants)
    print(f"# bench done in {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
