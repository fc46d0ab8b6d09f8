"""GPU correctness suite for the `flashattn` Python package, against torch float64 math on the GPU.

Pass rule (the FlashAttention convention, the one of every suite: docs/testing.md, common.tolerance): for every
output (out, lse, dq, dk, dv) the max error of ours against the float64 reference is at most 2x the max error of
a plain low-precision implementation (the same math in the inputs' dtype, see common.attention) plus one unit of
the output dtype's rounding at the reference's largest magnitude. NaN or inf where the reference is finite
always fails. Inputs are fresh random normals (never zeros); our outputs are poisoned
with NaN, so an element the kernel never writes reads as NaN and fails: flash_attn_func is called right
after NaN-filled blocks of its outputs' sizes are handed back to torch's caching allocator (which reuses
them), and the same case runs again through flashattn.ops into NaN-filled buffers we own.

The harness proves itself on every run: torch SDPA's FLASH backend is put through the same rule on the
shapes it supports (must pass), and mutated copies of a correct answer (one NaN, one wrong row) must fail.

  python3 check.py [--quick] [--tiny] [--json FILE] [--cases REGEX] [--seed N] [--list]
    --tiny: two small cases of ours only (the compute-sanitizer subset).
    --list: print the labels of the cases the other options select (one a line) and exit.
    FLASHATTN_CHECK_DEVICE=cpu: the same cases on the CPU backend (no GPU needed).
Exit status: 0 when nothing failed (skips and unsupported cases do not fail), 1 otherwise.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import sys
import time
import traceback
import warnings

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402
from common import Mask  # noqa: E402

# The GPU is what this suite is for; FLASHATTN_CHECK_DEVICE=cpu runs the same cases on the CPU backend
# (to try the harness on a machine without a GPU).
DEV = os.environ.get("FLASHATTN_CHECK_DEVICE", "cuda")
ON_GPU = torch.device(DEV).type == "cuda"


@dataclasses.dataclass
class Case:
    """One case, in the suites' one vocabulary (the C++ Case of tests/case.hpp; docs/testing.md maps the fields)."""

    name: str
    batch: int
    sq: int
    sk: int
    hq: int
    hkv: int
    d: int
    dv: int = 0  # 0: = d
    dtype: str = "bf16"
    mask: Mask = Mask()
    varlen: tuple = ()  # ((sq, sk), ...): packed sequences instead of (batch, sq, sk)
    bwd: bool = True
    quick: bool = False  # part of the --quick subset

    def __post_init__(self):
        if not self.dv:
            self.dv = self.d

    def label(self) -> str:
        shape = ("varlen" + ":".join(f"{a}x{b}" for a, b in self.varlen)) if self.varlen else \
            f"b{self.batch} {self.sq}x{self.sk}"
        dv = f"/dv{self.dv}" if self.dv != self.d else ""
        return f"{self.name:<10} {self.dtype} d{self.d}{dv} {shape} h{self.hq}/{self.hkv} {self.mask.label()}"


