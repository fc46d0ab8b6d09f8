"""Backward timing of the cuda-sm80 backend next to torch SDPA's flash (FA2) and cuDNN backends, same run,
same protocol as shared/anchors/sdpa_bench.py: triton do_bench median, bf16, batch*seqlen = 16k tokens,
model dim 2048 (heads = 2048 / hdim), FLOPs 2.5 * 4*B*H*S*S*D (halved when causal). Only the backward is timed
(ours: fa_backward on a saved out/lse; SDPA: autograd.grad on a retained graph).

    python3 bench_bwd.py LIB[:TAG] [LIB2[:TAG2] ...] [seqlen ...] [--hdims 64,128] [--deterministic] [--rounds N]
                         [--rep MS]

Several libraries (e.g. two builds of the backward) are timed in the same process, next to the same SDPA runs.
--rounds N: every library and peer is timed N times per shape, interleaved (round r starts at the r-th of them), and
the median is printed, after a "# rounds" line with every round's TFLOP/s: a drift of the clocks during a shape then
moves all of them alike instead of whichever came last. A "# paired" line then gives each library's time against the
first library's in the same round (first / it, so > 1 is faster), as the median over the rounds and its range: a
ratio of neighbours in time, which a drift between rounds moves less than either median; a "# started" line gives
the epoch second each timing began, to read against a clock log (bwd_patch_ab.sh writes one). --rep MS: do_bench's
repeat time per timing (default 100; with many rounds, fewer ms each keep the run's length).

Prints TSV: backend hdim causal seqlen batch heads ms tflops, and max |ours - flash2| of dq, dk, dv per shape.
"""
import ctypes as C
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from bench_fwd import Attention, Exec, FwdParams, Tensor, load_libs, view


class BwdParams(C.Structure):
    _fields_ = [("attn", Attention), ("out", Tensor), ("lse", Tensor), ("dout", Tensor), ("dq", Tensor),
                ("dk", Tensor), ("dv", Tensor), ("dsinks", Tensor)]


def lse_view(t):
    v = Tensor()
    v.data, v.dtype, v.device, v.device_index, v.ndim = t.data_ptr(), 0, 1, t.device.index or 0, t.dim()
    for i in range(t.dim()):
        v.shape[i], v.stride[i] = t.shape[i], t.stride(i)
    return v


def paired(base, other):
    """The median and range over rounds of base[r] / other[r] (> 1: other is faster)."""
    ratios = sorted(b / o for b, o in zip(base, other))
    return f"{ratios[len(ratios) // 2]:.3f} [{ratios[0]:.3f}, {ratios[-1]:.3f}]"


