"""Decode-shaped forward (one query token per sequence, GQA 32/8, d128, bf16) of cuda-sm90 (query-head packing)
and cuda-sm80 next to torch SDPA cuDNN in one process, TB/s = K+V bytes / median time, the protocol of
shared/anchors/decode_h200_*.tsv (dense cache). No split-KV yet: few (batch, KV head) tiles leave SMs idle.

    python3 bench_decode.py path/to/libflashattn_capi.so
"""
import ctypes as C
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from bench_fwd import Exec, FwdParams, view


def main():
    lib = C.CDLL(sys.argv[1])
    lib.fa_forward.argtypes = [C.POINTER(FwdParams), C.POINTER(Exec)]
    lib.fa_last_error.restype = C.c_char_p
    print("backend\tbatch\tseqlen_k\tus\tTB/s\tmax_diff_vs_cudnn", flush=True)
    hq, hkv, d = 32, 8, 128
    for batch, sk in ((1, 65536), (8, 16384), (32, 8192)):
        q = torch.randn(batch, 1, hq, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(batch, sk, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        kv_bytes = 2 * k.numel() * k.element_size()
        ref = None
        try:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                fn = lambda: F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                            enable_gqa=True)
                ref = fn().transpose(1, 2).float()
                ms = do_bench(fn, warmup=50, rep=200, return_mode="median")
                print(f"cudnn\t{batch}\t{sk}\t{ms * 1e3:.1f}\t{kv_bytes / ms / 1e9:.2f}\t", flush=True)
        except Exception as e:
            print(f"# cudnn failed: {type(e).__name__}: {str(e)[:100]}")
        for name, code in (("sm90", 3), ("sm80", 2)):
            out = torch.empty_like(q)
            p = FwdParams()
            p.attn.q, p.attn.k, p.attn.v, p.out = view(q), view(k), view(v), view(out)
            p.attn.window_left = p.attn.window_right = -1
            ex = Exec()
            ex.backend = code
            ex.stream = torch.cuda.current_stream().cuda_stream

            def ours():
                if lib.fa_forward(C.byref(p), C.byref(ex)) != 0:
                    raise RuntimeError(lib.fa_last_error().decode())

            ours()
            ms = do_bench(ours, warmup=50, rep=200, return_mode="median")
            diff = "" if ref is None else f"{(out.float() - ref).abs().max().item():.2e}"
            print(f"{name}\t{batch}\t{sk}\t{ms * 1e3:.1f}\t{kv_bytes / ms / 1e9:.2f}\t{diff}", flush=True)


if __name__ == "__main__":
    main()