def build_cases() -> list:
    C = []
    # Head dims, with and without causal, on q != k lengths.
    for d in (64, 96, 128, 192, 256):
        for causal in (False, True):
            C.append(Case("hdim", 2, 113, 203, 4, 4, d, mask=Mask(causal=causal), quick=d in (64, 128)))
    # The odd shapes of the CPU suite (bf16 here, fp16 below).
    for sq, sk in ((1, 1), (17, 17), (239, 1), (113, 203), (1023, 1024), (1024, 1023)):
        for causal in (False, True):
            C.append(Case("odd", 1, sq, sk, 2, 2, 128, mask=Mask(causal=causal),
                          quick=(sq, sk) in ((1, 1), (239, 1), (1023, 1024))))
    for sq, sk in ((17, 17), (113, 203), (1023, 1024)):
        C.append(Case("fp16", 1, sq, sk, 2, 2, 64, dtype="fp16", mask=Mask(causal=True), quick=sq == 113))
        C.append(Case("fp16", 1, sq, sk, 2, 2, 128, dtype="fp16"))
    # Causal alignments: bottom-right with more queries than keys leaves fully masked rows (out 0, lse -inf).
    for sq, sk in ((239, 113), (113, 239), (128, 128)):
        for top_left in (False, True):
            C.append(Case("align", 1, sq, sk, 2, 2, 128, mask=Mask(causal=True, top_left=top_left),
                          quick=(sq, sk) == (239, 113)))
    # GQA group 8 (16:2), 3 (6:2) and MQA (8:1).
    for hq, hkv in ((16, 2), (6, 2), (8, 1)):
        for causal in (False, True):
            C.append(Case("gqa", 2, 239, 177, hq, hkv, 128, mask=Mask(causal=causal), quick=hq == 6))
        C.append(Case("gqa", 2, 239, 177, hq, hkv, 64))
    # Local windows (sliding, with and without a right reach), including causal + window.
    for window in ((32, 0), (64, 16), (-1, 8), (16, -1)):
        C.append(Case("window", 1, 257, 301, 4, 2, 128, mask=Mask(window=window), quick=window == (64, 16)))
    C.append(Case("window", 1, 257, 301, 4, 2, 64, mask=Mask(causal=True, window=(48, -1))))
    # Softcap near the logits' scale, so that tanh is far from linear.
    for d in (64, 128):
        C.append(Case("softcap", 2, 200, 333, 4, 4, d, mask=Mask(softcap=1.5), quick=d == 128))
        C.append(Case("softcap", 2, 200, 333, 4, 4, d, mask=Mask(causal=True, softcap=1.5)))
    # ALiBi, per head and per batch x head.
    C.append(Case("alibi", 2, 177, 245, 8, 2, 128, mask=Mask(alibi="heads"), quick=True))
    C.append(Case("alibi", 2, 177, 245, 8, 2, 64, mask=Mask(causal=True, alibi="batch")))
    # dv != d (value head dim of its own), where supported.
    C.append(Case("dv", 2, 113, 203, 4, 4, 128, dv=64))
    C.append(Case("dv", 2, 113, 203, 4, 4, 192, dv=128, mask=Mask(causal=True), quick=True))
    # Varlen: lengths 1..845, q != k, with every mask family once.
    lens = ((1, 1), (17, 40), (239, 100), (113, 203), (177, 845))
    C.append(Case("varlen", 0, 0, 0, 4, 4, 128, varlen=lens, quick=True))
    C.append(Case("varlen", 0, 0, 0, 4, 4, 128, varlen=lens, mask=Mask(causal=True), quick=True))
    C.append(Case("varlen", 0, 0, 0, 8, 2, 64, varlen=lens, mask=Mask(window=(32, 8))))
    C.append(Case("varlen", 0, 0, 0, 6, 2, 128, varlen=lens, mask=Mask(causal=True, softcap=1.5, alibi="heads")))
    # Large: where tiling, scheduling and long reductions show.
    C.append(Case("large", 1, 4096, 4096, 8, 8, 128, quick=True))
    C.append(Case("large", 1, 4096, 4096, 8, 8, 128, mask=Mask(causal=True)))
    C.append(Case("large", 1, 8192, 8192, 4, 4, 64, mask=Mask(causal=True)))
    C.append(Case("large", 1, 8192, 8192, 4, 1, 128))
    C.append(Case("large", 1, 4096, 8192, 4, 4, 256, mask=Mask(causal=True), bwd=False))
    C.append(Case("large", 2, 3000, 5000, 4, 2, 128, dtype="fp16", mask=Mask(window=(512, 0))))
    return C


TINY = [
    Case("tiny", 2, 113, 203, 4, 2, 128, mask=Mask(causal=True)),
    Case("tiny", 0, 0, 0, 4, 4, 64, varlen=((1, 1), (17, 40), (239, 100)), mask=Mask(window=(32, 8))),
]


