"""Times the tile variants of libsm80_tiles.so (variants.cuh) next to torch SDPA's flash backend (FA2), same
process, same protocol as bench_fwd.py / bench_bwd.py (do_bench median, bf16, 16k tokens, model dim 2048).

    python3 sm80_tiles.py LIB[,LIB...] [seqlen ...] [--only fwd|bwd] [--hdims 64,128,256] [--repeat N]

Several libraries (an A/B of a code change: build.sh with SRC_ROOT) are timed in the same process; their variants
are named "<library index>:<variant>". --repeat N measures every row N times (the spread of repeated runs).

Prints TSV rows: kind hdim causal seqlen variant ms tflops ratio_to_flash2 max_abs_diff_to_flash2 (backward:
the largest over dq, dk, dv).
"""
import ctypes as C
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench


def load(path):
    """libsm80_tiles.so with the signatures of api.cu."""
    lib = C.CDLL(path)
    P = C.c_void_p
    lib.v_name.restype = C.c_char_p
    lib.v_dq_floats.restype = C.c_longlong
    lib.v_dq_floats.argtypes = [C.c_int] * 5
    lib.v_fwd.argtypes = [C.c_int, P, P, P, P, P] + [C.c_int] * 4 + [P]
    lib.v_bwd.argtypes = [C.c_int] + [P] * 11 + [C.c_int] * 4 + [P]
    return lib


def main():
    args = sys.argv[1:]
    libs = [load(path) for path in args.pop(0).split(",")]
    only = None
    if "--only" in args:
        i = args.index("--only")
        only = args[i + 1]
        del args[i:i + 2]
    hdims = (64, 128, 256)
    if "--hdims" in args:
        i = args.index("--hdims")
        hdims = tuple(int(x) for x in args[i + 1].split(","))
        del args[i:i + 2]
    repeat = 1
    if "--repeat" in args:
        i = args.index("--repeat")
        repeat = int(args[i + 1])
        del args[i:i + 2]
    seqlens = [int(s) for s in args] or [1024, 2048, 4096, 8192, 16384]
    variants = [dict(id=i, lib=lib, name=(f"{n}:" if len(libs) > 1 else "") + lib.v_name(i).decode(),
                     bwd=lib.v_backward(i), d=lib.v_head_dim(i), causal=lib.v_causal(i))
                for n, lib in enumerate(libs) for i in range(lib.v_count())]
    print("# device", torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    print("kind\thdim\tcausal\tseqlen\tvariant\tms\ttflops\tratio\tmaxdiff", flush=True)
    stream = torch.cuda.current_stream().cuda_stream
    for kind in ("fwd", "bwd"):
        if only and kind != only:
            continue
        for d in hdims:
            h = 2048 // d
            for causal in (0, 1):
                group = [v for v in variants if v["bwd"] == (kind == "bwd") and v["d"] == d and v["causal"] == causal]
                if not group:
                    continue
                fwd_of = next(v for v in variants if not v["bwd"] and v["d"] == d and v["causal"] == causal)
                for s in [s for s in seqlens for _ in range(repeat)]:
                    b = 16384 // s
                    q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
                    flops = 4 * b * h * s * s * d / (2 if causal else 1) * (2.5 if kind == "bwd" else 1)
                    qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                        o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal))
                    rows = []
                    if kind == "fwd":
                        ref = o.detach().transpose(1, 2)
                        def fa2():
                            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                                F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal))
                        with torch.no_grad():
                            base = do_bench(fa2, warmup=25, rep=100, return_mode="median")
                        rows.append(("flash2", base, 0.0))
                        for var in group:
                            out = torch.full_like(q, float("nan"))
                            lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
                            call = lambda: var["lib"].v_fwd(var["id"], q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                                            out.data_ptr(), lse.data_ptr(), b, s, h, d, stream)
                            rc = call()
                            if rc != 0:
                                rows.append((var["name"], float("nan"), float(rc)))
                                continue
                            diff = (out.float() - ref.float()).abs().max().item()
                            rows.append((var["name"], do_bench(call, warmup=25, rep=100, return_mode="median"), diff))
                    else:
                        dot = do.transpose(1, 2)
                        fn = lambda: torch.autograd.grad(o, (qt, kt, vt), dot, retain_graph=True)
                        ref = [x.transpose(1, 2) for x in fn()]
                        base = do_bench(fn, warmup=25, rep=100, return_mode="median")
                        rows.append(("flash2", base, 0.0))
                        out = torch.empty_like(q)
                        lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
                        fwd_of["lib"].v_fwd(fwd_of["id"], q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                                            lse.data_ptr(), b, s, h, d, stream)
                        dsum = torch.empty(h * b * s, device="cuda", dtype=torch.float32)
                        for var in group:
                            dq_floats = var["lib"].v_dq_floats(var["id"], b, s, h, d)
                            dq_acc = torch.empty(dq_floats, device="cuda", dtype=torch.float32)
                            grads = [torch.full_like(q, float("nan")) for _ in range(3)]
                            call = lambda: var["lib"].v_bwd(var["id"], q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                                            out.data_ptr(), lse.data_ptr(), do.data_ptr(),
                                                            grads[0].data_ptr(), grads[1].data_ptr(),
                                                            grads[2].data_ptr(), dsum.data_ptr(),
                                                            dq_acc.data_ptr(), b, s, h, d, stream)
                            rc = call()
                            if rc != 0:
                                rows.append((var["name"], float("nan"), float(rc)))
                                continue
                            diff = max((g.float() - r.float()).abs().max().item() for g, r in zip(grads, ref))
                            rows.append((var["name"], do_bench(call, warmup=25, rep=100, return_mode="median"), diff))
                            del grads
                            del dq_acc
                    for name, ms, diff in rows:
                        print(f"{kind}\t{d}\t{causal}\t{s}\t{name}\t{ms:.4f}\t{flops / ms / 1e9:.1f}\t"
                              f"{base / ms:.3f}\t{diff:.3e}", flush=True)
                    q = k = v = do = qt = kt = vt = o = ref = None  # free them before the next shape
                    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
