"""Ours against torch SDPA's cuDNN and FLASH (FlashAttention-2) backends, side by side in one process.

Protocol of ../shared/anchors/sdpa_bench.py: triton do_bench median (warm-up 50 ms, 200 ms of repeats),
batch*seqlen = 16k tokens, model dim 2048 (heads = 2048 / head dim), (B, S, H, D) storage (SDPA gets the
(B, H, S, D) view), head dims 64/128/256, causal and not, seqlen 512..16k, forward and backward (backward as
torch.autograd.grad of the forward's output), FLOPs 4*B*H*S*S*D (/2 causal), bwd 2.5x. Both bf16 and fp16.
Plus: the bf16 matmul and copy ceilings, and the peak extra memory of one long shape.

  python3 bench.py --csv results.csv [--quick]
Rows: kind,backend,dtype,hdim,causal,seqlen,batch,heads,ms,tflops,note  (ceilings: tflops is TFLOP/s or TB/s;
memory: ms is empty, tflops holds MiB). Every timed shape of ours is also checked against FA2's output
(note 'maxdiff=...') so that a fast wrong kernel cannot hide in the table.
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False
DEV = "cuda"
TOKENS = 16384
MODEL_DIM = 2048
PEERS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash2": SDPBackend.FLASH_ATTENTION}
FIELDS = ["kind", "backend", "dtype", "hdim", "causal", "seqlen", "batch", "heads", "ms", "tflops", "note"]


class Bench:
    def __init__(self, path: str, warmup_ms: int, rep_ms: int):
        self.f = open(path, "w", newline="")
        self.w = csv.DictWriter(self.f, FIELDS)
        self.w.writeheader()
        self.warmup, self.rep = warmup_ms, rep_ms

    def time(self, fn) -> float:
        return do_bench(fn, warmup=self.warmup, rep=self.rep, return_mode="median")

    def measure(self, kind: str, backend: str, fn, flops: float, base: dict, note_of=None):
        """Times fn and writes its row; returns one call's result (None, with an NA row, if fn raises).
        note_of(result) adds a note (e.g. the agreement with FA2's output)."""
        try:
            result = fn()
            note = note_of(result) if note_of else ""
            ms = self.time(fn)
        except Exception as e:
            self.row(kind=kind, backend=backend, ms="NA", note=f"{type(e).__name__}: {str(e)[:80]}", **base)
            return None
        self.row(kind=kind, backend=backend, ms=f"{ms:.4f}", tflops=f"{flops / ms / 1e9:.1f}", note=note, **base)
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


def shapes(quick: bool):
    dtypes = ("bf16",) if quick else ("bf16", "fp16")
    hdims = (64, 128) if quick else (64, 128, 256)
    seqlens = (1024, 8192) if quick else (512, 1024, 2048, 4096, 8192, 16384)
    for dt in dtypes:
        for hdim in hdims:
            for causal in (False, True):
                for s in seqlens:
                    yield dt, hdim, causal, s


def attention_rows(b: Bench, ours, quick: bool, deadline: float) -> bool:
    """Times every shape; returns False when it stopped at the deadline (the rest are reported as skipped)."""
    # One shape costs about 5 timings of (warm-up + repeats) plus setup; stop when the next might not fit.
    per_shape_s = 5 * (b.warmup + b.rep) / 1000 * 2
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
            torch.cuda.empty_cache()
        if not ours.ok:
            b.row(kind="fwd", backend="ours", ms="NA", note="not available", **base)
            continue
        try:
            fwd, bwd, why = ours_fns(ours.module, q, k, v, causal)
        except Exception as e:
            for kind in ("fwd", "bwd"):
                b.row(kind=kind, backend="ours", ms="NA", note=f"{type(e).__name__}: {str(e)[:80]}", **base)
            continue
        b.measure("fwd", "ours", fwd, flops, base, lambda out, ref=fa2_out: agreement(out, ref))
        if bwd is not None:
            b.measure("bwd", "ours", bwd, 2.5 * flops, base)
        else:
            b.row(kind="bwd", backend="ours", ms="NA", note=why, **base)
        del q, k, v, fa2_out
        torch.cuda.empty_cache()
    return True


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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--csv", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--deadline", type=float, default=float("inf"), help="epoch seconds: stop adding shapes")
    a = ap.parse_args()
    info = common.env_info()
    print("# " + "  ".join(f"{k} {v}" for k, v in info.items()), flush=True)
    ours = common.load_ours(DEV)
    print("# " + common.describe_ours(ours), flush=True)
    # --quick halves the repeats (its numbers are for smoke, not the record).
    b = Bench(a.csv, warmup_ms=25 if a.quick else 50, rep_ms=100 if a.quick else 200)
    t0 = time.time()
    ceilings(b)
    if attention_rows(b, ours, a.quick, a.deadline):
        memory_rows(b, ours)
    print(f"# bench done in {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