# ----------------------------------------------------------------------------- inputs and references
def make_inputs(case: Case, gen: torch.Generator):
    dt = common.DTYPES[case.dtype]
    if case.varlen:
        tq = sum(a for a, _ in case.varlen)
        tk = sum(b for _, b in case.varlen)
        qs, ks = (tq, case.hq, case.d), (tk, case.hkv, case.d)
        vs, os_ = (tk, case.hkv, case.dv), (tq, case.hq, case.dv)
        nb = len(case.varlen)
    else:
        qs, ks = (case.batch, case.sq, case.hq, case.d), (case.batch, case.sk, case.hkv, case.d)
        vs, os_ = (case.batch, case.sk, case.hkv, case.dv), (case.batch, case.sq, case.hq, case.dv)
        nb = case.batch

    def rnd(shape):
        return torch.randn(shape, generator=gen, device=DEV, dtype=torch.float32).to(dt)

    q, k, v, dout = rnd(qs), rnd(ks), rnd(vs), rnd(os_)
    slopes = None
    if case.mask.alibi:
        # Geometric slopes as ALiBi defines them (2^(-8h/H)), jittered so every head differs per batch.
        base = torch.tensor([2.0 ** (-8.0 * (h + 1) / case.hq) for h in range(case.hq)], device=DEV)
        if case.mask.alibi == "batch":
            base = base[None, :] * (1 + torch.rand(nb, case.hq, generator=gen, device=DEV))
        slopes = base.float().contiguous()
    return q, k, v, dout, slopes


def cu_seqlens(lens):
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=DEV)


# --plain-on-cpu: the plain implementation runs on the CPU. compute-sanitizer racecheck ends in "Internal
# Sanitizer Error: failed to handle a hardware exception" in torch's own bf16 GPU kernels of that implementation
# (bench/gpu/dev/race_isolate.py part "plain": none of our kernels runs), which would hide whether ours are clean.
PLAIN_ON_CPU = False


def reference(case: Case, q, k, v, slopes, exact: bool, dout=None):
    """out, lse (and dq, dk, dv when dout is given) of the float64 reference or the plain implementation,
    in our layouts: out (B,Sq,Hq,Dv) / (Tq,Hq,Dv), lse (B,Hq,Sq) / (Hq,Tq)."""
    if not exact and PLAIN_ON_CPU and ON_GPU:
        cpu = [None if t is None else t.detach().cpu() for t in (q, k, v, slopes, dout)]
        return {n: t.to(DEV) for n, t in _reference(case, *cpu[:4], False, cpu[4]).items()}
    return _reference(case, q, k, v, slopes, exact, dout)


def _reference(case: Case, q, k, v, slopes, exact: bool, dout=None):
    scale = 1.0 / math.sqrt(case.d)
    leaves = [t.detach().requires_grad_(dout is not None) for t in (q, k, v)]
    lq, lk, lv = leaves
    if case.varlen:
        outs, lses, oq, ok = [], [], 0, 0
        for bi, (a, b) in enumerate(case.varlen):
            sl = slopes[bi] if (slopes is not None and slopes.dim() == 2) else slopes
            o, l = common.attention(lq[None, oq:oq + a], lk[None, ok:ok + b], lv[None, ok:ok + b], case.mask, scale,
                                    sl, exact)
            outs.append(o[0])
            lses.append(l[0])
            oq, ok = oq + a, ok + b
        out, lse = torch.cat(outs, 0), torch.cat(lses, 1)
    else:
        out, lse = common.attention(lq, lk, lv, case.mask, scale, slopes, exact)
    res = {"out": out.detach(), "lse": lse.detach()}
    if dout is not None:
        dq, dk, dv = torch.autograd.grad(out, leaves, dout.to(out.dtype))
        res.update(dq=dq, dk=dk, dv=dv)
    return res


# ----------------------------------------------------------------------------- calling ours
class Unsupported(Exception):
    pass


def poison_allocator(specs):
    """Fill blocks of the sizes our call is about to allocate with NaN and hand them back to torch's caching
    allocator, which serves the next allocation of each size from them."""
    bufs = [torch.full(shape, float("nan"), dtype=dt, device=DEV) for shape, dt in specs]
    del bufs


