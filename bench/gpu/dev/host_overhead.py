"""Host cost per call of our Python entry points next to torch SDPA, and what it does to do_bench timings.

    python3 host_overhead.py path/to/libflashattn_capi.so

Part 1: microseconds of host time per call (perf_counter over many calls of a tiny problem, synchronised once at
the end: the GPU work is shorter than the host work, so this is the launch path's cost). Part 2: do_bench median
(the harness protocol) of the same forward through flash_attn_func, through the C ABI by ctypes (host cost ~0) and
through SDPA cuDNN / FA2, at shapes whose kernels are short enough for the host cost to show. Prints TSV.
"""
import importlib.util
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import flashattn

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("bench_fwd", os.path.join(here, "bench_fwd.py"))
bf = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bf)
import ctypes as C  # noqa: E402

lib = C.CDLL(sys.argv[1])
lib.fa_forward.argtypes = [C.POINTER(bf.FwdParams), C.POINTER(bf.Exec)]
lib.fa_last_error.restype = C.c_char_p


def ctypes_call(q, k, v, out, causal):
    p = bf.FwdParams()
    p.attn.q, p.attn.k, p.attn.v, p.out = bf.view(q), bf.view(k), bf.view(v), bf.view(out)
    p.attn.causal = int(causal)
    p.attn.window_left = p.attn.window_right = -1
    ex = bf.Exec()
    ex.stream = torch.cuda.current_stream().cuda_stream

    def run():
        if lib.fa_forward(C.byref(p), C.byref(ex)) != 0:
            raise RuntimeError(lib.fa_last_error().decode())
    return run


def calls(q, k, v, causal):
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], device="cuda", dtype=torch.float32)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    qg = q.detach().clone().requires_grad_()
    stream = torch.cuda.current_stream().cuda_stream

    def sdpa(be):
        def run():
            with sdpa_kernel(be):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        return run
    return {
        "flash_attn_func": lambda: flashattn.flash_attn_func(q, k, v, causal=causal),
        "flash_attn_func_grad_inputs": lambda: flashattn.flash_attn_func(qg, k, v, causal=causal),
        "ops.forward_out": lambda: flashattn.ops.forward(q, k, v, out=out, lse=lse, causal=causal, stream=stream),
        "ctypes_c_abi": ctypes_call(q, k, v, out, causal),
        "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
        "sdpa_flash2": sdpa(SDPBackend.FLASH_ATTENTION),
    }


def main():
    print("# device", torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    print("part\tcall\tshape\tvalue\tunit", flush=True)
    q, k, v = (torch.randn(1, 128, 16, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for name, fn in calls(q, k, v, False).items():
        for _ in range(300):
            fn()
        torch.cuda.synchronize()
        n = 3000
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        host = (time.perf_counter() - t0) / n * 1e6
        torch.cuda.synchronize()
        print(f"host\t{name}\t1x128x16x128\t{host:.1f}\tus/call", flush=True)
    for seqlen, causal in ((512, False), (2048, False), (2048, True), (8192, False)):
        batch = 16384 // seqlen
        q, k, v = (torch.randn(batch, seqlen, 16, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flops = 4 * batch * 16 * seqlen * seqlen * 128 / (2 if causal else 1)
        for name, fn in calls(q, k, v, causal).items():
            ms = do_bench(fn, warmup=50, rep=200, return_mode="median")
            print(f"do_bench\t{name}\tB{batch} S{seqlen} H16 d128 causal={int(causal)}\t"
                  f"{flops / ms / 1e9:.1f}\tTFLOP/s", flush=True)


if __name__ == "__main__":
    main()
