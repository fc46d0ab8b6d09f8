"""Shared pieces of the GPU harness: loading our package, the torch reference, the FLOP convention.

The reference is one function, `attention`, evaluated twice: in float64 (the ground truth) and in the
inputs' dtype with every intermediate rounded to it, as an unfused framework computes attention (the
"plain low-precision implementation" whose own error sets the tolerance, the FlashAttention convention; the
rule is `tolerance`, the one of every suite: docs/testing.md).
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
import os
import sys
from typing import Optional

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def sync(device: str):
    """Waits for the device's queued work (CUDA calls are asynchronous; CPU calls return when done)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------- our package
@dataclasses.dataclass
class Ours:
    module: Optional[object]
    reason: str  # why it is not available ("" when it is)
    supports_out: bool = False  # flash_attn_func(..., out=) lets us pass a NaN-filled output buffer
    alignment_kw: Optional[str] = None  # the keyword that picks top-left causal alignment, if any
    # flashattn.ops.forward/backward take caller-owned out/lse/dq/dk/dv buffers: the strict poisoning path
    ops_buffers: bool = False

    @property
    def ok(self) -> bool:
        return self.module is not None


def load_ours(device: str = "cuda") -> Ours:
    """Imports `flashattn` (or the package FLASHATTN_BENCH_PACKAGE names: run.sh --mock sets the stand-in
    `flashattn_mock` of bench/gpu/mock) and runs one tiny call on `device`, so that a package built without
    CUDA (or a kernel that refuses every shape) reports a reason instead of failing case after case."""
    name = os.environ.get("FLASHATTN_BENCH_PACKAGE", "flashattn")
    try:
        flashattn = importlib.import_module(name)  # optional dependency: the harness runs without it
    except Exception as e:  # ImportError, or a broken extension (undefined symbol, wrong ABI)
        return Ours(None, f"import {name} failed: {type(e).__name__}: {e}")
    if not hasattr(flashattn, "flash_attn_func"):
        return Ours(None, f"{name} has no flash_attn_func")
    params = inspect.signature(flashattn.flash_attn_func).parameters
    align = next((p for p in params if "align" in p), None)
    ops = getattr(flashattn, "ops", None)

    def takes(fn, name):
        return fn is not None and name in inspect.signature(fn).parameters

    ops_buffers = takes(getattr(ops, "forward", None), "out") and takes(getattr(ops, "backward", None), "dq")
    ours = Ours(flashattn, "", supports_out="out" in params, alignment_kw=align, ops_buffers=ops_buffers)
    try:
        q = torch.randn(1, 8, 1, 64, device=device, dtype=torch.bfloat16)
        o = flashattn.flash_attn_func(q, q, q)
        sync(device)
        if o.shape != q.shape or not bool(torch.isfinite(o).all()):
            return Ours(None, f"smoke call returned shape {tuple(o.shape)} / non-finite values")
    except Exception as e:
        return Ours(None, f"smoke call on {device} failed: {type(e).__name__}: {str(e)[:200]}")
    return ours


def describe_ours(ours: Ours) -> str:
    if not ours.ok:
        return f"ours: not available ({ours.reason})"
    m = ours.module
    where = getattr(m, "__file__", "?")
    ver = getattr(m, "__version__", "?")
    return f"ours: flashattn {ver} from {where}"


def is_not_implemented(e: BaseException) -> bool:
    """Our package raises NotImplementedError for a valid request no built kernel implements
    (FA_ERROR_UNSUPPORTED); anything else an implemented path raises is a failure."""
    return isinstance(e, NotImplementedError)


# ----------------------------------------------------------------------------- the reference
@dataclasses.dataclass(frozen=True)
class Mask:
    causal: bool = False
    top_left: bool = False  # causal alignment; False = bottom-right (flash_attn >= 2.1)
    window: tuple = (-1, -1)
    softcap: float = 0.0
    alibi: str = ""  # "" | "heads" (Hq,) | "batch" (B, Hq)

    def label(self) -> str:
        parts = []
        if self.causal:
            parts.append("causal-" + ("tl" if self.top_left else "br"))
        if self.window != (-1, -1):
            parts.append(f"win{self.window[0]},{self.window[1]}")
        if self.softcap:
            parts.append(f"cap{self.softcap:g}")
        if self.alibi:
            parts.append("alibi-" + self.alibi)
        return "+".join(parts) or "none"

    def bounds(self) -> tuple:
        """(left, right) as flash_attn's window_size, causal folded in (right bounded by 0)."""
        left, right = self.window
        if self.causal:
            right = 0 if right < 0 else min(right, 0)
        return left, right


def visible(sq: int, sk: int, mask: Mask, device) -> torch.Tensor:
    """(sq, sk) bool: key j visible to query i. Semantics of include/flashattn/flashattn.h."""
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    diag = i + (0 if mask.top_left else sk - sq)
    left, right = mask.bounds()
    keep = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if left >= 0:
        keep &= j >= diag - left
    if right >= 0:
        keep &= j <= diag + right
    return keep