def alignment_kwargs(ours, case: Case, kw: dict):
    """flash_attn's API knows only bottom-right alignment. Top-left is passed through our keyword when the
    package has one, otherwise rewritten as a bottom-right window where that is exact (Sq >= Sk: shift
    both bounds by Sk - Sq; not with ALiBi, whose distances depend on the alignment)."""
    m = case.mask
    if not m.top_left:
        return
    if ours.alignment_kw:
        kw[ours.alignment_kw] = "top_left"
        return
    if case.varlen or m.alibi or case.sq < case.sk:
        raise Unsupported("top-left alignment is not exposed by the Python API (no *align* keyword)")
    left, right = m.bounds()
    shift = case.sq - case.sk
    kw["causal"] = False
    kw["window_size"] = (left + shift if left >= 0 else -1, right + shift if right >= 0 else -1)


def run_ours(ours, case: Case, q, k, v, slopes, dout):
    """Returns {out, lse?, dq?, dk?, dv?} and a note ('' or why a part was skipped)."""
    fa = ours.module
    kw = dict(softmax_scale=1.0 / math.sqrt(case.d), causal=case.mask.causal, window_size=case.mask.window,
              softcap=case.mask.softcap, alibi_slopes=slopes)
    alignment_kwargs(ours, case, kw)
    out_shape = (q.shape[0], q.shape[1], case.hq, case.dv) if not case.varlen else (q.shape[0], case.hq, case.dv)
    lse_shape = (case.batch, case.hq, case.sq) if not case.varlen else (case.hq, q.shape[0])
    want_grad = case.bwd and dout is not None
    qg, kg, vg = (t.detach().clone().requires_grad_(want_grad) for t in (q, k, v))
    poison_allocator([(out_shape, q.dtype), (lse_shape, torch.float32)])
    if ours.supports_out:
        kw["out"] = torch.full(out_shape, float("nan"), dtype=q.dtype, device=DEV)
    try:
        if case.varlen:
            lq = [a for a, _ in case.varlen]
            lk = [b for _, b in case.varlen]
            r = fa.flash_attn_varlen_func(qg, kg, vg, cu_seqlens(lq), cu_seqlens(lk), max(lq), max(lk),
                                          return_attn_probs=True, **kw)
        else:
            r = fa.flash_attn_func(qg, kg, vg, return_attn_probs=True, **kw)
    except Exception as e:
        if common.is_not_implemented(e):
            raise Unsupported(f"fwd: {type(e).__name__}: {str(e)[:160]}") from e
        raise
    out, lse = (r[0], r[1]) if isinstance(r, (tuple, list)) else (r, None)
    common.sync(DEV)
    res = {"out": out.detach().clone(), "lse": None if lse is None else lse.detach().clone()}
    note = "" if lse is not None else "lse not returned"
    if want_grad:
        poison_allocator([(q.shape, q.dtype), (k.shape, k.dtype), (v.shape, v.dtype)])
        try:
            dq, dk, dv = torch.autograd.grad(out, (qg, kg, vg), dout)
            common.sync(DEV)
            res.update(dq=dq, dk=dk, dv=dv)
        except Exception as e:
            if not common.is_not_implemented(e):
                raise
            note = (note + "; " if note else "") + f"bwd not implemented ({type(e).__name__}: {str(e)[:100]})"
    return res, note


def ops_kwargs(case: Case, slopes, cu_q, cu_k, stream: int) -> dict:
    """Keyword arguments of flashattn.ops.forward/backward for this case (array-library agnostic)."""
    kw = dict(softmax_scale=1.0 / math.sqrt(case.d), causal=case.mask.causal, window_size=case.mask.window,
              softcap=case.mask.softcap, alibi_slopes=slopes, stream=stream,
              causal_alignment="top_left" if case.mask.top_left else "bottom_right")
    if case.varlen:
        kw.update(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(a for a, _ in case.varlen),
                  max_seqlen_k=max(b for _, b in case.varlen))
    return kw


