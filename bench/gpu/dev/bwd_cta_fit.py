"""Splits the sm90 backward's main-kernel time into a per-step and a per-CTA part.

The input is the "# profile" lines of `bwd_vs_cudnn.py --profile`. For each head dim and mask it fits the main
kernel's time over the sequence lengths to

    kernel_us = (t_step * total_steps + t_cta * ctas) / sms

- total_steps: the query-block steps of all CTAs, counted as the mask visits them.
- ctas: one per (key block, head, batch).

It then prints t_step and t_cta, and t_cta's share of a CTA's time at each length. t_cta is what a CTA costs beyond
its steps: the launch, the loads before its first GEMM, the pipeline filling and draining, and the dK/dV epilogue.
A large share at short lengths points to overlapping it (a persistent kernel, or several CTAs per SM); a small one
points back to the step.

usage: python3 bwd_cta_fit.py PROFILE_LOG [--sms 132]   (the log of bwd_vs_cudnn.py --profile; "-" reads stdin)
"""
from __future__ import annotations

import argparse
import collections
import re
import sys


def tiles(hdim: int) -> tuple[int, int]:
    """(block_q, block_k) of src/cuda/sm90/tiles.hpp bwd_tiles."""
    return (128 if hdim <= 64 else 64), (128 if hdim <= 128 else 64)


LINE = re.compile(r"# profile (?P<tag>[^:]*?): +(?P<us>[\d.]+) us .*?\s(?P<name>\S*bwd_kernel\S*)")


def cta_steps(seqlen: int, hdim: int, causal: bool) -> list[int]:
    """The query-block steps of each key block's CTA of one (head, batch) pair (square, bottom-right = top-left
    causal), in launch order."""
    block_q, block_k = tiles(hdim)
    m_blocks = -(-seqlen // block_q)
    # the first query block that sees key block n
    return [m_blocks - ((n * block_k) // block_q if causal else 0) for n in range(-(-seqlen // block_k))]


def steps_and_ctas(seqlen: int, batch: int, heads: int, hdim: int, causal: bool) -> tuple[int, int]:
    """Query-block steps over all CTAs and the CTA count of one call."""
    steps = cta_steps(seqlen, hdim, causal)
    return sum(steps) * batch * heads, len(steps) * batch * heads


def fit(points: list[tuple[float, float, float]]) -> tuple[float, float]:
    """Least squares of y = a * x1 + b * x2 (no intercept) over (x1, x2, y)."""
    s11 = sum(x1 * x1 for x1, _, _ in points)
    s12 = sum(x1 * x2 for x1, x2, _ in points)
    s22 = sum(x2 * x2 for _, x2, _ in points)
    s1y = sum(x1 * y for x1, _, y in points)
    s2y = sum(x2 * y for _, x2, y in points)
    det = s11 * s22 - s12 * s12
    if abs(det) < 1e-12:
        raise ValueError("degenerate fit: give at least two sequence lengths")
    return (s1y * s22 - s2y * s12) / det, (s11 * s2y - s12 * s1y) / det


def parse(lines) -> dict:
    """{(hdim, causal): [(seqlen, batch, heads, kernel_us)]} of our main kernel (cuDNN's lines are skipped)."""
    out = collections.defaultdict(list)
    for line in lines:
        m = LINE.search(line)
        if not m or "backend=cudnn" in m["tag"]:
            continue
        tag = dict(kv.split("=", 1) for kv in m["tag"].split() if "=" in kv)
        key = (int(tag["hdim"]), bool(int(tag["causal"])))
        out[key].append((int(tag["seqlen"]), int(tag["batch"]), int(tag["heads"]), float(m["us"])))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("log")
    ap.add_argument("--sms", type=int, default=132)
    a = ap.parse_args()
    if a.log == "-":
        data = parse(sys.stdin)
    else:
        with open(a.log) as f:
            data = parse(f)
    if not data:
        print("no '# profile' lines of a bwd_kernel found", file=sys.stderr)
        return 1
    for (hdim, causal), rows in sorted(data.items()):
        pts = []
        for seqlen, batch, heads, us in rows:
            steps, ctas = steps_and_ctas(seqlen, batch, heads, hdim, causal)
            pts.append((steps / a.sms, ctas / a.sms, us))
        t_step, t_cta = fit(pts)
        print(f"d{hdim} {'causal' if causal else 'none'}: t_step {t_step:.3f} us, t_cta {t_cta:.2f} us")
        for (seqlen, _batch, _heads, us), (x1, x2, _) in sorted(zip(rows, pts)):
            model = t_step * x1 + t_cta * x2
            per_cta = t_step * x1 / x2 + t_cta
            print(f"  seqlen {seqlen:6d}: kernel {us:9.1f} us, model {model:9.1f} us, "
                  f"CTA {per_cta:7.2f} us of which fixed {100 * t_cta / per_cta:5.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
