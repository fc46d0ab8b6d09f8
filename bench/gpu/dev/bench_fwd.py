"""Forward timing of the cuda-sm80 backend next to torch SDPA's flash (FA2) and cuDNN backends, same run,
same protocol as shared/anchors/sdpa_bench.py: triton do_bench median, bf16, batch*seqlen = 16k tokens,
model dim 2048 (heads = 2048 / hdim), FLOPs 4*B*H*S*S*D (halved when causal).

    python3 bench_fwd.py LIB[:TAG] [LIB2[:TAG2] ...] [seqlen ...] [--hdims 64,128,256] [--ours-only] [--tag NAME]
                         [--backends auto,sm80,sm90] [--masks none,causal]

Several libraries (e.g. two builds of the forward) are timed in the same process, next to the same SDPA runs; a
library's rows carry its TAG (one library: --tag, default "ours"). --backends times each named backend of ours
(rows tagged by name, or TAG_name with several libraries; default: auto only).

Calls the C ABI through ctypes (no binding needed). Prints TSV: backend hdim causal seqlen batch heads ms tflops,
and a max-abs-difference check of ours against SDPA for each shape.
"""
import ctypes as C
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

FA_MAX_DIMS = 4
FA_BFLOAT16, FA_DEVICE_CUDA = 2, 1


class Tensor(C.Structure):
    _fields_ = [("data", C.c_void_p), ("dtype", C.c_int), ("device", C.c_int), ("device_index", C.c_int),
                ("ndim", C.c_int), ("shape", C.c_int64 * FA_MAX_DIMS), ("stride", C.c_int64 * FA_MAX_DIMS)]


class Attention(C.Structure):
    _fields_ = [("q", Tensor), ("k", Tensor), ("v", Tensor), ("cu_seqlens_q", Tensor), ("cu_seqlens_k", Tensor),
                ("seqused_k", Tensor), ("max_seqlen_q", C.c_int64), ("max_seqlen_k", C.c_int64),
                ("has_softmax_scale", C.c_int), ("softmax_scale", C.c_float), ("causal", C.c_int),
                ("causal_alignment", C.c_int), ("window_left", C.c_int64), ("window_right", C.c_int64),
                ("softcap", C.c_float), ("alibi_slopes", Tensor), ("dropout_p", C.c_float), ("sinks", Tensor),
                ("dropout_seed", C.c_uint64), ("dropout_offset", C.c_uint64), ("block_table", Tensor),
                ("q_descale", Tensor), ("k_descale", Tensor), ("v_descale", Tensor), ("dropout_rng", Tensor)]


class Exec(C.Structure):
    _fields_ = [("backend", C.c_int), ("num_threads", C.c_int), ("stream", C.c_void_p), ("deterministic", C.c_int),
                ("num_splits", C.c_int)]


class FwdParams(C.Structure):
    _fields_ = [("attn", Attention), ("out", Tensor), ("lse", Tensor)]


def view(t):
    v = Tensor()
    v.data, v.dtype, v.device = t.data_ptr(), FA_BFLOAT16, FA_DEVICE_CUDA
    v.device_index, v.ndim = t.device.index or 0, t.dim()
    for i in range(t.dim()):
        v.shape[i], v.stride[i] = t.shape[i], t.stride(i)
    return v


def load_libs(args, default_tag="ours"):
    """The LIB[:TAG] arguments of args (removed from it) as (tag, ctypes library) pairs, fa_forward typed."""
    libs = []
    for a in [a for a in args if ".so" in a]:
        args.remove(a)
        path, _, tag = a.partition(".so:")
        lib = C.CDLL(path + ".so" if tag else a)
        lib.fa_forward.argtypes = [C.POINTER(FwdParams), C.POINTER(Exec)]
        lib.fa_last_error.restype = C.c_char_p
        libs.append((tag or default_tag, lib))
    return libs


def main():
    args = sys.argv[1:]
    hdims, ours_only, tag = (64, 128, 256), False, "ours"
    if "--hdims" in args:
        i = args.index("--hdims")
        hdims = tuple(int(x) for x in args[i + 1].split(","))
        del args[i:i + 2]
    if "--tag" in args:
        i = args.index("--tag")
        tag = args[i + 1]
        del args[i:i + 2]
    backends = None
    if "--backends" in args:
        i = args.index("--backends")
        backends = args[i + 1].split(",")
        del args[i:i + 2]
    if "--ours-only" in args:
        ours_only = True
        args.remove("--ours-only")
    masks = (False, True)  # --masks none,causal: which of the two (a schedule change times only the causal rows)
    if "--masks" in args:
        i = args.index("--masks")
        masks = tuple(m == "causal" for m in args[i + 1].split(","))
        del args[i:i + 2]
    libs = load_libs(args, tag)
    seqlens = [int(s) for s in args] or [1024, 2048, 8192]
    print("# device", torch.cuda.get_device_name(), "torch", torch.__version__, "cudnn", torch.backends.cudnn.version(),
          flush=True)
    print("backend\thdim\tcausal\tseqlen\tbatch\theads\tms\ttflops", flush=True)
    tokens = 16384
    for hdim in hdims:
        heads = 2048 // hdim
        for causal in masks:
            for seqlen in seqlens:
                batch = tokens // seqlen
                shape = (batch, seqlen, heads, hdim)
                q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                out = torch.empty_like(q)
                p = FwdParams()
                p.attn.q, p.attn.k, p.attn.v, p.out = view(q), view(k), view(v), view(out)
                p.attn.causal = int(causal)
                p.attn.window_left = p.attn.window_right = -1
                flops = 4 * batch * heads * seqlen * seqlen * hdim / (2 if causal else 1)
                results, outs = {}, {}
                for ltag, lib in libs:
                    for bname in backends or [None]:
                        ex = Exec()
                        ex.backend = {None: 0, "auto": 0, "sm80": 2, "sm90": 3}[bname]
                        ex.stream = torch.cuda.current_stream().cuda_stream
                        name = (f"{ltag}_{bname}" if len(libs) > 1 else bname) if bname else ltag

                        def ours():
                            if lib.fa_forward(C.byref(p), C.byref(ex)) != 0:
                                raise RuntimeError(lib.fa_last_error().decode())

                        try:
                            out.fill_(float("nan"))
                            ours()
                            outs[name] = out.clone()
                            results[name] = do_bench(ours, warmup=50, rep=200, return_mode="median")
                        except Exception as e:
                            print(f"# {name} failed: {type(e).__name__}: {str(e)[:160]}", flush=True)
                qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
                ref = None
                peers = (("flash2", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION))
                for name, be in () if ours_only else peers:
                    try:
                        with sdpa_kernel(be):
                            fn = lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                            r = fn()
                            if ref is None:
                                ref = r
                            results[name] = do_bench(fn, warmup=50, rep=200, return_mode="median")
                    except Exception as e:  # backend refuses the shape
                        print(f"# {name} failed: {type(e).__name__}: {str(e)[:80]}")
                for name, ms in results.items():
                    print(f"{name}\t{hdim}\t{int(causal)}\t{seqlen}\t{batch}\t{heads}\t{ms:.4f}\t"
                          f"{flops / ms / 1e9:.1f}", flush=True)
                for name, o in outs.items() if ref is not None else ():
                    diff = (o.float() - ref.transpose(1, 2).float()).abs().max().item()
                    print(f"# check {name} hdim {hdim} causal {int(causal)} seqlen {seqlen}: max|ours - sdpa| = "
                          f"{diff:.3e}", flush=True)
                del q, k, v, out, ref, outs
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