def attention(q, k, v, mask: Mask, scale: float, slopes=None, exact: bool = True):
    """One sequence batch. q (B, Sq, Hq, D), k (B, Sk, Hkv, D), v (B, Sk, Hkv, Dv); slopes None, (Hq,) or
    (B, Hq) float32. exact: float64 throughout; else the storage dtype with fp32 softmax, every step
    rounded as torch's unfused ops do. Returns out (B, Sq, Hq, Dv) and lse (B, Hq, Sq) (float64/float32).
    Differentiable in both modes (the plain mode's gradients are the low-precision baseline's)."""
    b, sq, hq, _ = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    work = torch.float64 if exact else q.dtype
    soft = torch.float64 if exact else torch.float32
    qh = q.to(work).transpose(1, 2)
    kh = k.to(work).transpose(1, 2).repeat_interleave(hq // hkv, dim=1)
    vh = v.to(work).transpose(1, 2).repeat_interleave(hq // hkv, dim=1)
    s = torch.matmul(qh, kh.transpose(-1, -2)) * scale
    if mask.softcap > 0:
        s = mask.softcap * torch.tanh(s / mask.softcap)
    s = s.to(soft)
    if slopes is not None:
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        dist = (i + (0 if mask.top_left else sk - sq) - j).abs().to(soft)
        sl = slopes.to(soft).reshape(-1, hq)[:, :, None, None]  # (1|B, Hq, 1, 1)
        s = s - sl * dist
    keep = visible(sq, sk, mask, q.device)
    s = s.masked_fill(~keep, float("-inf"))
    rows = keep.any(dim=-1)[:, None]  # (Sq, 1): rows with at least one visible key
    lse = torch.logsumexp(s, dim=-1)  # -inf on fully masked rows
    # Fully masked rows would softmax to NaN (and NaN gradients): give them finite logits, then zero them.
    p = torch.softmax(torch.where(rows, s, torch.zeros((), dtype=s.dtype, device=s.device)), dim=-1) * rows
    out = torch.matmul(p.to(work), vh)
    return out.transpose(1, 2), lse.float() if not exact else lse


# ----------------------------------------------------------------------------- errors
def max_mean_error(x: torch.Tensor, ref: torch.Tensor) -> tuple:
    """Max and mean |x - ref| with NaN/inf in x (where ref is finite) counted as +inf; positions where
    ref is -inf (lse of fully masked rows) must be -inf in x too."""
    x = x.detach().to(torch.float64)
    ref = ref.detach().to(torch.float64)
    both_inf = torch.isinf(ref) & (x == ref)
    diff = (x - ref).abs()
    diff = torch.where(both_inf, torch.zeros_like(diff), diff)
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, math.inf), diff)
    if diff.numel() == 0:
        return 0.0, 0.0
    return float(diff.max()), float(diff.mean())


# The suites' one tolerance rule (docs/testing.md; the C++ suites' reference::Comparison in src/cpu/reference.hpp,
# tests/python's fa_reference.tolerance): max |ours - exact| <= 2 * max |plain - exact| + one unit of the storage
# dtype's rounding at the reference's largest magnitude (at least 1); NaN never passes. The floor per dtype ours
# stored the tensor in: a 16-bit format's ulp near 1, and for float32 (the LSE) a floor far below any real defect
# that covers float32 accumulation.
STORAGE_EPS = {torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10, torch.float32: 1e-6}


def tolerance(plain_err: float, ref: torch.Tensor, dtype: torch.dtype) -> float:
    """The rule's bound for one tensor: 2x the plain implementation's max error plus STORAGE_EPS[dtype] at the
    reference's largest finite magnitude (at least 1). The floor matters where the plain implementation happens
    to be (nearly) exact, e.g. seqlen 1 (out = v): ours may still land on the neighbouring value of the format."""
    finite = ref[torch.isfinite(ref)]
    scale = float(finite.abs().max()) if finite.numel() else 1.0
    return 2.0 * plain_err + STORAGE_EPS[dtype] * max(scale, 1.0)


# ----------------------------------------------------------------------------- FLOPs
def attn_flops(batch: int, heads: int, sq: int, sk: int, d: int, causal: bool, direction: str) -> float:
    """The FlashAttention convention: fwd 4*B*H*Sq*Sk*D (two matmuls), halved when causal; bwd 2.5x fwd
    (five matmuls against two)."""
    f = 4.0 * batch * heads * sq * sk * d / (2 if causal else 1)
    return f * (2.5 if direction == "bwd" else 1.0)


def kernel_times(fn, reps: int = 20) -> list:
    """Each CUDA kernel's time per call of fn, as (name, microseconds) rows, longest first (torch.profiler over
    `reps` calls after a warm-up): which kernels of one call cost what."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    per_kernel: dict = {}
    for e in prof.events():  # the kernels themselves, not the host ops that launched them
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[e.name] = per_kernel.get(e.name, 0.0) + e.time_range.elapsed_us() / reps
    return sorted(per_kernel.items(), key=lambda r: -r[1])


def print_kernel_times(fn, tag: str, call_us: float = 0.0, reps: int = 20) -> None:
    """kernel_times(fn) as "# profile" lines (each kernel's time per call and share), after a line that sets their
    sum against the call's own time call_us when given: the rest is launch gaps and host work."""
    rows = kernel_times(fn, reps=reps)
    busy = sum(t for _, t in rows)
    if call_us:
        print(f"# profile {tag}: call {call_us:.1f} us, kernels {busy:.1f} us, rest {call_us - busy:.1f} us",
              flush=True)
    for name, t in rows:
        print(f"# profile {tag}: {t:8.1f} us {100 * t / max(busy, 1e-9):5.1f}%  {name[:100]}", flush=True)


def env_info() -> dict:
    info = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": str(torch.backends.cudnn.version()),
        "python": sys.version.split()[0],
    }
    try:
        import triton  # noqa: PLC0415

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = "absent"
    info["host_cpus"] = str(os.cpu_count())
    return info
