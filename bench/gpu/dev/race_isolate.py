"""Runs one part of check.py's tiny case 2 (varlen 1x1/17x40/239x100, window (32, 8), d64), so that
compute-sanitizer racecheck can say which part its "Internal Sanitizer Error" comes from:

    compute-sanitizer --tool racecheck --kernel-name kns=flashattn python3 race_isolate.py PART

PART: ref (torch float64 reference only), fwd (flash_attn_varlen_func forward), fwd_bwd (+ autograd backward),
ops_fwd (flashattn.ops.forward into NaN buffers), ops_fwd_bwd (+ ops.backward), det_bwd (ops backward with
deterministic=True); case (check.py's whole check_case, which fails under racecheck while every part above is
clean alone), case_no_poison (the same without poisoning torch's allocator), case_no_plain (the same with the
plain low-precision reference replaced by the exact one: its verdicts say nothing, only whether the sanitizer
still fails), plain (the plain low-precision implementation alone: torch kernels only), case_plain_cpu
(check_case with the plain implementation on the CPU, as check.py --plain-on-cpu). Off the GPU
(FLASHATTN_CHECK_DEVICE=cpu, PYTHONPATH=bench/gpu/mock FLASHATTN_BENCH_PACKAGE=flashattn_mock) it exercises the
script itself.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import check  # noqa: E402
import common  # noqa: E402

part = sys.argv[1]
case = check.TINY[1]
gen = torch.Generator(device=check.DEV).manual_seed(1234)
q, k, v, dout, slopes = check.make_inputs(case, gen)
ours = common.load_ours(check.DEV)
if part == "ref":
    check.reference(case, q, k, v, slopes, True, dout)
elif part == "plain":
    check.reference(case, q, k, v, slopes, False, dout)
elif part in ("fwd", "fwd_bwd"):
    check.run_ours(ours, case, q, k, v, slopes, dout if part == "fwd_bwd" else None)
elif part in ("ops_fwd", "ops_fwd_bwd"):
    check.run_ours_nan_buffers(ours, case, q, k, v, slopes, dout if part == "ops_fwd_bwd" else None)
elif part == "det_bwd":
    ops = ours.module.ops
    lq = [a for a, _ in case.varlen]
    lk = [b for _, b in case.varlen]
    kw = check.ops_kwargs(case, slopes, check.cu_seqlens(lq), check.cu_seqlens(lk),
                           torch.cuda.current_stream().cuda_stream if check.ON_GPU else 0)
    out = torch.empty(q.shape[:-1] + (case.dv,), dtype=q.dtype, device=check.DEV)
    lse = torch.empty((case.hq, q.shape[0]), dtype=torch.float32, device=check.DEV)
    ops.forward(q, k, v, out=out, lse=lse, **kw)
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    ops.backward(dout, q, k, v, out, lse, dq=dq, dk=dk, dv=dv, deterministic=True, **kw)
elif part.startswith("case"):
    if part == "case_no_poison":
        check.poison_allocator = lambda specs: None
    if part == "case_plain_cpu":
        check.PLAIN_ON_CPU = True
    if part == "case_no_plain":
        exact_reference = check.reference
        check.reference = lambda c, q_, k_, v_, s_, exact, dout_=None: exact_reference(c, q_, k_, v_, s_, True, dout_)
    tally = check.Tally(sys.stdout)
    check.check_case(ours, case, gen, tally, False)
common.sync(check.DEV)
print(part, "done")