def run_ours_nan_buffers(ours, case: Case, q, k, v, slopes, dout) -> dict:
    """Forward (and backward, when implemented) through flashattn.ops into NaN-filled buffers we own: an
    element the kernel does not write stays NaN and fails the comparison, whatever torch's allocator does."""
    ops = ours.module.ops
    cu_q = cu_k = None
    if case.varlen:
        cu_q, cu_k = cu_seqlens([a for a, _ in case.varlen]), cu_seqlens([b for _, b in case.varlen])
    kw = ops_kwargs(case, slopes, cu_q, cu_k, torch.cuda.current_stream().cuda_stream if ON_GPU else 0)
    nan = float("nan")
    out = torch.full(q.shape[:-1] + (case.dv,), nan, dtype=q.dtype, device=DEV)
    lse_shape = (case.hq, q.shape[0]) if case.varlen else (case.batch, case.hq, case.sq)
    lse = torch.full(lse_shape, nan, dtype=torch.float32, device=DEV)
    ops.forward(q, k, v, out=out, lse=lse, **kw)
    common.sync(DEV)
    res = {"out": out, "lse": lse}
    if dout is not None:
        grads = [torch.full_like(t, nan) for t in (q, k, v)]
        try:
            ops.backward(dout, q, k, v, out, lse, dq=grads[0], dk=grads[1], dv=grads[2], **kw)
            common.sync(DEV)
            res.update(dq=grads[0], dk=grads[1], dv=grads[2])
        except NotImplementedError:
            pass  # reported once, by the flash_attn_func path
    return res


# ----------------------------------------------------------------------------- judging
def judge(got: dict, ref: dict, plain: dict) -> tuple:
    """(ok, detail): every output ours produced is within 2x the plain implementation's error + the floor of
    the dtype ours stored it in (common.tolerance)."""
    ok, parts = True, []
    for name in ("out", "lse", "dq", "dk", "dv"):
        if got.get(name) is None or name not in ref:
            continue
        g, r = got[name], ref[name]
        if tuple(g.shape) != tuple(r.shape):
            ok = False
            parts.append(f"{name} shape {tuple(g.shape)} != {tuple(r.shape)}")
            continue
        err, mean = common.max_mean_error(g, r)
        perr, _ = common.max_mean_error(plain[name], r)
        tol = common.tolerance(perr, r, g.dtype)
        good = err <= tol  # inf/NaN error never passes (NaN compares false)
        ok &= good
        parts.append(f"{name} {err:.2e}{'<=' if good else '>'}{tol:.2e} (mean {mean:.1e}, plain {perr:.1e})")
    return ok, "  ".join(parts)


class Tally:
    """Counts and prints verdicts; rewrites the JSON summary after each one, so that a crash or a hang of our
    kernel (killed by run.sh's timeout) still leaves the verdicts reached so far."""

    def __init__(self, log, json_path=None, meta=None):
        self.log = log
        self.json_path, self.meta = json_path, meta or {}
        self.counts = {"pass": 0, "fail": 0, "skip": 0}
        self.failures = []

    def summary(self) -> str:
        c = self.counts
        return f"check: {c['pass']} passed, {c['fail']} failed, {c['skip']} skipped"

    def save(self, done: bool):
        if self.json_path:
            with open(self.json_path, "w") as f:
                summary = self.summary() + ("" if done else " (INCOMPLETE: crashed or killed)")
                json.dump({**self.meta, "summary": summary, "counts": self.counts, "failures": self.failures}, f)

    def line(self, status: str, what: str, detail: str = ""):
        key = {"PASS": "pass", "FAIL": "fail"}.get(status, "skip")
        self.counts[key] += 1
        if key == "fail":
            self.failures.append(what)
        print(f"{status:<5} {what}  {detail}", file=self.log, flush=True)
        self.save(done=False)