def main():
    args = sys.argv[1:]
    libs = load_libs(args)
    for _, lib in libs:
        lib.fa_backward.argtypes = [C.POINTER(BwdParams), C.POINTER(Exec)]
    hdims = (64, 128)
    if "--hdims" in args:
        i = args.index("--hdims")
        hdims = tuple(int(x) for x in args[i + 1].split(","))
        del args[i:i + 2]
    deterministic = "--deterministic" in args
    if deterministic:
        args.remove("--deterministic")
    rep_ms = 100
    if "--rep" in args:
        i = args.index("--rep")
        rep_ms = int(args[i + 1])
        del args[i:i + 2]
    rounds = 1
    if "--rounds" in args:
        i = args.index("--rounds")
        rounds = int(args[i + 1])
        del args[i:i + 2]
    seqlens = [int(s) for s in args] or [2048, 8192]
    print("# device", torch.cuda.get_device_name(), "torch", torch.__version__, "cudnn", torch.backends.cudnn.version(),
          flush=True)
    print("backend\thdim\tcausal\tseqlen\tbatch\theads\tms\ttflops", flush=True)
    tokens = 16384
    for hdim in hdims:
        heads = 2048 // hdim
        for causal in (False, True):
            for seqlen in seqlens:
                batch = tokens // seqlen
                q, k, v, do = (torch.randn(batch, seqlen, heads, hdim, device="cuda", dtype=torch.bfloat16)
                               for _ in range(4))
                out = torch.empty_like(q)
                lse = torch.empty(batch, heads, seqlen, device="cuda", dtype=torch.float32)
                dq, dk, dv = (torch.empty_like(q) for _ in range(3))
                p = BwdParams()
                p.attn.q, p.attn.k, p.attn.v = view(q), view(k), view(v)
                p.out, p.lse, p.dout = view(out), lse_view(lse), view(do)
                p.dq, p.dk, p.dv = view(dq), view(dk), view(dv)
                p.attn.causal = int(causal)
                p.attn.window_left = p.attn.window_right = -1
                fp = FwdParams()
                fp.attn, fp.out, fp.lse = p.attn, p.out, p.lse
                ex = Exec()
                ex.stream = torch.cuda.current_stream().cuda_stream
                ex.deterministic = int(deterministic)
                flops = 2.5 * 4 * batch * heads * seqlen * seqlen * hdim / (2 if causal else 1)
                timers, grads = {}, {}  # name -> a callable timing one backward (ms)
                for tag, lib in libs:
                    def ours(lib=lib):
                        if lib.fa_backward(C.byref(p), C.byref(ex)) != 0:
                            raise RuntimeError(lib.fa_last_error().decode())

                    def forward(lib=lib):  # this library's out and LSE, which its backward reads
                        if lib.fa_forward(C.byref(fp), C.byref(ex)) != 0:
                            raise RuntimeError(lib.fa_last_error().decode())

                    forward()
                    ours()
                    grads[tag] = [t.clone() for t in (dq, dk, dv)]
                    if deterministic:
                        tag += "_det"
                    timers[tag] = lambda f=forward, b=ours: (f(), do_bench(b, warmup=25, rep=rep_ms,
                                                                              return_mode="median"))[1]
                    if rounds == 1:  # as before --rounds: each library timed right after its forward, peers last
                        ms = timers[tag]()
                        timers[tag] = lambda ms=ms: ms
                ref, keep = None, []
                for name, be in (("flash2", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                    try:
                        qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
                        with sdpa_kernel(be):
                            o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                        dot = do.transpose(1, 2)
                        fn = (lambda o=o, qt=qt, kt=kt, vt=vt, dot=dot:
                              torch.autograd.grad(o, (qt, kt, vt), dot, retain_graph=True))
                        g = fn()
                        if ref is None:
                            ref = [x.transpose(1, 2) for x in g]
                        g = None
                        if rounds == 1:  # timed here, its graph freed before the next backend
                            ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
                            timers[name] = lambda ms=ms: ms
                            o = fn = None
                        else:
                            timers[name] = lambda fn=fn: do_bench(fn, warmup=25, rep=rep_ms, return_mode="median")
                            keep.append(o)
                    except Exception as e:  # backend refuses the shape
                        print(f"# {name} failed: {type(e).__name__}: {str(e)[:80]}")
                names = list(timers)
                times = {name: [] for name in names}
                starts = {name: [] for name in names}  # epoch seconds each timing began (against a clock log)
                for r in range(rounds):
                    for name in names[r % len(names):] + names[:r % len(names)]:
                        starts[name].append(time.time())
                        times[name].append(timers[name]())
                results = {name: sorted(ts)[len(ts) // 2] for name, ts in times.items()}
                if rounds > 1:
                    print(f"# rounds hdim {hdim} causal {int(causal)} seqlen {seqlen}: " + "  ".join(
                        f"{name} " + "/".join(f"{flops / t / 1e9:.1f}" for t in ts) for name, ts in times.items()),
                          flush=True)
                    print(f"# started hdim {hdim} causal {int(causal)} seqlen {seqlen}: " + "  ".join(
                        f"{name} " + "/".join(f"{t:.2f}" for t in ts) for name, ts in starts.items()), flush=True)
                    first = names[0]
                    pairs = "  ".join(f"{n} {paired(times[first], ts)}" for n, ts in times.items() if n != first)
                    print(f"# paired hdim {hdim} causal {int(causal)} seqlen {seqlen} (against {first}): {pairs}",
                          flush=True)
                for name, ms in results.items():
                    print(f"{name}\t{hdim}\t{int(causal)}\t{seqlen}\t{batch}\t{heads}\t{ms:.4f}\t"
                          f"{flops / ms / 1e9:.1f}", flush=True)
                for tag, g in grads.items() if ref is not None else ():
                    diffs = [(a.float() - b.float()).abs().max().item() for a, b in zip(g, ref)]
                    print(f"# check {tag} hdim {hdim} causal {int(causal)} seqlen {seqlen}: max|ours - flash2| "
                          f"dq {diffs[0]:.3e} dk {diffs[1]:.3e} dv {diffs[2]:.3e}", flush=True)
                del q, k, v, do, out, lse, dq, dk, dv, ref, grads, timers, keep
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
