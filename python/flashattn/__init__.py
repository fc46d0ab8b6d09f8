"""flashattn: exact IO-aware attention (FlashAttention) with CPU and CUDA backends.

* ``flashattn.ops``: torch-free forward/backward on any DLPack arrays (numpy, cupy, jax, torch).
* ``flash_attn_func`` and friends: drop-in replacements for flash_attn 2.x's functions, with autograd,
  ``torch.compile`` (custom ops ``flashattn::fwd`` / ``flashattn::bwd``) and CUDA-graph support;
  ``flash_attn_with_kvcache`` for inference (KV-cache append, rotary, paged caches, split-KV). They
  are loaded, with torch, on first access, so ``import flashattn`` does not need torch.
"""

import importlib

from . import _C, ops  # noqa: F401  (flashattn._C, the extension, is public)

__version__ = "0.1.0"

_TORCH_API = (
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
)

_KVCACHE_API = ("flash_attn_with_kvcache",)

quantize_fp8 = ops.quantize_fp8  # FP8 inputs with per-(batch, head) factors, optionally Hadamard-rotated

__all__ = ["ops", "quantize_fp8", "__version__", *_TORCH_API, *_KVCACHE_API]


def __getattr__(name):
    # PEP 562: import the torch interface only when one of its functions is asked for.
    if name in _KVCACHE_API or name == "kvcache":
        kvcache = importlib.import_module(".kvcache", __name__)
        return kvcache if name == "kvcache" else getattr(kvcache, name)
    if name in _TORCH_API or name == "interface":
        # import_module, not `from . import`: the latter looks the name up here first and would recurse.
        interface = importlib.import_module(".interface", __name__)
        return interface if name == "interface" else getattr(interface, name)
    raise AttributeError(f"module 'flashattn' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_TORCH_API) | set(_KVCACHE_API))