def check_case(ours, case: Case, gen, tally: Tally, quick: bool):
    q, k, v, dout, slopes = make_inputs(case, gen)
    want_bwd = case.bwd and not (quick and case.name == "large")
    ref = reference(case, q, k, v, slopes, True, dout if want_bwd else None)
    plain = reference(case, q, k, v, slopes, False, dout if want_bwd else None)
    try:
        got, note = run_ours(ours, case, q, k, v, slopes, dout if want_bwd else None)
    except Unsupported as e:
        tally.line("SKIP", "fwd+bwd " + case.label(), f"unsupported: {e}")
        return
    # The same call again through the low-level entry into NaN-filled buffers (when the package has one):
    # one verdict per direction covers both paths.
    strict, strict_err = {}, ""
    if ours.ops_buffers:
        try:
            strict = run_ours_nan_buffers(ours, case, q, k, v, slopes, dout if want_bwd else None)
        except Exception as e:  # NotImplementedError too: the flash_attn_func path just ran this forward
            strict_err = f"ops path raised {type(e).__name__}: {str(e)[:160]}"
    for direction, names in (("fwd", ("out", "lse")), ("bwd", ("dq", "dk", "dv"))):
        if direction == "bwd" and (not want_bwd or "dq" not in got):
            if want_bwd:
                tally.line("SKIP", "bwd " + case.label(), note)
            continue
        ok, detail = judge({n: got.get(n) for n in names}, ref, plain)
        if ours.ops_buffers:
            if strict_err:
                ok, detail = False, detail + "  | " + strict_err
            elif any(n in strict for n in names):
                ok2, detail2 = judge({n: strict.get(n) for n in names}, ref, plain)
                ok, detail = ok and ok2, detail + "  | NaN-buffer ops path: " + detail2
        if direction == "fwd" and "lse" in note:
            detail += f"  [{note}]"
        tally.line("PASS" if ok else "FAIL", f"{direction} " + case.label(), detail)


def check_bad_inputs(ours, tally: Tally):
    """Invalid calls must raise a Python exception naming the problem; never crash or return garbage."""
    fa = ours.module
    q = torch.randn(1, 16, 4, 64, device=DEV, dtype=torch.bfloat16)
    k3 = torch.randn(1, 16, 3, 64, device=DEV, dtype=torch.bfloat16)
    bad = {
        "Hq % Hkv != 0": lambda: fa.flash_attn_func(q, k3, k3),
        "head dim mismatch q/k": lambda: fa.flash_attn_func(q, q[..., :32].contiguous(), q),
        "float64 inputs": lambda: fa.flash_attn_func(q.double(), q.double(), q.double()),
    }
    if ON_GPU:
        bad["q on GPU, k on CPU"] = lambda: fa.flash_attn_func(q, q.cpu(), q.cpu())
    for what, fn in bad.items():
        try:
            fn()
            common.sync(DEV)
            tally.line("FAIL", f"bad-input {what}", "no exception raised")
        except Exception as e:
            tally.line("PASS", f"bad-input {what}", f"{type(e).__name__}: {str(e)[:120]}")


