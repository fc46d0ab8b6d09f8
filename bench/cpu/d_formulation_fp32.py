"""Which D costs fp32 dq accuracy with few visible keys per row? A torch emulation, independent of our kernels: the
plain fp32 math of test_torch.py's "causal + window (11, -1) + ALiBi" case at shape 1x33x97x2x1x128, with
dS = P (dP - D) for D = sum_j P_j dP_j (torch autograd's softmax backward, the tolerance's plain implementation) and
for D = rowsum(dO . O) (FlashAttention's, ours). Prints the dq error of each against float64, over seeds.
usage: python bench/cpu/d_formulation_fp32.py [SEEDS]"""
from __future__ import annotations

import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "python"))
import test_torch as T  # noqa: E402


def dq(q, k, v, dout, slopes, dtype, d_from_o, window_left=11):
    qf, kf, vf, g = (x.to(dtype) for x in (q, k, v, dout))
    sq, d = q.shape[1], q.shape[3]
    sk, group = k.shape[1], q.shape[2] // k.shape[2]
    kf, vf = kf.repeat_interleave(group, 2), vf.repeat_interleave(group, 2)
    scale = d ** -0.5
    s = torch.einsum("bihd,bjhd->bhij", qf, kf) * scale
    i, j = torch.arange(sq)[:, None], torch.arange(sk)[None, :]
    diag = i + sk - sq  # causal, bottom-right
    s = s - slopes.to(dtype)[None, :, None, None] * (diag - j).abs().to(dtype)
    s = s.masked_fill(~((j <= diag) & (j >= diag - window_left)), float("-inf"))
    p = torch.softmax(s, -1)
    dp = torch.einsum("bihd,bjhd->bhij", g, vf)
    if d_from_o:
        o = torch.einsum("bhij,bjhd->bihd", p, vf)
        big_d = torch.einsum("bihd,bihd->bhi", g, o)[..., None]
    else:
        big_d = (p * dp).sum(-1, keepdim=True)
    return torch.einsum("bhij,bjhd->bihd", p * (dp - big_d), kf) * scale


def main():
    seeds = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    b, sq, sk, hq, hkv, d = 1, 33, 97, 2, 1, 128
    errs = {False: [], True: []}
    for seed in range(seeds):
        q = T.make((b, sq, hq, d), torch.float32, "cpu", 4 * seed + 1, requires_grad=False)
        k = T.make((b, sk, hkv, d), torch.float32, "cpu", 4 * seed + 2, requires_grad=False)
        v = T.make((b, sk, hkv, d), torch.float32, "cpu", 4 * seed + 3, requires_grad=False)
        g = T.make((b, sq, hq, d), torch.float32, "cpu", 4 * seed + 4, requires_grad=False)
        slopes = torch.rand(hq, generator=torch.Generator().manual_seed(seed)) * 0.5 + 0.1
        exact = dq(q, k, v, g, slopes, torch.float64, False)
        for d_from_o in (False, True):
            errs[d_from_o].append((dq(q, k, v, g, slopes, torch.float32, d_from_o).double() - exact).abs().max().item())
    ratio = [o / p for p, o in zip(errs[False], errs[True])]
    for name, e in (("D = sum P dP", errs[False]), ("D = dO . O", errs[True])):
        print(f"{name:13s} fp32 dq max error over {seeds} seeds: median {statistics.median(e):.3g}, max {max(e):.3g}")
    print(f"per seed, (dO . O) / (sum P dP): median {statistics.median(ratio):.2f}, max {max(ratio):.2f}")


if __name__ == "__main__":
    main()