def check_drop_in_layouts(ours, gen, tally: Tally):
    """What flash_attn takes must run: head dims that are not a multiple of 8 (padded by the Python layer), a
    packed qkv whose head strides are not 16-byte multiples, and a view whose data pointer is not 16-byte
    aligned (copied). Forward and backward against the float64 reference, the usual 2x rule."""
    fa = ours.module
    dt = torch.bfloat16

    def rand(*shape):
        return torch.randn(*shape, generator=gen, device=DEV, dtype=torch.float32).to(dt)

    def qkv_packed(d):  # (B, S, 3, H, d): head strides of d elements, not 16-byte multiples when d % 8 != 0
        x = rand(2, 77, 3, 4, d)
        return x[:, :, 0], x[:, :, 1], x[:, :, 2]

    def offset_view(d):  # storage offset of one element: data pointers 2 bytes past a 16-byte boundary
        x = rand(2 * 77 * 4 * d + 1)[1:].view(2, 77, 4, d)
        return x, rand(2, 77, 4, d), rand(2, 77, 4, d)

    cases = {
        "head dim 60 causal": (lambda: (rand(2, 77, 4, 60), rand(2, 77, 4, 60), rand(2, 77, 4, 60)), True),
        "head dim 36, dv 20": (lambda: (rand(1, 130, 4, 36), rand(1, 141, 2, 36), rand(1, 141, 2, 20)), False),
        "qkv packed d60": (lambda: qkv_packed(60), True),
        "misaligned q view d64": (lambda: offset_view(64), False),
    }
    for what, (make, causal) in cases.items():
        label = f"drop-in {what}"
        try:
            q, k, v = (t.detach().requires_grad_() for t in make())
            scale = q.shape[-1] ** -0.5
            out = fa.flash_attn_func(q, k, v, causal=causal)
            dout = torch.randn(out.shape, generator=gen, device=DEV, dtype=torch.float32).to(dt)
            dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
            got = {"out": out, "dq": dq, "dk": dk, "dv": dv}
            mask = Mask(causal=causal)
            ref, plain = {}, {}
            for exact, dest in ((True, ref), (False, plain)):
                qs, ks, vs = (t.detach().clone().requires_grad_() for t in (q, k, v))
                o, _ = common.attention(qs, ks, vs, mask, scale, exact=exact)
                g = torch.autograd.grad(o, (qs, ks, vs), dout.to(o.dtype))
                dest.update(out=o.detach(), dq=g[0], dk=g[1], dv=g[2])
            ok, detail = judge(got, ref, plain)
            tally.line("PASS" if ok else "FAIL", label, detail)
        except Exception as e:
            tally.line("FAIL", label, f"raised {type(e).__name__}: {str(e)[:200]}")


def self_test(gen, tally: Tally):
    """The rule must pass a correct fused kernel and fail broken answers; torch SDPA's FLASH backend stands
    in for a correct kernel (it supports top-left causal only, so no other masks)."""
    # SDPA's FA2 takes is_causal only when Sq == Sk (then both alignments agree). On the CPU, torch's own
    # flash kernel is not FA2 and is looser than 2x on long causal gradients: there only the first shape.
    cases = [Case("sdpa-fa2", 2, 113, 203, 4, 4, 128),
             Case("sdpa-fa2", 1, 1023, 1023, 2, 2, 64, dtype="fp16", mask=Mask(causal=True, top_left=True)),
             Case("sdpa-fa2", 1, 4096, 4096, 4, 4, 128, mask=Mask(causal=True, top_left=True))]
    for case in cases if ON_GPU else cases[:1]:
        try:
            self_test_case(case, gen, tally)
        except Exception as e:
            tally.line("FAIL", "self-test " + case.label(), f"raised {type(e).__name__}: {str(e)[:200]}")


def self_test_case(case: Case, gen, tally: Tally):
    """One shape through SDPA's FA2 (must pass); on the first shape also the mutated answers (must fail)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415

    q, k, v, dout, slopes = make_inputs(case, gen)
    ref = reference(case, q, k, v, slopes, True, dout)
    plain = reference(case, q, k, v, slopes, False, dout)
    qg, kg, vg = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=case.mask.causal)
        dq, dk, dv = torch.autograd.grad(o, (qg, kg, vg), dout.transpose(1, 2))
    got = {"out": o.transpose(1, 2), "dq": dq.transpose(1, 2), "dk": dk.transpose(1, 2),
           "dv": dv.transpose(1, 2)}
    ok, detail = judge(got, ref, plain)
    tally.line("PASS" if ok else "FAIL", "self-test (must pass) " + case.label(), detail)
    if case.sq == 113:
        good = {"out": got["out"].clone()}
        nan = good["out"].clone()
        nan.view(-1)[nan.numel() // 2] = float("nan")
        row = good["out"].clone()
        row[0, 7] = row[0, 8]  # one query row's output copied from its neighbour
        for what, bad in (("one NaN", nan), ("one wrong row", row)):
            ok, detail = judge({"out": bad}, ref, plain)
            tally.line("FAIL" if ok else "PASS", f"self-test (must fail: {what})", detail)


def kernel_filter(ours) -> str:
    """The substring every GPU kernel our package launches shares ("flashattn" from the namespace), for
    compute-sanitizer's --kernel-name filter; "" when our kernels do not all carry it (run unfiltered)."""
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

    if not ON_GPU:
        return ""  # no CUDA kernels to name (FLASHATTN_CHECK_DEVICE=cpu: the harness's CPU self-test)
    q = torch.randn(1, 64, 2, 64, device=DEV, dtype=torch.bfloat16)
    qg, kg, vg = (torch.randn_like(q).requires_grad_() for _ in range(3))
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        o = ours.module.flash_attn_func(qg, kg, vg, causal=True)
        try:
            o.sum().backward()
        except Exception as e:
            if not common.is_not_implemented(e):
                raise
        common.sync(DEV)
    # torch's own kernels (the sum, fills, casts) live in at:: / the cub and cutlass namespaces of ATen.
    names = {e.name for e in prof.events() if e.device_type.name == "CUDA"
             and "at::" not in e.name and not e.name.startswith(("Memcpy", "Memset"))}
    print("# our kernels: " + ("; ".join(sorted(names))[:600] or "none seen"), file=sys.stderr)
    return "flashattn" if names and all("flashattn" in n for n in names) else ""


def select_cases(a) -> list:
    """The cases --tiny / --quick / --cases select, in order."""
    cases = TINY if a.tiny else [c for c in build_cases() if c.quick or not a.quick]
    return [c for c in cases if re.search(a.cases, c.label())]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--tiny", action="store_true", help="the compute-sanitizer subset: ours only")
    ap.add_argument("--json", help="write the summary here")
    ap.add_argument("--kernel-filter", action="store_true",
                    help="print the compute-sanitizer --kernel-name substring for our kernels and exit")
    ap.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    ap.add_argument("--cases", default="", help="only cases whose label matches this regular expression")
    ap.add_argument("--list", action="store_true", help="print the selected cases' labels and exit")
    ap.add_argument("--plain-on-cpu", action="store_true",
                    help="compute the plain low-precision implementation on the CPU (under compute-sanitizer)")
    a = ap.parse_args()
    global PLAIN_ON_CPU
    PLAIN_ON_CPU = a.plain_on_cpu
    if a.list:
        for c in select_cases(a):
            print(c.label())
        return 0
    # torch explains at length why each SDPA backend it was not asked for is unused; keep the log readable.
    warnings.filterwarnings("ignore", category=UserWarning)
    log = sys.stdout
    gen = torch.Generator(device=DEV)
    gen.manual_seed(a.seed)
    what = "kernel-filter" if a.kernel_filter else "tiny" if a.tiny else "quick" if a.quick else "full"
    print(f"# check.py seed {a.seed} ({what}) on "
          f"{torch.cuda.get_device_name() if ON_GPU else 'cpu'}", flush=True)
    ours = common.load_ours(DEV)
    print("# " + common.describe_ours(ours), flush=True)
    if a.kernel_filter:
        print(kernel_filter(ours) if ours.ok else "")
        return 0
    mode = "tiny" if a.tiny else "quick" if a.quick else "full"
    tally = Tally(log, a.json, {"ours": common.describe_ours(ours), "seed": a.seed, "mode": mode})
    t0 = time.time()
    if not a.tiny:
        self_test(gen, tally)
    if ours.ok:
        for case in select_cases(a):
            try:
                check_case(ours, case, gen, tally, a.quick)
            except Exception as e:
                tally.line("FAIL", case.label(), f"raised {type(e).__name__}: {str(e)[:200]}")
                traceback.print_exc(file=log)
            if ON_GPU:
                torch.cuda.empty_cache()
        if not a.tiny:
            check_bad_inputs(ours, tally)
            if ON_GPU:
                check_drop_in_layouts(ours, gen, tally)
    c = tally.counts
    summary = tally.summary()
    print(f"# {summary} in {time.time() - t0:.0f} s" + ("" if ours.ok else "  (self-test only: ours not available)"))
    if tally.failures:
        print("# failed: " + "; ".join(tally.failures[:20]))
    tally.save(done=True)
    # The plain closing line runners recognise.
    print(f"{c['pass']} passed, {c['fail']} failed, {c['skip']} skipped")
    return 1 if c["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
